"""sigprop: signal propagation at initialization in weight-normalized networks, beside the theory."""

__version__ = "0.3.0"

__all__ = ["__version__", "probe_mlp", "probe_resnet"]


def probe_mlp(*args, **kwargs):
    """See :func:`sigprop.api.probe_mlp` (imported lazily: ``import sigprop`` does not load torch)."""
    from sigprop.api import probe_mlp as _probe_mlp

    return _probe_mlp(*args, **kwargs)


def probe_resnet(*args, **kwargs):
    """See :func:`sigprop.api.probe_resnet` (imported lazily)."""
    from sigprop.api import probe_resnet as _probe_resnet

    return _probe_resnet(*args, **kwargs)
