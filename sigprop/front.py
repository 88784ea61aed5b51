"""The keyword-friendly entry points ``sigprop.probe_mlp`` and ``sigprop.probe_resnet``.

Torch-free at import (``import sigprop`` stays light): they build the specs and call
:func:`sigprop.api.probe`, which loads the engine.  Their defaults are the CLI's.
"""

from __future__ import annotations

import functools
import inspect
from typing import Sequence

from sigprop import specs
from sigprop.results import ProbeResult


#: the probe and gate keywords both wrappers take, with the CLI's defaults (``sigprop mlp -h``)
PROBE_KEYWORDS = (
    ("samples", int, 1000), ("seed", int, 0), ("seeds", int, 1), ("device", str, "auto"), ("dtype", str, "float32"),
    ("stream", "bool | None", None), ("precision", str, "fp32"), ("graphs", "bool | None", None),
    ("gate", str, "preserved"), ("band", "tuple[float, float] | None", None), ("threads", "int | None", None),
    ("correlations", "tuple[float, ...]", ()), ("pairs", int, 256), ("max_correlation", "float | None", None),
)


def _probe_keywords(build):
    """A keyword wrapper from ``build(**net options) -> spec``: its signature gains
    ``PROBE_KEYWORDS`` (declared once, here), and calling it builds the spec and runs the probe."""

    @functools.wraps(build)
    def wrapper(*args, **kwargs) -> ProbeResult:
        from sigprop.api import probe

        kw = {name: kwargs.pop(name, default) for name, _, default in PROBE_KEYWORDS}
        gate = specs.GateSpec(kw.pop("gate"), kw.pop("band"), kw.pop("max_correlation"))
        return probe(build(*args, **kwargs), specs.ProbeSpec(**kw), gate=gate)

    own = list(inspect.signature(build).parameters.values())
    shared = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t) for n, t, d in PROBE_KEYWORDS]
    wrapper.__signature__ = inspect.Signature(own + shared, return_annotation="ProbeResult")
    return wrapper


@_probe_keywords
def probe_mlp(
    depth: int = 20,
    input_dim: int = 500,
    width: str | int = "150:250",
    inits: str | Sequence[str] = ("he", "proposed", "proposed-gaussian"),
):
    """Probe a WN MLP with the options and defaults of ``sigprop mlp`` (``inits``: one name or a
    list; ``samples`` ... ``graphs`` as the CLI's; ``gate``/``band``: ``--gate``/``--band``)."""
    return specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(str(width)), inits=inits)


@_probe_keywords
def probe_resnet(
    blocks: int = 40,
    stages: int = 1,
    dim: int = 500,
    width: str | int = "150:250",
    block_depth: int = 1,
    norm: str = "wn",
    inits: str | Sequence[str] | None = None,
):
    """Probe a ResNet (Arpit et al. 2019, eq. 6; De & Smith 2020, appendix C with ``norm="bn"``)
    with the options and defaults of ``sigprop resnet`` (``inits`` None: he, proposed,
    proposed-gaussian; he alone with norm none/bn; the probe and gate keywords as ``probe_mlp``)."""
    if inits is None:
        inits = specs.RESNET_DEFAULT_INITS if norm == "wn" else ("he",)
    return specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(str(width)),
        block_depth=block_depth, norm=norm, inits=inits,
    )


def theory_table(n=None, blocks=None):
    """``sigprop theory``: K_n of Theorem 1 (closed form beside quadrature) for each n, and the
    ResNet ratio (1 + 1/B)^{B/2} beside the band [sqrt 2, sqrt e] for each B (Arpit et al. 2019,
    eq. 3 / 9 and Theorems 3-4).  Torch-free."""
    from sigprop import theory as th
    from sigprop.results import KnRow, ResnetRow, TheoryResult

    ns = n or [2, 3, 10, 100, 1000, 10**6, 10**7]
    bs = blocks or [1, 2, 10, 40, 100, 1000]
    return TheoryResult(
        kn=[KnRow(k, th.kn_closed_form(k), th.kn_quadrature(k)) for k in ns],
        resnet=[ResnetRow(b, r, th.RESNET_LOWER, th.RESNET_UPPER, th.in_resnet_band(r)) for b in bs for r in [th.resnet_ratio(b)]],
    )
