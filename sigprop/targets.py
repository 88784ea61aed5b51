"""A user's ``MODULE:CALLABLE`` or ``FILE.py:CALLABLE`` as the callable it names: the model
factory of ``sigprop module`` and ``sigprop width``, a width run's optimizer.  Below every
reader (kinds/, width/): it imports nothing of sigprop's but its errors."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import json
import os
import sys
from typing import Callable

from sigprop.errors import SigpropError, described


def resolve_target(target: str) -> Callable:
    """``package.module:callable`` or ``path/to/file.py:callable`` as the callable."""
    if ":" not in target:
        raise SigpropError(f"expected MODULE:CALLABLE or FILE.py:CALLABLE, got {target!r}", field="target")
    where, name = target.rsplit(":", 1)
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise SigpropError(f"no file {where!r}", field="target")
            spec = importlib.util.spec_from_file_location(f"_sigprop_user_{abs(hash(where))}", where)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(where)
    except SigpropError:
        raise
    except Exception as exc:
        raise SigpropError(f"cannot import {where!r}: {described(exc)}", field="target") from None
    obj = mod
    for part in name.split("."):
        if not hasattr(obj, part):
            have = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, have, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SigpropError(f"{where!r} has no {part!r}{hint}", field="target")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SigpropError(f"{target!r} is not callable", field="target")
    return obj


#: the factory a ``--config`` names: a Hugging Face config's base model (sigprop/model/hf.py)
CONFIG_FACTORY = "sigprop.model.hf:from_config"


def read_config(path: str) -> tuple[dict, str]:
    """A Hugging Face ``config.json`` as a dict, checked -- a file of JSON naming its
    ``model_type`` (the family ``AutoConfig`` builds); one line naming --config else -- and its
    digest (the first 16 hex digits of the sha256 of its bytes: what a result records of it),
    from one read of the file."""
    if not os.path.isfile(path):
        raise SigpropError(f"no file {path!r}", field="config")
    try:
        with open(path, "rb") as f:
            data = f.read()
        d = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SigpropError(f"{path!r} is not a JSON file: {described(exc)}", field="config") from None
    if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
        raise SigpropError(f"{path!r} names no model_type: not a Hugging Face config.json", field="config")
    return d, hashlib.sha256(data).hexdigest()[:16]


def config_target(path: str) -> tuple[str, tuple[str, str], int | None]:
    """(the target, its first ``--arg`` items, the config's ``vocab_size``) a ``--config`` stands
    for: ``CONFIG_FACTORY`` with the config's absolute path (a worker may run in another
    directory) and its digest (a rerun or a worker reading a file edited since is refused, not
    mixed)."""
    d, digest = read_config(path)
    vocab = d.get("vocab_size")
    first = (f"config={os.path.abspath(path)!r}", f"digest={digest!r}")
    return CONFIG_FACTORY, first, vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
