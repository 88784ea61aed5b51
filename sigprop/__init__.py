"""sigprop: signal propagation at initialization in weight-normalized networks, beside the theory.

    >>> import sigprop
    >>> r = sigprop.probe_mlp(depth=20, width=256, inits="proposed", device="cpu")  # doctest: +SKIP
    >>> r.run("proposed").preserved, r.run("proposed").agrees_with_theory  # doctest: +SKIP

``import sigprop`` loads no torch: the API (sigprop/api.py: ``probe``, ``hessian``, ``rerun``,
``run_checks``, ``theory_table`` and one ``probe_<kind>`` per registered net kind) is loaded on
first use.
"""

import importlib

from sigprop.public import API
from sigprop.version import __version__  # noqa: F401  (sigprop.__version__)


def __getattr__(name: str):
    if name in API or name.startswith("probe_"):
        from sigprop import api  # the lazy edge: the API imports torch, loaded when first asked for

        return getattr(api, name)
    try:  # ``sigprop.specs`` without ``import sigprop.specs``: a submodule, loaded as the import system would
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":  # a submodule that exists but lacks a dependency says so
            raise
        raise AttributeError(f"module 'sigprop' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    from sigprop import api  # as __getattr__: the API's names, loaded on demand

    return sorted({"__version__", *api.PUBLIC, *api.keyword_names()})
