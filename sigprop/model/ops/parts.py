"""Parts of one weight layer's output (docs/theory.md §16, "Pieces of a fused projection"): a
fused projection ``x W^T`` split into pieces -- nanoGPT's ``c_attn`` into q, k, v, GPT-NeoX's
and Falcon's ``query_key_value`` viewed per head and split, Phi-3's ``gate_up_proj`` chunked
into the gate and the up projection -- gives each piece the rows of W it reads.  Rows drawn
independently make two pieces on disjoint rows as independent as two layers (a product of the
gate and the up part is a gated MLP's product); a piece whose rows are scaled apart from the
rest (a fused q scaled by an init) has its own moment.  Which rows a piece reads is found by
running the output units' indices through the same view, transpose and split calls."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from sigprop.maps.state import Piece

#: graph ops a piece may be reached through from its weight layer: element-preserving moves
PASSING = frozenset({"identity", "slice"})
#: calls that change an index tensor's dtype or values without moving elements: skipped
_SKIP = ("to", "type", "float", "contiguous", "clone", "detach", "alias", "dropout", "_assert")


def piece_of(t, n: fx.Node) -> Piece | None:
    """The ``Piece`` fx node ``n`` (a split's part, a slice) is of a dense layer's output, reached
    back from it through element-preserving graph ops; None where it is not one, or where its
    rows cannot be followed (an op the index replay cannot run)."""
    chain = [n]
    a = n
    while True:
        src = next((x for x in a.all_input_nodes if x in t.index and t.nodes[t.index[x]].op != "const"), None)
        if src is None:
            return None
        node = t.nodes[t.index[src]]
        if node.op == "dense":
            break
        if node.op not in PASSING or len(node.inputs) != 1:
            return None
        chain.append(src)
        a = src
    rows = node.rows  # each output unit's squared row norm (a Linear's; a conv's units are channels)
    meta = src.meta.get("tensor_meta") or src.meta.get("val")
    shape = tuple(getattr(meta, "shape", ()) or ())
    if rows is None or not shape or shape[-1] != len(rows):
        return None
    units = _replay(t, chain[::-1], src, torch.arange(len(rows)).expand(shape))
    if units is None or units.numel() == 0:
        return None
    # the indices start as one row of units broadcast over the samples and tokens (stride 0) and
    # views keep it so: along a stride-0 axis every entry is the same, one of each read (exact; a
    # long sequence's [2, T, 3d] never copied)
    units = units[tuple(0 if st == 0 else slice(None) for st in units.stride())]
    picked = torch.unique(units.reshape(-1)).cpu().numpy()
    sigma = float(rows[picked].mean() / rows.mean()) if float(rows.mean()) > 0 else 1.0
    return Piece(t.index[src], frozenset(picked.tolist()), sigma)


def _replay(t, chain: list, start: fx.Node, units: torch.Tensor) -> torch.Tensor | None:
    """The index tensor ``units`` run through the fx calls of ``chain`` (each reading the one
    before; ``start`` the weight layer's node): the output unit behind each element of the last."""
    env = {start: units}

    def arg(a):
        if isinstance(a, fx.Node):
            if a in env:
                return env[a]
            v = t.value(a)
            if v is None and not (a.op == "call_function" and a.target is operator.getitem):
                raise LookupError(a)
            return v
        return a

    try:
        for n in chain:
            name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
            x = env[next(a for a in n.all_input_nodes if a in env)]
            if n.op == "call_module" or any(s in str(name) for s in _SKIP):
                env[n] = x
                continue
            args = fx.node.map_aggregate(n.args, arg)
            kwargs = fx.node.map_aggregate(n.kwargs, arg)
            if n.op == "call_method":
                env[n] = getattr(args[0], n.target)(*args[1:], **kwargs)
            else:
                env[n] = n.target(*args, **kwargs)
    except Exception:  # an op the replay cannot run: the piece is not followed (no piece)
        return None
    out = env[chain[-1]]
    return out if isinstance(out, torch.Tensor) and not out.is_floating_point() else None


def independent(a: set, b: set, nodes: list) -> bool:
    """Whether two states' near sets (``structure._near``) meet only in pieces of one weight layer
    on disjoint rows: they share no node, or only such pieces' sources."""
    pa = [nodes[i].params for i in a if isinstance(nodes[i].params, Piece)]
    pb = [nodes[i].params for i in b if isinstance(nodes[i].params, Piece)]
    return not any(p.overlaps(q) for p in pa for q in pb)
