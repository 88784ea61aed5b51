"""``sigprop mlp``, ``sigprop resnet``, ``sigprop cnn`` and ``sigprop wrn``: build the specs, run the core with a progress bar,
render, plot, apply --check."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sigprop import plans, report, specs
from sigprop.errors import SigpropError
from sigprop.cli._app import app
from sigprop.cli.options import (Argument, Option, FIGURE1_INITS, CNNInitName, Format, HessianOptions, InitName, Norm, ProbeOptions, ResNetInitName,
                                 WRNInitName, WRNPreset, hessian_options, probe_options)
from sigprop.cli.output import _check_output_target, _progress_callback, _say, render, render_rich, write_output


@app.command()
@probe_options
def mlp(
    depth: Annotated[int, Option(min=1, help="Number of layers L.")] = 20,
    input_dim: Annotated[int, Option("--input-dim", min=1, help="Input dimension n_0.")] = 500,
    width: Annotated[str, Option(help="Layer width: N, or LO:HI to draw each layer's width uniformly from LO..HI (once per run).")] = "150:250",
    init: Annotated[
        Optional[list[InitName]], Option(help="Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 top).")
    ] = None,
    opts: ProbeOptions = None,
) -> None:
    """Probe a weight-normalized ReLU MLP (Arpit et al. 2019, eq. 1-2): forward and backward norm ratios per layer."""
    names = [i.value for i in init] if init else list(FIGURE1_INITS)
    spec = specs.MLPSpec(depth=depth, input_dim=input_dim, width=specs.WidthSpec.parse(width), inits=tuple(names))
    _run_probe(spec, opts, lambda env: f"sigprop mlp: device {env['device']} ({env['device_name']}), {env['dtype']}, "
               f"depth {depth}, widths {spec.width} (seed {opts.seed}), {env.get('samples', opts.samples)} samples x {opts.seeds} draw(s)")


def _run_probe(spec, opts: ProbeOptions, banner) -> None:
    """Validate the output targets, run the core with a progress bar, render, plot, apply --check
    (a ``sigprop hessian NET`` command: ``_run_hessian``)."""
    if isinstance(opts, HessianOptions):
        return _run_hessian(spec, opts, banner)
    probe, gate, plot = opts.probe_spec(), opts.gate_spec(), opts.plot
    _check_output_target(opts.output)
    if plot is not None:
        from sigprop import plot as plot_mod

        plot_mod.check_target(plot)

    from sigprop import api  # imports torch

    prog, update = _progress_callback("probing")
    if prog is not None:
        prog.start()
    try:
        result = api.probe(spec, probe, progress=update, on_start=lambda env: _say(banner(env)), gate=gate)
    finally:
        if prog is not None:
            prog.stop()
    render(result, opts.fmt, opts.output)
    if plot is not None:
        plot_mod.probe_figure(result, plot)
        _say(f"sigprop: wrote {plot}")
    if opts.check and not result.passed:
        for run in result.runs:
            for c in run.gate_checks():
                if not c.passed:
                    _say(f"sigprop: check failed ({report.VERDICT_WORDS[c.verdict]}): {run.init}: {report.gate_text(c)}")
        raise typer.Exit(1)


@app.command()
@probe_options
def resnet(
    blocks: Annotated[int, Option(min=1, help="Residual blocks per stage B.")] = 40,
    stages: Annotated[int, Option(min=1, help="Stages K; stage k > 1 opens with a WN projection that doubles the width.")] = 1,
    dim: Annotated[int, Option(min=1, help="Residual-stream width of stage 1 (the input dimension) d.")] = 500,
    width: Annotated[
        Optional[str], Option(help="Hidden width inside each block: N, or LO:HI drawn per hidden layer (once per run). [default: 150:250]")
    ] = None,
    block_depth: Annotated[int, Option("--block-depth", min=1, help="D: a block is D x [WN-FC -> ReLU ->] WN-FC.")] = 1,
    norm: Annotated[Norm, Option(help="wn (weight norm), bn (the BN ResNet of De & Smith, appendix C) or none.")] = Norm.wn,
    init: Annotated[
        Optional[list[ResNetInitName]],
        Option(help="Init scheme (repeatable). Default: he, proposed, proposed-gaussian (Figure 1 bottom); he with --norm none/bn."),
    ] = None,
    opts: ProbeOptions = None,
) -> None:
    """Probe a residual network h^b = h^{b-1} + alpha F_b(h^{b-1}) (Arpit et al. 2019, eq. 6) state by state."""
    if width is not None and norm is Norm.bn:
        raise SigpropError("the batch-normalized ResNet (De & Smith 2020, appendix C) has no hidden layer; its width is --dim", field="width")
    if init:
        names = [i.value for i in init]
    else:
        names = list(specs.RESNET_DEFAULT_INITS) if norm is Norm.wn else ["he"]
    spec = specs.ResNetSpec(
        blocks=blocks, stages=stages, dim=dim, width=specs.WidthSpec.parse(width or "150:250"),
        block_depth=block_depth, norm=norm.value, inits=tuple(names),
    )
    shape = f"{stages} stage(s) x {blocks} blocks, d {dim}"
    shape += ", batch norm" if norm is Norm.bn else f", hidden {spec.width} x {block_depth}, norm {norm.value}"
    _run_probe(spec, opts, lambda env: f"sigprop resnet: device {env['device']} ({env['device_name']}), {env['dtype']}, "
               f"{shape} (seed {opts.seed}), {env.get('samples', opts.samples)} samples x {opts.seeds} draw(s)")


@app.command()
@probe_options
def cnn(
    depth: Annotated[int, Option(min=1, help="Number of 3x3 conv layers L.")] = 20,
    channels: Annotated[int, Option(min=1, help="Channels of every conv (the fixed width; the paper's CNN has 512).")] = 64,
    image: Annotated[str, Option(help="Input shape CxHxW.")] = "3x32x32",
    strided: Annotated[int, Option(min=0, help="How many of the first layers have stride 2.")] = 2,
    init: Annotated[
        Optional[list[CNNInitName]], Option(help="Init scheme (repeatable). Default: proposed, delta-orthogonal.")
    ] = None,
    opts: ProbeOptions = None,
) -> None:
    """Probe the plain CNN of Arpit et al. 2019, section 5.1 (3x3 WN convs + ReLU, zero padding, the first two with stride 2) layer by layer."""
    names = [i.value for i in init] if init else list(specs.CNN_DEFAULT_INITS)
    spec = specs.CNNSpec(depth=depth, channels=channels, image=specs.parse_image(image), strided=strided, inits=tuple(names))
    _run_probe(spec, opts, lambda env: f"sigprop cnn: device {env['device']} ({env['device_name']}), {env['dtype']}, depth {depth}, "
               f"{channels} channels, image {image}, {strided} strided (seed {opts.seed}), {env.get('samples', opts.samples)} samples x {opts.seeds} draw(s)")


@app.command()
@probe_options(samples=100)  # a conv net's per-sample spread is small (its weights are shared by the positions): draws matter more
def wrn(
    blocks: Annotated[Optional[int], Option(min=1, help="Residual blocks per group N (the paper's 1, 16, 166, 1666). [default: 16]")] = None,
    widen: Annotated[Optional[int], Option(min=1, help="Widening factor k: groups of 16k, 32k, 64k channels. [default: 1]")] = None,
    bottleneck: Annotated[
        Optional[bool], Option("--bottleneck/--basic", help="ResNet-164's bottleneck blocks [1x1, 3x3, 1x1], 4x expansion. [default: basic]")
    ] = None,
    preset: Annotated[Optional[WRNPreset], Option(help="A named net of Arpit et al. 2019, Table 1 (sets N, k and the block type).")] = None,
    image: Annotated[str, Option(help="Input shape CxHxW.")] = "3x32x32",
    norm: Annotated[Norm, Option(help="wn (weight-normalized convs), none (plain convs: he, skipinit, skipinit-sqrt) or bn (plain He "
                                      "convs, each followed by training-mode batch norm; init he).")] = Norm.wn,
    init: Annotated[
        Optional[list[WRNInitName]],
        Option(help="Init scheme (repeatable). Default: proposed, pytorch, datadep, stage-hanin (Figure 3 right); he with --norm none."),
    ] = None,
    opts: ProbeOptions = None,
) -> None:
    """Probe the wide residual network of Arpit et al. 2019, supplementary Figure 5 (conv1, three groups of N blocks [WN conv 3x3 -> ReLU -> WN conv 3x3], stride 2 and a 1x1 projection opening groups 2 and 3) state by state."""
    if init:
        names = [i.value for i in init]
    else:
        names = list(specs.WRN_DEFAULT_INITS) if norm is Norm.wn else ["he"]
    given = {k: v for k, v in (("blocks", blocks), ("widen", widen), ("bottleneck", bottleneck)) if v is not None}
    kw = {"image": specs.parse_image(image), "norm": norm.value, "inits": tuple(names), **given}
    # a --blocks/--widen/--bottleneck that contradicts the preset is refused by the spec
    spec = specs.WRNSpec(**kw) if preset is None else specs.WRNSpec.of_preset(preset.value, **kw)
    kind = preset.value if preset is not None else f"WRN N = {spec.blocks}, k = {spec.widen}"
    _run_probe(spec, opts, lambda env: f"sigprop wrn: device {env['device']} ({env['device_name']}), {env['dtype']}, {kind} "
               f"({'bottleneck' if spec.bottleneck else 'basic'} blocks, {len(plans.convs(spec.steps()))} conv layers), image {image}, "
               f"norm {norm.value} (seed {opts.seed}), {env.get('samples', opts.samples)} samples x {opts.seeds} draw(s)")


def _run_hessian(spec, opts: HessianOptions, banner) -> None:
    """``sigprop hessian NET``: validate, measure the curvature with a progress bar, render."""
    hs = opts.hessian_spec()
    _check_output_target(opts.output)
    if opts.plot is not None:
        from sigprop import plot as plot_mod

        plot_mod.check_target(opts.plot)
    from sigprop import api  # imports torch

    prog, update = _progress_callback("hessian")
    if prog is not None:
        prog.start()
    try:
        result = api.hessian(spec, hs, progress=update, on_start=lambda env: _say(report.hessian_banner(banner(env), env, hs)))
    finally:
        if prog is not None:
            prog.stop()
    if opts.fmt.value == "json":
        write_output(report.to_json(result), opts.output)
    else:
        render_rich(lambda console: report.render_hessian(result, console), opts.output)
    if opts.plot is not None:
        plot_mod.hessian_figure(result, opts.plot)
        _say(f"sigprop: wrote {opts.plot}")


hessian_app = typer.Typer(help="The curvature at init: the largest-magnitude eigenvalue of the loss Hessian (restarted Lanczos), "
                               "and on request its top-k (Lanczos) and trace (Hutchinson), per init (Arpit et al. 2019, section 5.3, Table 2).",
                          no_args_is_help=True)
app.add_typer(hessian_app, name="hessian")
for _cmd in (mlp, resnet, cnn, wrn):
    hessian_app.command(_cmd.__name__, help=f"Curvature at init of the net of `sigprop {_cmd.__name__}` (same net options), "
                                            "with a 10-way linear head and cross-entropy; per init, mean ± sd over --seeds draws.")(
        hessian_options(_cmd))
