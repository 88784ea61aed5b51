"""The user's own network (``sigprop module TARGET``, ``sigprop.probe_module``): any
``torch.nn.Module`` made by a factory, probed at chosen sites (the outputs of its top-level
blocks by default) beside the theory of its traced graph.  No torch here: the driver builds,
measures and traces the model (sigprop/model/) because this kind
says ``engine = "model"``; this file declares the spec, the options, and turns the measured
arrays into rows and verdicts.

Rows: the sites in the order the forward reaches them, each measured per element (rms over the
site's units, docs/theory.md §13) relative to the input (forward) and to the output's error
(backward)."""

from __future__ import annotations

import ast
import copy
import itertools
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from sigprop import inits, specs, stats, theory
from sigprop.across import across_layers
from sigprop.errors import SigpropError
from sigprop.kinds import base
from sigprop.kinds.base import Hints, Kind, Opt, SweepAxes
from sigprop.results import Check
from sigprop.targets import config_target, resolve_target
from sigprop.width.spec import WidthNet, widths_of

#: the structure only a model provides: inits that keep or read its own weights (``as-is``)
MODEL = inits.MODEL
#: keyword arguments that would download weights: refused (a probe is of the init)
DOWNLOADS = ("pretrained", "weights", "pretrained_model_name_or_path", "checkpoint")


