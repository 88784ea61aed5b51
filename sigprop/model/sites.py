"""Where a model is measured: its sites (module outputs: the top-level blocks by default, the
leaves, or named ones), and the ``Survey`` of one forward of two samples that tells, before a run,
which modules the forward calls, what its output is and what a sample costs in memory."""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass

import torch
import torch.nn as nn

from sigprop.errors import SigpropError
from sigprop.model.build import output_choice, probe_output
from sigprop.model.forward import call

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def is_stack(m: nn.Module) -> bool:
    """A repeated stack of blocks: an ``nn.ModuleList`` of two or more children of one class with
    parameters and children of their own -- the transformer's idiom (BERT's
    ``encoder.layer``, GPT-2's ``h``, ``nn.TransformerEncoder``'s ``layers``), whose owner's
    forward runs the blocks one after another."""
    if type(m) is not nn.ModuleList or len(m) < 2:
        return False
    kinds = {type(c) for c in m}
    return len(kinds) == 1 and all(list(c.children()) and any(True for _ in c.parameters()) for c in m)


def stack_span(model: nn.Module, sites: list[str]) -> tuple[int, int] | None:
    """The first and the last of ``sites`` that are layers of one repeated stack (``is_stack``: a
    transformer's layers, ``h.0`` .. ``h.11``), the stack with the most sites; None where fewer
    than two sites are such layers."""
    by_stack: dict[str, list[int]] = {}
    for i, site in enumerate(sites):
        parent, _, index = module_of(site).rpartition(".")
        if not index.isdigit():
            continue
        try:
            owner = model.get_submodule(parent) if parent else model
        except AttributeError:
            continue
        if is_stack(owner):
            by_stack.setdefault(parent, []).append(i)
    if not by_stack:
        return None
    layers = max(by_stack.values(), key=len)
    return (layers[0], layers[-1]) if len(layers) >= 2 else None


def holds_stack(m: nn.Module) -> bool:
    """Whether a block holds a repeated stack (``is_stack``) anywhere inside it."""
    return any(is_stack(d) for d in m.modules())


def call_name(path: str, k: int) -> str:
    """The site of a module's call ``k`` (0-based) in one forward: its path for the first,
    ``path@k`` after (torch.fx's and torch.export's names: a looped block's ``block@2`` is its third
    call)."""
    return path if k == 0 else f"{path}@{k}"


def module_of(site: str) -> str:
    """The module path a site names (``block@2`` -> ``block``)."""
    return site.split("@", 1)[0]


def calls_of(path: str, called) -> list[str]:
    """Every call of module ``path`` the forward made (``called``: the survey's names, a call
    after the first as ``path@k``): ``[path]`` for a module called once."""
    out, k = [path], 1
    while called is not None and call_name(path, k) in called:
        out.append(call_name(path, k))
        k += 1
    return out


def reused(path: str, called) -> bool:
    """Whether the forward calls module ``path`` more than once (a looped block, a shared layer)."""
    return called is not None and call_name(path, 1) in called


