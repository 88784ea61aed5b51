"""A user's ``MODULE:CALLABLE`` or ``FILE.py:CALLABLE`` as the callable it names: the model
factory of ``sigprop module`` and ``sigprop width``, a width run's optimizer.  Below every
reader (kinds/, width/): it imports nothing of sigprop's but its errors."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
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