def parse_args(items) -> dict:
    """``--arg name=value`` items as keyword arguments (values Python literals, else strings)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SigpropError(f"expected name=value, got {item!r}", field="arg")
        name, text = item.split("=", 1)
        name = name.strip()
        if not name.isidentifier():
            raise SigpropError(f"{name!r} is not a keyword name", field="arg")
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()
        out[name] = value
    for name, value in out.items():
        if name.lower() in DOWNLOADS and value not in (None, False, "", 0):
            raise SigpropError(
                f"{name}={value!r} would load trained weights: sigprop probes a model at its random init",
                field="arg",
            )
    return out


def arg_values(name: str, text: str) -> list[str]:
    """The values of one ``--arg name=...``: a bare comma list (``10,20,50``) sweeps, one value
    each; a bracketed or quoted literal (``(16, 32)``, ``'a,b'``) is one value."""
    t = text.strip()
    if t[:1] in "([{'\"" or "," not in t:
        return [t]
    parts = [p.strip() for p in t.split(",")]
    if not all(parts):
        raise SigpropError(f"an empty value in {name}={text}", field="arg")
    if len(set(parts)) != len(parts):
        raise SigpropError(f"a value is repeated in {name}={text}", field="arg")
    return parts


def arg_points(items) -> list[tuple[str, ...]]:
    """Every combination of the ``--arg`` items' values (one when no item is a comma list), each
    as its ``name=value`` items, in the order given."""
    axes = []
    for item in items:
        if "=" not in item:
            raise SigpropError(f"expected name=value, got {item!r}", field="arg")
        name, text = item.split("=", 1)
        axes.append([f"{name.strip()}={v}" for v in arg_values(name.strip(), text)])
    return [tuple(point) for point in itertools.product(*axes)]


@dataclass(frozen=True)
class ModuleSpec:
    """The user's model: ``target`` (``MODULE:CALLABLE`` or ``FILE.py:CALLABLE``) called with
    ``args``, or ``model`` (a module, or a zero-argument factory: the API); the input's
    ``input_shape`` (no batch dim), or token ids below ``vocab``, or rows of x from ``data``; the
    ``sites`` (``auto``, ``leaves`` or a comma list of module paths and patterns); the samples in
    chunks of ``batch_size``; the ``inits`` (``as-is``: the model's own)."""

    target: str | None = None
    args: tuple[str, ...] = ()
    input_shape: tuple[int, ...] | str = ()
    #: ``--config PATH``: a Hugging Face config.json, the base model AutoModel builds from it (the
    #: spec then names ``targets.CONFIG_FACTORY`` with the path as its first --arg)
    config: str | None = None
    sites: str = "auto"
    vocab: int | None = None
    data: str | None = None
    batch_size: int | None = None
    inits: tuple[str, ...] = ("as-is",)
    #: ``--max-token-cosine X``: also fail when the mean cosine between the tokens of one sample
    #: at the last site on the output's path exceeds X (rank collapse; docs/theory.md §15)
    max_token_cosine: float | None = None
    model: Any = field(default=None, compare=False, repr=False)
    #: the API's own inputs: a tensor [N, ...] or a tuple of them (a forward of several tensors)
    inputs: Any = field(default=None, compare=False, repr=False)

    @staticmethod
    def _shapes_of(shape) -> tuple:
        """``3,64,64`` or ``3,32,32;10`` (several inputs) or tuples, as a tuple of ints (one
        input) or of tuples (several); () when none is given."""
        if isinstance(shape, str):
            parts = [p.strip() for p in shape.split(";")]
            try:  # an empty size ("32x", "3,,64") is not read as nothing: int("") refuses it
                out = [tuple(int(s) for s in p.replace("x", ",").split(",")) if p else () for p in parts]
            except ValueError:
                raise SigpropError(
                    f"expected sizes like 3,64,64 (several inputs: 3,32,32;10), got {shape!r}",
                    field="input_shape",
                ) from None
        elif shape and all(isinstance(s, (tuple, list)) for s in shape):
            out = [tuple(int(d) for d in s) for s in shape]
        else:
            out = [tuple(int(s) for s in shape)]
        if out == [()]:
            return ()
        for s in out:
            if not s:
                raise SigpropError(f"an input without sizes in {shape!r}", field="input_shape")
            for d in s:
                specs.check_size(d, "input_shape")
        return out[0] if len(out) == 1 else tuple(out)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The inputs' shapes without the batch, one per tensor the forward takes."""
        s = self.input_shape
        return s if s and isinstance(s[0], tuple) else (s,)

    def __post_init__(self) -> None:
        if self.config is not None:
            self._from_config()
        if self.target is None and self.model is None:
            raise SigpropError("name the model: TARGET (MODULE:CALLABLE), --config or model=", field="target")
        object.__setattr__(self, "input_shape", self._shapes_of(self.input_shape))
        if self.inputs is not None:
            given = _tensors(self.inputs)
            shapes = tuple(tuple(int(d) for d in t.shape[1:]) for t in given)
            if self.input_shape and self.shapes != shapes:
                raise SigpropError(
                    f"inputs= have shapes {';'.join(','.join(map(str, s)) for s in shapes)} without the "
                    f"batch, input_shape says {';'.join(','.join(map(str, s)) for s in self.shapes)}",
                    field="input_shape",
                )
            if len({t.shape[0] for t in given}) != 1:
                raise SigpropError("inputs= must have the same number of rows (samples)", field="inputs")
            object.__setattr__(self, "input_shape", shapes[0] if len(shapes) == 1 else shapes)
            if self.data is not None or self.vocab is not None:
                raise SigpropError("inputs= are the inputs: no data= or vocab= beside them", field="inputs")
        if not self.input_shape:
            raise SigpropError("give the input's shape without the batch, e.g. 3,64,64", field="input_shape")
        if len(self.shapes) > 1 and (self.data is not None or self.vocab is not None):
            raise SigpropError(
                "several inputs (a;b) are drawn as Gaussians: --data and --vocab take one input",
                field="input_shape",
            )
        object.__setattr__(self, "args", tuple(self.args))
        for point in arg_points(self.args):  # every configuration of a sweep checked up front
            parse_args(point)
        if self.vocab is not None:
            specs.check_size(self.vocab, "vocab")
        if self.batch_size is not None:
            specs.check_size(self.batch_size, "batch_size")
        if self.data is not None and self.vocab is not None:
            raise SigpropError("token inputs are drawn (--vocab) or read (--data), not both", field="data")
        x = self.max_token_cosine
        if x is not None and (
            isinstance(x, bool) or not isinstance(x, (int, float)) or not -1.0 <= float(x) <= 1.0
        ):
            raise SigpropError(
                f"a cosine bound must be a number in [-1, 1], got {x!r}", field="max_token_cosine"
            )
        if x is not None and not self.sequences and len(self.shapes[0]) < 3:
            raise SigpropError(
                "token cosines are measured on sequences: token ids (--vocab, --input-shape T), float "
                "tokens (--input-shape T,d) or images a model's attention reads as tokens (a ViT), not "
                f"inputs of shape {','.join(map(str, self.shapes[0]))}",
                field="max_token_cosine",
            )
        if not isinstance(self.sites, str) or not self.sites.strip():
            raise SigpropError("auto, leaves, or a comma list of module names", field="sites")
        base.init_tuple(self, ModuleKind.provides, ModuleKind.noun)

    def _from_config(self) -> None:
        """``--config PATH`` as the target it stands for (``targets.config_target``; the user's
        --arg after it, overriding the config's fields), its vocabulary the config's
        ``vocab_size`` where --vocab is not given (token ids: a decoder's input)."""
        if self.target is not None or self.model is not None:
            raise SigpropError("give TARGET or --config, not both", field="config")
        path = str(self.config)
        target, first, vocab = config_target(path)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "args", (*first, *self.args))
        object.__setattr__(self, "config", None)  # now the target: a rerun reads target and args
        if self.vocab is None and self.data is None and self.inputs is None and vocab is not None:
            object.__setattr__(self, "vocab", vocab)

    @property
    def sequences(self) -> bool:
        """The inputs are sequences of tokens: ids of shape (T,) (``vocab``) or floats of shape
        (T, d) (the first input of several); their sites of output [T, d'] are read as tokens."""
        return len(self.shapes[0]) == (1 if self.vocab is not None else 2)

    def factory(self) -> Callable:
        """A zero-argument callable that builds a fresh model (a module given as is is returned by
        a factory that copies it, so a draw never changes the caller's object)."""
        if self.model is not None:
            if _is_factory(self.model):
                return self.model
            instance = self.model
            return lambda: copy.deepcopy(instance)
        if len(self.points()) > 1:
            raise SigpropError(
                f"{' '.join(self.args)} is a sweep of {len(self.points())} configurations: run it with "
                "sigprop module, or build one model per value",
                field="arg",
            )
        fn, kwargs = resolve_target(self.target), parse_args(self.args)
        return lambda: fn(**kwargs)

    def points(self) -> list["ModuleSpec"]:
        """One spec per configuration of a ``--arg name=a,b,c`` sweep (itself when none)."""
        grid = arg_points(self.args)
        if len(grid) == 1:
            return [self]
        return [replace(self, args=point) for point in grid]

    def reinitializes_one_instance(self) -> bool:
        """A module instance (not a factory) keeps one set of own weights: ``as-is`` is one draw."""
        return self.model is not None and not _is_factory(self.model)

    def to_dict(self) -> dict:
        return {
            "target": self.target if self.target is not None else f"<{type(self.model).__name__} object>",
            "args": list(self.args),
            "input_shape": ";".join(",".join(str(d) for d in s) for s in self.shapes),
            "sites": self.sites,
            "vocab": self.vocab,
            "data": self.data,
            "batch_size": self.batch_size,
            "inits": list(self.inits),
        }


