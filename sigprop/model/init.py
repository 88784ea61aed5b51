"""The paper's init for any model (``init_``, ``sigprop.init_``): every Linear and ConvNd drawn by
sigprop's own sampler for its role in the model's graph (Arpit et al. 2019, section 4), a
data-dependent init calibrated layer by layer (Salimans & Kingma 2016, section 3), and every
other parameter named as left."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
from torch.nn.utils.parametrize import ParametrizationList

from sigprop import inits
from sigprop.errors import RolesGuessed, SigpropError
from sigprop.kernels import sampling
from sigprop.model import ops, trace
from sigprop.model.forward import call, first_line
from sigprop.model.ops.linear import DENSE_MODULES
from sigprop.model.ops.norm import NORM_MODULES, is_norm


@dataclass
class InitRecord:
    """What ``init_`` did to one layer: its path, class, fan-in/out, its role in the net (relu,
    block_last with its stage's block count, projection, linear), whether it is weight-normalized,
    and whether it was set (``note``: why not)."""

    name: str
    kind: str
    fan_in: int
    fan_out: int
    weight_norm: bool
    set: bool
    role: str = ""
    blocks_in_stage: int = 1
    note: str = ""
    #: a module left as it was: its own parameters' names (``weight``, ``in_proj_weight``, ...)
    parameters: tuple[str, ...] = ()


def _why_left(m: nn.Module) -> str:
    """Why ``init_`` leaves a module's own parameters as they were, in a few words."""
    if isinstance(m, NORM_MODULES) or "norm" in type(m).__name__.lower():
        return "a normalisation's gain and offset, kept"
    if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return "an embedding table, kept"
    return "not understood"


#: what ``init_`` does with a layer whose role the graph does not say: its gain is the role's (a
#: ReLU layer's g^2 = 2 fan_in/fan_out under proposed, a branch's last 1/B), so a guess would draw
#: a residual branch's out-projection at 2 B times its variance (0.18.0 did: issue 66)
ASSUMED = "kept as the model drew them (a gain needs the layer's role)"


def init_notes(init: str, records: list[InitRecord]) -> list[str]:
    """What ``init_`` did not do, in words for the table's foot and the JSON: the modules whose
    parameters it left as they were, grouped by class (every parameter is set or named here),
    and the role it assumed where the graph could not be read."""
    guessed = [r for r in records if r.note.startswith("role not read")]
    left = [r for r in records if not r.set and r not in guessed]
    roles_note = ""
    if guessed:
        why = guessed[0].note[len("role not read (") : guessed[0].note.index("): ")]
        roles_note = (
            f"{len(guessed)} of {len(guessed) + sum(r.set for r in records)} weight layers' roles not read "
            f"({why}): {ASSUMED}: {', '.join(r.name for r in guessed)}"
        )
    notes = []
    if left:
        groups: dict[tuple[str, str, tuple], list[str]] = {}
        for r in left:
            groups.setdefault((r.kind, r.note, r.parameters), []).append(r.name)
        parts = []
        for (cls, why, params), names in groups.items():
            which = names[0] if len(names) == 1 else f"{len(names)} x, e.g. {names[0]}"
            parts.append(f"{cls} {which} ({', '.join(params) or 'weight'}: {why})")
        count = sum(len(r.parameters) or 1 for r in left)
        notes.append(f"init {init!r} left {count} parameter(s) as they were: {'; '.join(parts)}")
    if roles_note:
        notes.append(f"init {init!r}: {roles_note}")
    return notes


def _wn_parts(m: nn.Module):
    """(g, v) parameters of a weight-normalized layer (torch.nn.utils.parametrizations.weight_norm
    or the older torch.nn.utils.weight_norm), or None."""
    par = getattr(m, "parametrizations", None)
    if par is not None and "weight" in par:
        orig = par["weight"]
        if hasattr(orig, "original0") and hasattr(orig, "original1"):
            return orig.original0, orig.original1
    if hasattr(m, "weight_g") and hasattr(m, "weight_v"):
        return m.weight_g, m.weight_v
    return None


PASS_THROUGH = ("identity", "scale")


def _example(model: nn.Module, batch):
    """An input to export the model on: the batch's first tensor, or a Hugging Face model's own
    ``dummy_inputs`` (its token ids); None."""
    if batch is not None:
        first = batch[0] if isinstance(batch, tuple) else batch
        return first if len(batch if isinstance(batch, tuple) else (batch,)) == 1 else None
    dummy = getattr(model, "dummy_inputs", None)
    ids = dummy.get("input_ids") if isinstance(dummy, dict) else None
    return ids if isinstance(ids, torch.Tensor) and ids.shape[0] >= 2 else None


def _graph_of(model: nn.Module, batch, export: bool = False):
    """The graph the roles are read from: torch.fx's, else (or with ``export``) torch.export's
    ATen graph (its weight layers named by the modules they run in) on the batch or a Hugging
    Face model's own dummy inputs; (None, why) where neither reads the model."""
    why = "torch.fx's graph keeps weight layers inside modules it calls whole"
    if not export:
        try:
            return ops.symbolic_trace(model), ""
        except Exception as exc:
            why = f"torch.fx could not trace the model ({type(exc).__name__}: {first_line(exc)})"
    x = _example(model, batch)
    if x is None:
        return None, why
    try:
        return trace.exported_graph(model, x), ""
    except Exception as exc2:
        return None, f"{why}; torch.export neither ({type(exc2).__name__}: {first_line(exc2)})"


def _kinds(gm: fx.GraphModule, nodes: list) -> dict:
    """Each node's kind as the roles read it: a sum with a constant (anything that depends on no
    input) is no join, a scaling by a constant passes through."""
    kind_of: dict[fx.Node, str] = {}
    dynamic: set = set()  # what depends on an input
    for n in nodes:
        if n.op == "placeholder" or any(a in dynamic for a in n.all_input_nodes):
            dynamic.add(n)
    for n in nodes:
        k = ops.kind_of(gm, n)
        if k == "add" and (len(n.all_input_nodes) != 2 or not all(a in dynamic for a in n.all_input_nodes)):
            k = "identity"  # x + a constant: no join
        elif k in ("mul", "div"):
            k = "scale" if len(n.all_input_nodes) == 1 else "other"
        kind_of[n] = k
    return kind_of


class Roles(dict):
    """{module path: (kind, blocks_in_stage, block_index)}, and ``reads``: {module path: how many
    query heads read each of its outputs} for a grouped-query attention's key and value
    projections (``_kv_reads``)."""

    reads: dict[str, int]

    def __init__(self, found=(), reads=None):
        super().__init__(found)
        self.reads = dict(reads or {})


def roles(model: nn.Module, batch=None) -> tuple[dict[str, tuple[str, int, int]], str]:
    """Each Linear/ConvNd's role as the paper's init reads it, from the model's fx graph:
    {module path: (kind, blocks_in_stage, block_index)} with kind ``relu`` (an activation reads
    its output, through norms), ``block_last`` (the last weight layer of a residual branch: the
    side of an add that is not the skip), ``projection`` (a weight layer on the skip side) or
    ``linear``; and why the graph could not be read ("" when it could).  A residual join is an
    add of two states: the skip is the side the other descends from, or, for a projection
    shortcut, the side with fewer weight layers since they parted.  Stages: consecutive joins,
    a new one at every join whose skip has a weight layer (a projection) -- the ResNets of
    Arpit et al. 2019, section 4, whose stages open with a projection; B is the stage's joins."""
    gm, why = _graph_of(model, batch)
    if gm is None:
        return Roles(), why
    found = _roles_in(model, gm)
    dense = {n for n, m in model.named_modules() if isinstance(m, DENSE_MODULES)}
    if dense - set(found) and not _exported(gm):
        # fx called a module whole (an nn.TransformerEncoder inside a user's wrapper) whose weight
        # layers it never reached: the exported graph, where an input is at hand, reads them
        gx, _ = _graph_of(model, batch, export=True)
        if gx is not None:
            wider = _roles_in(model, gx)
            if len(dense & set(wider)) > len(dense & set(found)):
                found, gm = wider, gx
    return Roles(found, _kv_reads(model, gm)), ""


def _kv_reads(model: nn.Module, gm) -> dict[str, int]:
    """The key and value projections of grouped-query attention, with how many query heads read
    each of their outputs: at every attention call (``scaled_dot_product_attention``), the dense
    layer each of its query, key and value inputs comes from (back through reshapes, repeats, a
    rotary embedding, a norm), and out_features(query's) / out_features(key's) where that is an
    integer above 1 (Llama's 32 query heads on 8: 4)."""
    nodes = list(gm.graph.nodes)
    kind_of = _kinds(gm, nodes)
    layers = dict(model.named_modules())

    def source(n):
        frontier, seen = [n], set()
        while frontier:
            m = frontier.pop(0)
            if m in seen:
                continue
            seen.add(m)
            if kind_of.get(m) == "dense":
                path = trace.module_path(m)
                return path if isinstance(layers.get(path), nn.Linear) else None
            frontier += [a for a in m.all_input_nodes if kind_of.get(a) not in ("const", "input")]
        return None

    out: dict[str, int] = {}
    for n in nodes:
        if kind_of[n] != "attention" or n.op != "call_function" or len(n.args) < 3:
            continue
        q, k, v = (source(a) if isinstance(a, fx.Node) else None for a in n.args[:3])
        if q is None:
            continue
        for kv in (k, v):
            if kv is None or kv == q:
                continue
            ratio = layers[q].out_features / layers[kv].out_features
            if ratio > 1 and ratio == int(ratio):
                out[kv] = int(ratio)
    return out


def _exported(gm) -> bool:
    """Whether a graph is torch.export's (ATen ops) rather than torch.fx's."""
    return any(n.op == "call_function" and "aten" in str(n.target) for n in gm.graph.nodes)


def _roles_in(model: nn.Module, gm) -> dict[str, tuple[str, int, int]]:
    """``roles`` read from one graph (torch.fx's or torch.export's)."""
    nodes = list(gm.graph.nodes)
    kind_of = _kinds(gm, nodes)
    ancestors: dict[fx.Node, set] = {}
    for n in nodes:
        a = {n}
        for i in n.all_input_nodes:
            a |= ancestors[i]
        ancestors[n] = a
    out: dict[str, tuple[str, int, int]] = {}
    for n in nodes:  # relu or linear: what reads the layer's output (through norms and reshapes)
        module_attention = kind_of[n] == "attention" and n.op == "call_module"
        if kind_of[n] != "dense" and not module_attention:
            continue
        frontier, role = list(n.users), "linear"
        while frontier:
            u = frontier.pop()
            if kind_of[u] == "act":
                role = "relu"
                break
            if kind_of[u] in ("norm", "identity", "scale"):
                frontier += list(u.users)
        # an nn.MultiheadAttention kept whole: its output projection is the weight layer here
        out[f"{n.target}.out_proj" if module_attention else trace.module_path(n)] = (role, 1, 0)

    def last_dense(n):
        """The path of the last weight layer of a branch ending at n (an attention module's: its
        output projection)."""
        while kind_of.get(n) in PASS_THROUGH:
            n = n.all_input_nodes[0]
        if kind_of.get(n) == "attention" and n.op == "call_module":
            return f"{n.target}.out_proj"
        return trace.module_path(n) if kind_of.get(n) == "dense" else None

    joins = []
    for n in nodes:
        # a rotary embedding's x cos + rotate_half(x) sin is a rotation, no residual join
        if kind_of[n] != "add" or len(n.all_input_nodes) != 2 or ops.decoder.rotary_parts(n) is not None:
            continue
        a, b = n.all_input_nodes
        if a in ancestors[b]:
            skip, branch = a, b
        elif b in ancestors[a]:
            skip, branch = b, a
        else:
            common = ancestors[a] & ancestors[b]
            count = lambda x: sum(1 for k in ancestors[x] - common if kind_of[k] == "dense")
            skip, branch = (a, b) if count(a) <= count(b) else (b, a)
            common = ancestors[a] & ancestors[b]
            for k in ancestors[skip] - common:
                if kind_of[k] == "dense":
                    out[trace.module_path(k)] = ("projection", 1, 0)
        projected = skip not in ancestors[branch]
        joins.append((last_dense(branch), projected))
    stages: list[list] = []
    for last, projected in joins:
        if projected or not stages:
            stages.append([])
        stages[-1].append(last)
    for stage in stages:
        for i, last in enumerate(stage):
            if last is not None:
                out[last] = ("block_last", len(stage), i)
    return _attention_outputs(model, out)


def _attention_outputs(model: nn.Module, out: dict) -> dict:
    """The roles read at an ``nn.MultiheadAttention``'s own path (torch.export's graph runs its
    output projection inside the attention module's call: the weight is read, the Linear is not
    called) given to its output projection, the weight layer ``init_`` draws (issue 48: a
    re-drawn encoder's ``self_attn.out_proj`` got the ReLU gain, 2.0 a row, instead of 1/B)."""
    for path in [p for p in out if p]:
        try:
            m = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(m, nn.MultiheadAttention) and f"{path}.out_proj" not in out:
            out[f"{path}.out_proj"] = out.pop(path)
    return out


def init_(
    model: nn.Module,
    scheme,
    seed: int = 0,
    draw: int = 0,
    wn: bool = False,
    blocks: dict | None = None,
    roles_: dict | None = None,
    batch=None,
    input_shape=None,
    vocab: int | None = None,
    quiet: bool = False,
) -> list[InitRecord]:
    """Apply the init scheme ``scheme`` (a name or an ``inits.InitScheme``) to every Linear and
    ConvNd of ``model`` (Arpit et al. 2019's schemes and their baselines), each layer's weights
    drawn by sigprop's own sampler for that scheme (sigprop/kernels/sampling.py) with the layer
    generator (seed, draw, index in module order): the same numbers sigprop's own nets draw for a
    layer of that shape and role.  Fans are c_in k^2 and c_out (the paper's footnote 3); the role
    comes from the model's graph (``roles``): a layer read by an activation is a ReLU layer
    (g^2 = 2 fan_in/fan_out for ``proposed``), the last weight layer of a residual branch gets
    1/B of its stage's B blocks (section 4), a projection shortcut and a layer read by nothing
    nonlinear gain 1. ``blocks``: {module path of a branch's last layer: B} overrides the B the graph
    gives; ``roles_``: {module path: "relu" | "linear" | "projection"} the role. A weight-normalized
    layer gets g and v; a plain one w = g v/||v|| (``wn=True`` adds weight normalization first).
    A grouped conv draws each group's rows as one layer's (fans per group: c_in k^2/groups and
    c_out/groups).  A data-dependent scheme (``datadep``: Salimans & Kingma 2016, section 3)
    then calibrates the layers in the order the forward calls them on ``batch`` (the inputs: a
    tensor or a tuple of them), ``calibrate``.  Returns what it did per layer; a layer it does
    not understand (a transposed conv, an embedding's table) is left as it is, named.

    The roles are read from torch.fx's graph, or, where fx cannot trace the model, from
    torch.export's on an input: ``batch``, else two rows drawn for ``input_shape`` (one sample's
    shape; token ids below ``vocab`` when given, else N(0, 1) floats), else a Hugging Face
    model's own ``dummy_inputs`` -- as the CLI, which exports on the probe's inputs.  Where no
    graph can be read the layers it could not place keep the model's own weights (a gain needs
    the role: 0.18.0 drew them as ReLU layers) and a ``sigprop.errors.RolesGuessed`` warning
    names every one (``quiet``: not warned -- the
    probe, which says it under its table)."""
    if isinstance(scheme, str):
        scheme = inits.get(scheme, frozenset({inits.TAPS, inits.MODEL}), "a model")
    if scheme.name == "as-is":
        return []
    if scheme.standardizes and batch is None:
        raise SigpropError(
            f"init {scheme.name!r} calibrates on a batch: pass batch= (the inputs)", field="init"
        )
    example = batch if batch is not None else _drawn_example(model, input_shape, vocab)
    records = _draw(model, scheme, seed, draw, wn, blocks, roles_, example)
    if not quiet:
        _warn_guessed(records)
    if scheme.standardizes:
        layers = dict(model.named_modules())
        # the weight layers are calibrated: not the norms, embeddings or attention projections
        dense = [r for r in records if r.set and isinstance(layers[r.name], DENSE_MODULES)]
        calibrate(model, [r.name for r in dense], batch)
        for r in dense:
            if layers[r.name].bias is None:
                r.note = "no bias to centre it: scaled to sd 1 only"
    return records


def _drawn_example(model: nn.Module, input_shape, vocab: int | None):
    """Two rows of inputs of one sample's shape ``input_shape`` to export the model on (token ids
    below ``vocab``, else N(0, 1) floats, on the model's device), None without a shape."""
    if input_shape is None:
        if vocab is not None:
            raise SigpropError("vocab= needs input_shape= (the ids' shape per sample)", field="input_shape")
        return None
    shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise SigpropError(
            f"input_shape must be positive integers (one sample's shape), got {input_shape!r}",
            field="input_shape",
        )
    home = next((p for p in model.parameters() if p.is_floating_point()), None)
    device = home.device if home is not None else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    if vocab is not None:
        return torch.randint(int(vocab), (2, *shape), generator=gen).to(device)
    dtype = home.dtype if home is not None else torch.float32
    return torch.randn((2, *shape), generator=gen).to(device=device, dtype=dtype)


def _warn_guessed(records: list[InitRecord]) -> None:
    """A ``RolesGuessed`` warning naming every layer whose role was not read (none: silent)."""
    guessed = [r for r in records if r.note.startswith("role not read")]
    if not guessed:
        return
    why = guessed[0].note[len("role not read (") : guessed[0].note.index("): ")]
    total = len(guessed) + sum(r.set for r in records)
    warnings.warn(
        f"init_: {len(guessed)} of {total} weight layers' roles not read ({why}); {ASSUMED}: "
        f"{', '.join(r.name for r in guessed)}. Pass input_shape= (with vocab= for token ids) "
        "or batch= so that the graph can be exported, or roles_=/blocks= to name them",
        RolesGuessed,
        stacklevel=3,
    )


def calibrate(model: nn.Module, names: list[str], batch) -> None:
    """The data-dependent init of a model (Salimans & Kingma 2016, eq. 5-6, as sigprop's own
    nets: ``sampling.CALIBRATIONS``): layer after layer in the order the forward calls them, a
    forward on ``batch`` (no graph) up to the layer reads its pre-activation t = v.x/||v|| per
    unit -- a Linear's last axis, a conv's channels, over the samples and positions -- and sets
    g = 1/sigma[t], b = -mu[t]/sigma[t]: each unit standardised on the batch by everything before
    it already calibrated.  One forward per layer, stopped at the layer.  The model is drawn on
    the host in float32 and run where the probe runs: it is calibrated there, on the batch's device
    and in its dtype, and handed back where it was (the scale and bias rounded to its dtype)."""
    first = (batch if isinstance(batch, tuple) else (batch,))[0]
    home = next((p for p in model.parameters() if p.is_floating_point()), None)
    if home is not None and (home.device, home.dtype) != (first.device, first.dtype):
        where = (home.device, home.dtype)
        model.to(device=first.device, dtype=first.dtype)
        try:
            calibrate(model, names, batch)
        finally:
            model.to(device=where[0], dtype=where[1])
        return
    layers = dict(model.named_modules())
    order: list[str] = []
    seen = {id(layers[n]): n for n in names}

    def note(mod, args, out):
        n = seen.get(id(mod))
        if n is not None and n not in order:
            order.append(n)

    handles = [layers[n].register_forward_hook(note) for n in names]
    try:
        with torch.no_grad():
            call(model, batch)
    finally:
        for h in handles:
            h.remove()

    for n in order:
        m, got = layers[n], {}

        def grab(mod, args, out, got=got):
            got["t"] = out.detach()
            raise _Stop

        h = m.register_forward_hook(grab)
        try:
            with torch.no_grad():
                call(model, batch)
        except _Stop:
            pass
        finally:
            h.remove()
        t = got["t"].double()
        axis = t.dim() - 1 if isinstance(m, nn.Linear) else 1
        if m.bias is not None:  # t is v.x/||v||: the drawn bias is 0, but a kept one is taken off
            t = t - m.bias.detach().double().reshape([-1 if d == axis else 1 for d in range(t.dim())])
        dims = [d for d in range(t.dim()) if d != axis]
        mu, sigma = t.mean(dim=dims), t.std(dim=dims, unbiased=False)
        if not bool((sigma > 0).all()):
            raise SigpropError(
                f"datadep: a unit of {n!r} has zero variance over the batch; use more samples",
                field="samples",
            )
        w_scale = (1.0 / sigma).to(m.weight.dtype)
        parts = _wn_parts(m)
        with torch.no_grad():
            if parts is not None:
                g_param, _ = parts
                g_param.mul_(w_scale.reshape(g_param.shape))
            else:
                m.weight.mul_(w_scale.reshape(-1, *([1] * (m.weight.dim() - 1))))
            if m.bias is not None:
                m.bias.copy_((-mu / sigma).to(m.bias.dtype))
        # the trace maps it as standardised (its bias is not independent of its input: it cancels
        # the units' offsets on this batch), not as a random layer with a bias
        m._sigprop_standardized = m.bias is not None


class _Stop(BaseException):
    """Ends a calibration's forward at the layer it reads (not an Exception: ``forward.call`` lets it by)."""


def _plain(scheme, role, gen, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One plain weight matrix [fan_out, fan_in] and its bias (None: zero) of a role, drawn by the
    scheme's sampler as sigprop's own layers are."""
    p = sampling.sample(scheme, role, gen, like.device, like.dtype)
    w = p.v.reshape(role.fan_out, role.fan_in).to(like.dtype) * p.scale.reshape(-1, 1).to(like.dtype)
    return w, None if p.bias is None else p.bias.reshape(-1).to(like.dtype)


def _other(name: str, m: nn.Module, scheme, role_of, gen_of) -> InitRecord | None:
    """The modules beside Linear/ConvNd that a transformer holds (issue 39): an
    ``nn.MultiheadAttention``'s query, key and value projections (three layers of its in-projection
    -- no activation reads them: gain 1 --, their biases 0), a Hugging Face ``Conv1D`` (x W + b: a
    dense layer with W [fan_in, fan_out]) and an embedding table (rows N(0, I): the tokens at the
    scale of the probe's float inputs; the scheme's ``embedding_std`` where it says, GPT-2's
    0.02), and a normalisation's gain and offset (1 and 0: its identity, the init every scheme
    assumes).  None for a module this does not read."""
    with torch.no_grad():
        if isinstance(m, nn.MultiheadAttention) and m.bias_k is None:
            d = m.embed_dim
            mats = (
                [(m.in_proj_weight, k) for k in range(3)]
                if m._qkv_same_embed_dim
                else [(m.q_proj_weight, None), (m.k_proj_weight, None), (m.v_proj_weight, None)]
            )
            for i, (param, k) in enumerate(mats):
                rows = param.shape[0] // 3 if k is not None else param.shape[0]
                role = inits.LayerRole(fan_in=param.shape[1], fan_out=rows, kind="linear")
                w, _ = _plain(scheme, role, gen_of(), param)
                (param[k * rows : (k + 1) * rows] if k is not None else param).copy_(w)
            if m.in_proj_bias is not None:
                m.in_proj_bias.zero_()
            return InitRecord(
                name, type(m).__name__, d, 3 * d, False, True, "linear", note="q, k, v projections"
            )
        if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None and m.weight.dim() == 2:
            fan_in, fan_out = m.weight.shape
            kind, B, i = role_of(name)
            role = inits.LayerRole(
                fan_in=fan_in, fan_out=fan_out, kind=kind, blocks_in_stage=B, block_index=i
            )
            w, b = _plain(scheme, role, gen_of(), m.weight)
            m.weight.copy_(w.T)
            if getattr(m, "bias", None) is not None:
                m.bias.copy_(torch.zeros_like(m.bias) if b is None else b)
            return InitRecord(name, "Conv1D", fan_in, fan_out, False, True, kind, B)
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
            gen = gen_of()
            std = scheme.embedding_std
            std = std(m.weight.shape[1]) if callable(std) else std
            m.weight.copy_(std * torch.randn(m.weight.shape, generator=gen, device=gen.device).to(m.weight))
            note = "rows N(0, I)" if std == 1.0 else f"rows N(0, {std:.4g}^2 I)"
            return InitRecord(
                name, type(m).__name__, 0, m.weight.shape[1], False, True, "embedding", note=note
            )
        own = dict(m.named_parameters(recurse=False))
        if is_norm(m) and own and set(own) <= {"weight", "bias"}:  # the normalisation's identity
            for k, v in own.items():
                v.fill_(1.0 if k == "weight" else 0.0)
            return InitRecord(name, type(m).__name__, 0, 0, False, True, "norm", note="gain 1, offset 0")
    return None


def _write(m: nn.Module, p, parts, w: torch.Tensor, fan_out: int) -> None:
    """A drawn layer's parameters into the module: g and v (weight-normalized), or w = v times its
    row scale, and the bias (0 where the scheme draws none)."""
    with torch.no_grad():
        v = p.v.reshape(w.shape).to(w.dtype)
        row_scale = p.scale.reshape(-1, *([1] * (w.dim() - 1))).to(w.dtype)
        if parts is not None and p.g is not None:
            g_param, v_param = parts
            v_param.copy_(v)
            g_param.copy_(p.g.reshape(g_param.shape).to(w.dtype))
        elif parts is not None:  # an unnormalised scheme on a WN layer: g = ||w|| keeps w
            g_param, v_param = parts
            v_param.copy_(v * row_scale)
            g_param.copy_(v_param.reshape(fan_out, -1).norm(dim=1).reshape(g_param.shape))
        else:
            m.weight.copy_(v * row_scale)
        if m.bias is not None:
            m.bias.copy_(
                torch.zeros_like(m.bias) if p.bias is None else p.bias.reshape(m.bias.shape).to(w.dtype)
            )


def _draw(model, scheme, seed, draw, wn, blocks, roles_, batch=None) -> list[InitRecord]:
    """``init_``'s draw of every layer (before any calibration)."""
    found, why = roles(model, batch)
    records: list[InitRecord] = []
    index = 0

    def gen_of():
        nonlocal index
        index += 1
        return sampling.layer_generator(seed, draw, index, next(model.parameters()).device)

    def role_of(name):
        kind, B, i = found.get(name, ("relu", 1, 0))
        return (roles_ or {}).get(name, kind), int((blocks or {}).get(name, B)), i

    def unread(name) -> bool:
        """A layer whose role neither the graph nor the caller (``roles_``, ``blocks``) says."""
        return name not in found and name not in (roles_ or {}) and name not in (blocks or {})

    note = f"role not read ({why or 'no call of this module in the traced graph'}): {ASSUMED}"
    for name, m in list(model.named_modules()):
        if not isinstance(m, DENSE_MODULES):
            own = [n for n, _ in m.named_parameters(recurse=False)]
            if own and not isinstance(m, ParametrizationList):  # a WN layer's g and v are its layer's
                kept = type(m).__name__ == "Conv1D" and unread(name)
                done = None if kept else _other(name, m, scheme, role_of, gen_of)
                if kept:  # a Conv1D whose role the graph does not say: kept, as a Linear is
                    gen_of()  # its generator's index, as when drawn
                    done = InitRecord(name, "Conv1D", 0, 0, False, False, note=note, parameters=tuple(own))
                records.append(
                    done
                    or InitRecord(
                        name, type(m).__name__, 0, 0, False, False, note=_why_left(m), parameters=tuple(own)
                    )
                )
            continue
        if wn and _wn_parts(m) is None:
            torch.nn.utils.parametrizations.weight_norm(m)
        parts = _wn_parts(m)
        w = m.weight.detach()
        shape = w.shape
        groups = getattr(m, "groups", 1)  # a grouped conv: each group's rows drawn as one layer's
        fan_out, fan_in = shape[0] // groups, int(np.prod(shape[1:]))
        taps = int(np.prod(shape[2:])) if w.dim() > 2 else 1
        kind, B, b_index = found.get(name, ("relu", 1, 0))
        if blocks and name in blocks:
            kind, B = "block_last", int(blocks[name])
        if roles_ and name in roles_:
            kind = roles_[name]
        index += 1  # its generator's index whether drawn or kept: the others' draws do not move
        if unread(name):
            own = tuple(n for n, _ in m.named_parameters(recurse=False))
            records.append(InitRecord(name, type(m).__name__, fan_in, fan_out, False, False, note=note,
                                      parameters=own))  # fmt: skip
            continue
        role = inits.LayerRole(
            fan_in=fan_in, fan_out=fan_out, kind=kind, blocks_in_stage=B, block_index=b_index, taps=taps,
            reads=getattr(found, "reads", {}).get(name, 1),
        )  # fmt: skip
        gen = sampling.layer_generator(seed, draw, index, w.device)
        # as the walker draws in this dtype; the groups one after another from the layer's generator
        drawn = [sampling.sample(scheme, role, gen, w.device, w.dtype) for _ in range(groups)]
        p = drawn[0]
        if groups > 1:
            cat = lambda xs: None if xs[0] is None else torch.cat([x.reshape(-1) for x in xs])
            p = dataclasses.replace(
                p,
                v=torch.cat([d.v.reshape(fan_out, -1) for d in drawn]),
                g=cat([d.g for d in drawn]),
                scale=cat([d.scale for d in drawn]),
                bias=cat([d.bias for d in drawn]),
            )
        _write(m, p, parts, w, fan_out)
        records.append(InitRecord(name, type(m).__name__, fan_in, fan_out, parts is not None, True, kind, B))
    return records
