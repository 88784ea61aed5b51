"""The shape of the house (issue 28, items 1-2), read from the package's source with ``ast``: no
module imports one that imports it back (no import circle), no module outside sigprop/kinds/
names a net kind or its spec class, and every import inside a function says why on its line
(the optional extras and the lazy torch import at the edge are the only ones)."""

from __future__ import annotations

import ast
from pathlib import Path

from sigprop import kinds

PACKAGE = Path(__file__).resolve().parents[1] / "sigprop"


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return out


MODULES = _modules()


def _imports(name: str, tree: ast.Module, is_package: bool) -> set[str]:
    """The package's modules ``name`` imports anywhere in its body (functions included)."""
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = (
                ".".join(base[: len(base) - node.level + 1] + [node.module or ""])
                if node.level
                else node.module or ""
            )
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = {n: _imports(n, tree, path.name == "__init__.py") for n, (path, tree) in MODULES.items()}
    assert _circles(graph) == []
    # and the check can fail: a circle planted in a copy of the graph is found
    planted = {**graph, "sigprop.theory": graph["sigprop.theory"] | {"sigprop.run"}}
    assert any("sigprop.theory" in c for c in _circles(planted))


def _at_run_time(tree: ast.Module) -> ast.Module:
    """The module without its ``if TYPE_CHECKING:`` blocks (names for annotations, never run)."""
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    ]
    return ast.Module(body=body, type_ignores=[])


def test_the_sweep_loop_and_the_width_check_sit_below_the_kinds():
    """Arrows down (issue 68 item 7): the kinds build their width nets (``width.spec``) and sweep
    over ``sweeps``; neither imports a kind back (0.19: ``width.points`` imported
    ``kinds.module`` for its target loader, ``sweeps.grid`` the kinds for its annotations)."""
    below = [n for n in MODULES if n.startswith(("sigprop.width", "sigprop.sweeps"))]
    up = {
        n: sorted(
            m
            for m in _imports(n, _at_run_time(tree), path.name == "__init__.py")
            if m.startswith("sigprop.kinds")
        )
        for n, (path, tree) in MODULES.items()
        if n in below
    }
    assert {n: m for n, m in up.items() if m} == {}
    # and the check can fail: the old import, planted, is found
    planted = ast.parse("from sigprop.kinds.module import resolve_target")
    assert _imports("sigprop.width.points", planted, False) == {"sigprop.kinds.module"}


def test_only_kinds_knows_which_nets_exist():
    names = set(kinds.KINDS) | {"bn-resnet", "wrn-bn"}  # and the variants 0.7 spelled out
    classes = {k.spec.__name__ for k in kinds.KINDS.values()} | {
        type(k).__name__ for k in kinds.KINDS.values()
    }
    found = []
    for name, (path, tree) in MODULES.items():
        if name.startswith("sigprop.kinds"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
            if (
                isinstance(node, (ast.Name, ast.Attribute))
                and (getattr(node, "id", None) or node.attr) in classes
            ):
                found.append(f"{path.name}:{node.lineno} {getattr(node, 'id', None) or node.attr}")
    assert found == []


def test_imports_inside_functions_say_why():
    """An import inside a function is the lazy edge (torch at the CLI or the package's
    ``__getattr__``) or an optional extra (matplotlib), or scipy's slow modules for the one
    command that needs them -- each with its reason in a comment on its line."""
    silent = []
    for name, (path, tree) in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                    silent.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert silent == []


def test_the_registries_are_consistent():
    """Every registered init has a sampler, and every kind's default inits are defined for it."""
    from sigprop import inits
    from sigprop.kernels import sampling

    assert set(inits.INITS) == set(sampling.SAMPLERS)
    for kind in kinds.KINDS.values():
        for name in kind.default_inits or ():
            assert inits.get(name).defined_for(kind.provides), (kind.name, name)