def _tensors(inputs) -> tuple:
    """``inputs=`` as a tuple of tensors with a batch dimension, or one line naming the field."""
    given = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not given or not all(hasattr(t, "shape") and hasattr(t, "dtype") and len(t.shape) >= 1 for t in given):
        raise SigpropError("inputs= takes a tensor [samples, ...] or a tuple of them", field="inputs")
    return given


def _is_factory(obj) -> bool:
    """A callable that is not itself a module (an nn.Module is callable: its forward)."""
    return callable(obj) and (isinstance(obj, type) or not hasattr(obj, "named_modules"))


@base.register
class ModuleKind(Kind):
    name = "module"
    summary = (
        "Probe your own torch.nn.Module (TARGET = MODULE:CALLABLE or FILE.py:CALLABLE, or a Hugging Face "
        "--config): per-site forward and backward norm ratios beside its traced theory, with the model's "
        "own init or the paper's (Arpit et al. 2019)."
    )
    spec = ModuleSpec
    noun = "a model"
    engine = "model"
    curvature = True
    provides = frozenset({"taps", MODEL})
    size_fields = "samples/input_shape"
    refuses = {
        "probe": {
            "stream": "a model keeps its own weights: nothing to stream",
            "graphs": "a model runs eagerly: no CUDA graphs",
            "fuse": "a model runs its own layers: nothing of sigprop's to fuse",
            "correlations": "input cosines are not measured for a model yet",
            "pairs": "input cosines are not measured for a model yet",
            "max_correlation": "input cosines are not measured for a model yet",
            "observe": "plug-in measurements read sigprop's own walks, not a model's (yet)",
        },
        "spectrum": {
            "sites": "the spectrum reads the model's output, not its sites",
            "max_token_cosine": "the spectrum reads the model's output, not its sites' tokens",
            "vocab": "token ids have no Jacobian: the spectrum needs a floating input",
            "config": "a config's model reads token ids, which have no Jacobian",
            "depths": "the spectrum against depth is measured for sigprop's own nets only",
            "at": "the spectrum against depth is measured for sigprop's own nets only",
            "batch_size": "a model's Jacobian is taken in chunks of its outputs, sized to the memory",
        },
        "hessian": {
            "sites": "the curvature reads the model's output, not its sites",
            "max_token_cosine": "the curvature reads the model's output, not its sites' tokens",
            "vocab": "token ids: a model's curvature is measured on floating inputs",
            "config": "a config's model reads token ids: a model's curvature is measured on floating inputs",
            "head": "a model's head is PyTorch's default nn.Linear",
        },
    }
    default_inits = ("as-is",)
    init_help = "Init (repeatable): as-is keeps the model's own; the others are applied by sigprop.init_."
    probe_defaults = {"samples": 64, "seeds": 1}
    curvature_samples = 64
    options = (
        Opt("target", str, None, "The model: MODULE:CALLABLE or FILE.py:CALLABLE.", positional=True),
        Opt(
            "config",
            str,
            None,
            "Instead of TARGET: a Hugging Face config.json, the base model AutoModel builds from it at its "
            "own init (no weights downloaded), called on token ids (--vocab: the config's vocab_size "
            "unless given) and read at its last hidden state; --arg NAME=VALUE overrides a field of the "
            "config (num_hidden_layers=4). Needs the models extra.",
        ),
        Opt(
            "model",
            object,
            None,
            "A torch.nn.Module, or a zero-argument factory of one (the API).",
            cli=False,
            toml=(type(None),),  # no TOML value names a Python object: a check names a TARGET
        ),
        Opt(
            "inputs",
            object,
            None,
            "The inputs themselves (the API): a tensor [samples, ...], or a tuple of them for a forward "
            "of several tensors; the probe reads its first --samples rows.",
            cli=False,
            toml=(type(None),),
        ),
        Opt(
            "args",
            str,
            None,
            "A keyword argument of the callable, name=value (a Python literal; repeatable); for sigprop "
            "module a bare comma list sweeps (depth=10,20,50: one probe per value), a bracketed tuple is "
            "one value.",
            flag="--arg",
            repeat=True,
            toml=(list,),
        ),
        Opt(
            "input_shape",
            str,
            None,
            "The input's shape without the batch, e.g. 3,64,64; a forward of several tensors: their "
            "shapes joined by ';' (3,32,32;10), each drawn N(0, I).",
            shown="required",
        ),
        Opt(
            "sites",
            str,
            "auto",
            "Where to measure: auto (the outputs of the top-level blocks), leaves (every leaf module), or "
            "a comma list of module paths and patterns (layer3.*).",
        ),
        Opt(
            "vocab",
            int,
            None,
            "Token inputs: ids uniform in [0, VOCAB) of --input-shape (a sequence length); forward "
            "ratios are then relative to the first site.",
            min=1,
        ),
        Opt(
            "data",
            str,
            None,
            "Real inputs instead of Gaussian ones: the first --samples rows of x from a .pt (a dict with "
            "x and y) or .npz, as sigprop hessian --data reads it (y is checked, not used).",
        ),
        Opt(
            "max_token_cosine",
            float,
            None,
            "Also fail (--check) when the mean cosine between the tokens of one sample at the last site on "
            "the output's path exceeds X (rank collapse); the inputs must be sequences (--vocab, or "
            "--input-shape T,d) or images whose model reads them as tokens (a ViT's patches: T from its "
            "first attention).",
            toml=(int, float),
        ),
        Opt(
            "batch_size",
            int,
            None,
            "Run the samples in chunks of B, each chunk's graph freed before the next: the memory of one "
            "chunk (a batch norm then normalises each chunk by its own statistics).",
            min=1,
            shown="all at once",
        ),
    )
    width_options = (
        Opt("target", str, None, "The model: MODULE:CALLABLE or FILE.py:CALLABLE.", positional=True),
        Opt(
            "args",
            str,
            None,
            "A keyword argument of the callable, name=value (a Python literal; repeatable); the width is "
            "the one given as a comma list of integers (width=64,128,256).",
            flag="--arg",
            repeat=True,
        ),
        Opt(
            "input_shape",
            str,
            None,
            "The input's shape without the batch (e.g. 3,32,32; with --vocab a sequence length).",
            shown="required",
        ),
        Opt("vocab", int, None, "Token inputs: ids uniform in [0, VOCAB) of --input-shape.", min=1),
    )
    hints = Hints(
        spread="run",
        width="units",
        row="site",
        footer="mean ± std over samples of rms(h_site)/rms(x) (forward) and rms(dl/dh_site)/rms(dl/dy) "
        "(backward), per element; theory = the traced graph's moment maps (rms); · = no map on the way",
        x="site",
        forward=r"$\mathrm{rms}(h) \,/\, \mathrm{rms}(x)$",
        backward=r"$\mathrm{rms}(\partial\ell/\partial h) \,/\, \mathrm{rms}(\partial\ell/\partial y)$",
        units="sites",
        curvature_parameters="every parameter of the model (its weight normalization written out as "
        "g v/||v||), its output flattened into {head}",
        energy=True,
        rms_label="traced moment maps' RMS ratio",
        names=True,
        spectrum_theory="theory: the mean σ² from the traced graph's backward map at the input "
        "(r n_in/n_out, docs/theory.md §14), where every op on the way has a map; a model's variance and "
        "density are not derived",
    )
    band_help = "0.1:10 around the input's per-element scale"
    sweep_axes = SweepAxes(size="args", inits="as-is")

    def make(self, values: dict, inits_) -> ModuleSpec:
        v = dict(values)
        if v.get("args") is None:
            v.pop("args", None)
        elif isinstance(v["args"], dict):
            v["args"] = tuple(f"{k}={val!r}" for k, val in v["args"].items())
        for name in ("input_shape", "vocab", "data", "batch_size", "inputs", "max_token_cosine", "config"):
            if v.get(name) is None:
                v.pop(name, None)
        return ModuleSpec(**v, inits=("as-is",) if inits_ is None else inits_)

    def width_net(self, values: dict) -> WidthNet:
        """The user's factory at each width: the one ``--arg`` given as a comma list of integers is
        the width (its keyword, ``WidthNet.width_arg``); the others are fixed keyword arguments.
        A model (the API) may give ``widths`` and ``width_arg`` themselves."""
        target = values.get("target")
        if not target:
            raise SigpropError("give the model: sigprop width module FILE.py:CALLABLE", field="target")
        factory = target
        if isinstance(target, str):  # kept as text (a worker resolves it: a Dask point), checked now
            where, _, name = target.rpartition(":")
            factory = os.path.abspath(where) + ":" + name if where.endswith(".py") else target
            resolve_target(factory)
        fixed, axis = [], []
        for item in values.get("args") or ():
            if "=" not in item:
                raise SigpropError(f"expected name=value, got {item!r}", field="arg")
            name, text = (t.strip() for t in item.split("=", 1))
            (axis if len(arg_values(name, text)) > 1 else fixed).append((name, text))
        if len(axis) != 1:
            named = f" ({', '.join(n for n, _ in axis)} are)" if axis else ""
            raise SigpropError(
                "give the width as exactly one --arg NAME=64,128,256 (a comma list of integers)" + named,
                field="arg",
            )
        width_arg, text = axis[0]
        widths = widths_of(arg_values(width_arg, text), field="arg")
        shape = ModuleSpec._shapes_of(values.get("input_shape") or ())
        if not shape:
            raise SigpropError("give the input's shape without the batch, e.g. 3,32,32", field="input_shape")
        if isinstance(shape[0], tuple):
            raise SigpropError("the coordinate check takes one input tensor", field="input_shape")
        kwargs = parse_args(f"{n}={t}" for n, t in fixed)
        return WidthNet(factory, widths, shape, kwargs, width_arg, values.get("vocab"), field="arg")

    def sweep_fields(self) -> tuple[str, ...]:
        return ("target", "config", "arg", "input_shape", "sites", "vocab")

    def sweep_configurations(self, given: dict) -> list:
        """Every --input-shape (one value each: ``;`` joins the inputs of one forward) x every
        combination of the --arg values; the key keeps TARGET as given, the spec a FILE.py's
        absolute path (a worker may run in another directory)."""
        target, items = given.get("target"), tuple(given.get("arg") or ())
        if given.get("config") is not None:  # --config: the target it stands for, its path an --arg
            if target:
                raise SigpropError("give TARGET or --config, not both", field="config")
            target, first, vocab = config_target(str(given["config"]))
            items = (*first, *items)
            if given.get("vocab") is None:
                given = {**given, "vocab": vocab}
        if not target:
            raise SigpropError("give the model: sigprop sweep module FILE.py:CALLABLE", field="target")
        where, _, name = str(target).rpartition(":")
        found = os.path.abspath(where) + ":" + name if where.endswith(".py") else target
        resolve_target(found)  # a target that does not import is refused before any point runs
        shapes = given.get("input_shape") or []
        shapes = [shapes] if isinstance(shapes, str) else list(shapes)
        if not shapes:
            raise SigpropError("give the input's shape without the batch, e.g. 3,64,64", field="input_shape")
        if len(set(shapes)) != len(shapes):
            raise SigpropError("an input shape is given twice", field="input_shape")
        extra = {k: given[k] for k in ("sites", "vocab") if given.get(k) is not None}
        out = []
        for shape in shapes:
            base = ModuleSpec(target=found, args=items, input_shape=shape, **extra)
            text = base.to_dict()["input_shape"]
            for point in base.points():
                axes = (("target", str(target)), ("args", list(point.args)), ("input_shape", text))
                out.append((axes, lambda init, point=point: replace(point, inits=(init,))))
        return out

    def sweep_spec(self, size, width, init, input_dim):
        raise SigpropError("a model sweeps over --arg and --input-shape", field="command")

    def sweep_config(self, spec) -> dict:
        return {"sites": spec.sites, "vocab": spec.vocab}

    def expand(self, spec) -> list:
        return spec.points()

    def point_labels(self, points: list) -> list[str]:
        varying = [i for i in range(len(points[0].args)) if len({p.args[i] for p in points}) > 1]
        return [" ".join(p.args[i] for i in varying) for p in points]

    def banner(self, spec) -> str:
        what = spec.target or type(spec.model).__name__
        args = (" " + " ".join(spec.args)) if spec.args else ""
        shapes = " and ".join("x".join(map(str, s)) for s in spec.shapes)
        given = " (given)" if spec.inputs is not None else ""
        return f"{what}{args}, input {shapes}{given}, sites {spec.sites}"

    def describe(self, config: dict) -> str:
        args = "".join(" " + a for a in config.get("args") or [])
        return f"{config.get('target')}{args}, input {config.get('input_shape')}"

    #: the words of the sites a run found off the output's path (the engine says them once)
    off_path_note = staticmethod(lambda off: off_path_note(off))

    def graphs(self, spec) -> bool:
        return False

    def verdicts(self, th, spec, plan, arrays, layers, gate, z: float = theory.Z_CHECK) -> tuple[list, None]:
        """``preserved`` -- the typical forward ratio at the last site on the output's path and the
        backward ratio at the first such site inside ``gate.band`` around 1 (per element: the
        input's scale); ``theory`` -- the RMS ratio there inside the band the engine set beside
        the traced prediction (``th.pred``: the RMS over draws of each draw's composed moment
        maps; not testable where no map reaches).  A site off the output's path (a side head) is
        read by no verdict.  Everything here is this init's own: its arrays, its trace (the same
        record run alone or after other inits)."""
        pf, pb = th.pred.ln_forward, th.pred.ln_backward
        on = [i for i, rec in enumerate(layers) if not rec.off_path]
        band = gate.band or specs.DECADE_BAND
        checks, own = [], []
        if not on:  # no site on the output's path: nothing a verdict could read
            why = "no site on the output's path (the output's gradient reaches none): name sites with --sites"
            for direction in ("forward", "backward"):
                checks.append(stats.unread(f"{direction} ratio", "preserved", why))
                own.append(stats.unread(f"{direction} ratio", "theory", why))
            return checks + own, None
        last, first = on[-1], on[0]
        named = (
            (f"forward ratio at site {plan.sites[last]}", layers[last].forward, pf[last]),
            (f"backward ratio at site {plan.sites[first]}", layers[first].backward, pb[first]),
        )
        # the theory verdict where the end site has no prediction: at the site nearest it that has
        # one (forward: the last; backward: the first), the sites without one named
        nearest = (
            next((i for i in reversed(on) if pf[i] is not None), None),
            next((i for i in on if pb[i] is not None), None),
        )
        across = across_layers(spec.vocab is not None, plan, arrays, layers, gate.band, on)
        checks += across or []
        for (cname, st, p), end, near, direction in zip(
            named, (last, first), nearest, ("forward", "backward")
        ):
            if across is None:
                c = stats.gate(cname, "preserved", st, math.log(band[0]), math.log(band[1]))
                if not c.passed and st.dead_fraction > 0:
                    c.note = f"{st.dead_fraction:.1%} of the samples died (ratio 0)"
                checks.append(c)
            if p is None and near is None:
                why = next((n for n in plan.notes if not n.startswith(INFORMATIONAL)), None)
                own.append(stats.untestable(cname, st.log10_mean, why))
                continue
            if p is None:
                rec = layers[near]
                c = _theory_check(f"{direction} ratio at site {plan.sites[near]}", getattr(rec, direction), z)
                pred = pf if direction == "forward" else pb
                none = [plan.sites[i] for i in on if pred[i] is None]
                c.note = (c.note + "; " if c.note else "") + (
                    f"read at the site nearest {plan.sites[end]} that has a prediction; none at "
                    f"{', '.join(none)}"
                )
                own.append(c)
                continue
            own.append(_theory_check(cname, st, z))
        if spec.max_token_cosine is not None:
            checks.append(
                stats.token_cosine_check(layers[last].name, layers[last].tokens, spec.max_token_cosine)
            )
        return checks + own, None