def auto_sites(model: nn.Module, called=None, skip=frozenset(), order=()) -> list[str]:
    """The default sites: the outputs of the model's top-level blocks, where a plain
    ``nn.Sequential``, ``nn.ModuleList`` or ``nn.ModuleDict`` (a container, not a block: exactly
    those classes) is opened into its own children (torchvision's ResNet reads ``layer3.4``,
    MONAI's DenseNet ``features.denseblock2``), a block that holds a repeated stack of blocks
    (``is_stack``: a transformer's layers, wherever they sit -- BERT's
    ``encoder.layer.0..N``) is opened down to it, one site per layer beside its siblings
    (``encoder.norm``), and a block without parameters (an activation, a pooling, a dropout)
    stands for the block before it: it replaces that block's site (so an MLP's sites are its
    post-activation states; one before any block, such as a shared activation module, is
    skipped).  ``called``: the module paths the forward calls (``survey``); a block outside it
    (a leftover head) is no site, nor one in ``skip`` (its output is not per sample: Llama's
    rotary embedding's cos and sin).  A block the forward calls several times (a looped block,
    ALBERT's shared layer: ``reused``) is a site per call, ``block``, ``block@1``, ...; a block that
    holds one is opened down to it; and then the sites go in the order the forward finished them
    (``order``: the survey's)."""
    blocks: list[tuple[str, nn.Module]] = []

    def holds_reused(path: str, m: nn.Module) -> bool:  # a weighted module called again inside
        return any(
            reused(f"{path}.{n}", called) and any(True for _ in c.parameters())
            for n, c in m.named_modules()
            if n
        )

    def open_(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if reused(path, called) and any(True for _ in child.parameters()):
                blocks.extend((c, child) for c in calls_of(path, called))
            elif (
                type(child) in CONTAINERS
                or holds_stack(child)
                or holds_reused(path, child)
                or (len(list(module.named_children())) == 1 and list(child.children()) and module is model)
            ):
                open_(path + ".", child)
            elif called is None or path in called:
                blocks.append((path, child))

    open_("", model)
    sites: list[str | None] = []
    for path, child in blocks:
        has_params = any(True for _ in child.parameters())
        if path in skip:  # not a state: a block with weights holds its slot (GPT-2's wpe, then drop)
            if has_params:
                sites.append(None)
        elif not has_params:
            if sites:
                sites[-1] = path
        else:
            sites.append(path)
    out = [p for p in sites if p is not None]
    if order and any("@" in p for p in out):  # calls interleave: the forward's order
        rank = {p: i for i, p in enumerate(order)}
        out.sort(key=lambda p: rank.get(p, len(rank)))
    return out


def resolve_sites(
    model: nn.Module, sites: str, called=None, skip=frozenset(), order=()
) -> tuple[list[str], list[str]]:
    """``auto`` (``auto_sites``), ``leaves`` (every leaf module), or a comma list of module
    paths and fnmatch patterns (``layer3.*``); a name that matches nothing is refused with the
    closest path.  ``called`` (``survey``): modules the forward never calls are left out of auto,
    leaves and patterns, and named in the notes returned beside the sites; a site named
    exactly that the forward never calls is refused.  A module the forward calls several times is
    a site per call (``calls_of``; ``block@2`` names its third call alone)."""
    paths = [n for n, _ in model.named_modules(remove_duplicate=False) if n]
    names = [c for n in paths for c in calls_of(n, called)]
    runs = (lambda n: True) if called is None else (lambda n: n in called)
    uncalled: list[str] = []
    if sites == "auto":
        out = auto_sites(model, called, skip, order)
        uncalled = [n for n in auto_sites(model) if not runs(n)]
    elif sites == "leaves":
        leaves = [n for n, m in model.named_modules(remove_duplicate=False) if n and not list(m.children())]
        out, uncalled = (
            [c for n in leaves if runs(n) for c in calls_of(n, called)],
            [n for n in leaves if not runs(n)],
        )
    else:
        out = []
        for pat in (s.strip() for s in sites.split(",")):
            hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
            if pat in paths:  # a module's name: each of its calls
                hit = calls_of(pat, called)
            if not hit:
                close = difflib.get_close_matches(pat, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise SigpropError(f"site {pat!r} matches no module of the model{hint}", field="sites")
            if not any(runs(n) for n in hit):
                raise SigpropError(
                    f"site {pat!r} is never called by the model's forward (a module it does not use)",
                    field="sites",
                )
            # the shallowest matches: ``encoder.layers.*`` means the layers, not every module in them
            hit = [n for n in hit if not any(module_of(n).startswith(module_of(h) + ".") for h in hit)]
            out += [n for n in hit if runs(n) and n not in out]
            uncalled += [n for n in hit if not runs(n) and n not in uncalled]
    if not out and not names:
        raise SigpropError(
            f"the model ({type(model).__name__}) has no submodules: sites are submodules' outputs",
            field="sites",
        )
    if not out:
        raise SigpropError("no submodule with parameters to measure: name sites with --sites", field="sites")
    notes = []
    if uncalled:
        shown = ", ".join(uncalled[:4]) + (f" and {len(uncalled) - 4} more" if len(uncalled) > 4 else "")
        notes.append(f"not measured: {shown} (never called by the model's forward)")
    return out, notes


@dataclass(frozen=True)
class Survey:
    """What one forward of a few samples (no graph) tells before a run: the bytes of every leaf
    module's output per sample (what autograd keeps for the backward, about one tensor per op:
    the driver multiplies by the samples, adds the weights, and refuses a run that would not fit
    before it starts), the modules the forward called (auto sites skip the others), the output's
    units per sample, and which tensor of a tuple or dict output is read (``output_choice``)."""

    per_sample: int
    called: frozenset
    units: int
    output: str
    #: modules whose output is not one row per sample (auto sites skip them)
    not_per_sample: frozenset = frozenset()
    #: the calls (``call_name``) in the order the forward finished them
    order: tuple = ()


def survey(model: nn.Module, x1, what: str = "the model") -> Survey:
    """One forward of ``x1`` (a few rows) with a hook on every module: ``Survey``.  The model's
    errors are one line naming --input-shape (``forward.call``); a non-finite output is refused
    (``check_finite``)."""
    total = 0
    called: set[str] = set()
    shared: set[str] = set()
    order: list[str] = []  # each call as the forward finishes it
    count: dict[str, int] = {}
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    rows_ = (x1 if isinstance(x1, tuple) else (x1,))[0].shape[0]

    def seen(mod, args, out):
        nonlocal total
        name = names.get(id(mod), "")
        k = count[name] = count.get(name, -1) + 1
        called.add(call_name(name, k))
        order.append(call_name(name, k))
        first = next(
            (t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)),
            None,
        )
        if first is not None and (first.dim() == 0 or first.shape[0] != rows_):
            shared.add(names.get(id(mod), ""))
        if not list(mod.children()):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()

    handles = [m.register_forward_hook(seen) for m in model.modules()]
    try:
        with torch.no_grad():
            out = call(model, x1)
    finally:
        for h in handles:
            h.remove()
    y = probe_output(out, rows_, what)
    return Survey(
        total // max(rows_, 1),
        frozenset(called),
        y[0].numel(),
        output_choice(out),
        frozenset(shared),
        tuple(order),
    )
