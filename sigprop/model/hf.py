"""A Hugging Face config as a model to probe (``sigprop module --config PATH``; issue 69): the
base model ``AutoModel.from_config`` builds from it -- its own init, no weights downloaded --
returning its last hidden state, called on token ids (``input_ids``)."""

from __future__ import annotations

import torch.nn as nn

from sigprop.errors import SigpropError, described
from sigprop.targets import read_config


class Hidden(nn.Module):
    """A base model returning its last hidden state; its config's ``model`` the base model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def from_config(config: str, digest: str | None = None, **overrides) -> nn.Module:
    """The base model of the Hugging Face ``config.json`` at ``config`` (``AutoModel``, its own
    init, in float32), with ``overrides`` set on the config (``--arg num_hidden_layers=4``);
    ``digest``, where given, the file's as the run read it (``targets.read_config``): a file
    edited since is refused."""
    d, now = read_config(config)
    if digest is not None and now != digest:
        raise SigpropError(
            f"{config!r} has changed since the run that recorded it (sha256 {now}..., recorded {digest}...): "
            "run it anew",
            field="config",
        )
    try:
        import transformers  # the models extra: only a --config run needs it
    except ImportError:
        raise SigpropError(
            "--config builds the model with Hugging Face transformers: pip install 'sigprop[models]'",
            field="config",
        ) from None
    # the dtype its checkpoint was saved in (``torch_dtype``; transformers 5: ``dtype``) is not the
    # init's: AutoModel would draw in it (bfloat16 for most configs); drawn in float32, as the probe
    # runs it and as a factory building the class from the config draws
    d = {k: v for k, v in {**d, **overrides}.items() if k not in ("torch_dtype", "dtype")}
    try:
        cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        model = transformers.AutoModel.from_config(cfg)
    except Exception as exc:  # an unknown family, a field its class refuses: one line
        raise SigpropError(f"{config!r}: {described(exc)}", field="config") from None
    return Hidden(model)