#: theory notes that say how the theory was read, not why a prediction is missing
INFORMATIONAL = ("theory traced by", "theory traced with", "attention:")


def _theory_check(name: str, st, z: float) -> Check:
    """The ``theory`` verdict on one traced ratio: its measured RMS inside the band
    ``stats.attach_traced`` set (z standard errors of the run plus the maps' stated accuracy)."""
    m, lo, hi = st.log10_rms, st.log10_low, st.log10_high
    c = Check(f"RMS {name}", bool(st.agrees), m, lo, hi, "theory")
    if not c.passed:
        off = 10.0 ** (m - st.log10_predicted) - 1.0 if m is not None else float("nan")
        c.note = (
            f"the traced theory predicts an RMS ratio of {stats.fmt(st.log10_predicted)} ({off:+.1%} off); "
            f"the band is {z:g} standard errors of this run plus the maps' stated accuracy (docs/theory.md "
            "§15): the model does not behave as independent-weight moment maps predict"
        )
    return c


def off_path_note(off: list[str]) -> str:
    """The sites the output's gradient does not reach, in words ("" when none)."""
    if not off:
        return ""
    shown = ", ".join(off[:4]) + (f" and {len(off) - 4} more" if len(off) > 4 else "")
    return (
        f"off the output's path: {shown} (the output's gradient does not reach it: no backward ratio, "
        "read by no verdict)"
    )
