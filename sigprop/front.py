"""The keyword-friendly entry points ``sigprop.probe_mlp`` and ``sigprop.probe_resnet``.

Torch-free at import (``import sigprop`` stays light): they build the specs and call
:func:`sigprop.api.probe`, which loads the engine.  Their defaults are the CLI's.
"""

from __future__ import annotations

from typing import Sequence

from sigprop import specs
from sigprop.results import ProbeResult


def _probe(spec, kw: dict) -> ProbeResult:
    """Run ``spec`` with the probe and gate options among the wrapper's arguments ``kw``."""
    from sigprop.api import probe

    probe_keys = ("samples", "seed", "seeds", "device", "dtype", "stream", "precision", "graphs")
    return probe(spec, specs.ProbeSpec(**{k: kw[k] for k in probe_keys}), gate=specs.GateSpec(kw["gate"], kw["band"]))


def probe_mlp(
    depth: int = 20,
    input_dim: int = 500,
    width: str | int = "150:250",
    inits: str | Sequence[str] = ("he", "proposed", "proposed-gaussian"),
    samples: int = 1000,
    seed: int = 0,
    seeds: int = 1,
    device: str = "auto",
    dtype: str = "float32",
    stream: bool | None = None,
    precision: str = "fp32",
    graphs: bool | None = None,
    gate: str = "preserved",
    band: tuple[float, float] | None = None,
) -> ProbeResult:
    """Keyword-friendly wrapper of :func:`probe` for the WN MLP, with the options and defaults of
    ``sigprop mlp`` (``inits``: one name or a list; ``gate``/``band``: ``--check``/``--band``)."""
    spec = specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(str(width)), inits=inits)
    return _probe(spec, locals())


def probe_resnet(
    blocks: int = 40,
    stages: int = 1,
    dim: int = 500,
    width: str | int = "150:250",
    block_depth: int = 1,
    norm: str = "wn",
    inits: str | Sequence[str] | None = None,
    samples: int = 1000,
    seed: int = 0,
    seeds: int = 1,
    device: str = "auto",
    dtype: str = "float32",
    stream: bool | None = None,
    precision: str = "fp32",
    graphs: bool | None = None,
    gate: str = "preserved",
    band: tuple[float, float] | None = None,
) -> ProbeResult:
    """Keyword-friendly wrapper of :func:`probe` for the ResNet (Arpit et al. 2019, eq. 6; De &
    Smith 2020, appendix C with ``norm="bn"``), with the options and defaults of ``sigprop
    resnet`` (``inits`` None: he, proposed, proposed-gaussian; he alone with norm none/bn)."""
    if inits is None:
        inits = specs.RESNET_DEFAULT_INITS if norm == "wn" else ("he",)
    spec = specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(str(width)),
        block_depth=block_depth, norm=norm, inits=inits,
    )
    return _probe(spec, locals())
