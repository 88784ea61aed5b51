"""sigprop: signal propagation at initialization in weight-normalized networks, beside the theory.

    >>> import sigprop
    >>> r = sigprop.probe_mlp(depth=20, width=256, inits="proposed", device="cpu")  # doctest: +SKIP
    >>> r.run("proposed").preserved, r.run("proposed").agrees_with_theory  # doctest: +SKIP
"""

__version__ = "0.7.1"

from sigprop.front import probe_mlp, probe_resnet  # noqa: E402  (torch-free; the engine loads on call)

__all__ = ["__version__", "probe_mlp", "probe_resnet"]
