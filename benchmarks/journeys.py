"""How many rooms a journey through sigprop enters: per journey, the sigprop modules whose code
runs, the moves between them (distinct caller-module -> callee-module pairs of the calls), the
modules entered from more than one other module, and the rooms *entered twice*: a call into a
module that is already on the stack below another module's frame (the journey left the room
and came back into it before leaving it for good) -- measured by a profiler hook
(``sys.setprofile``) on a second, warm run (imports done), for issue 51's three journeys:

* ``mlp``: ``sigprop mlp --depth 20`` (the CLI, the table);
* ``module``: ``sigprop module`` on a small GPT-2 (two layers of 32; the [models] extra);
* ``point``: one sweep point's probe as a Dask worker runs it (``api.probe`` of an MLP and its
  JSON document; no CLI).

A room entered twice is told apart by how it was called.  *By name*: the calling sigprop code
names the function it calls (a helper, a method on an object whose class lives in a room on the
stack) -- a layering fault, of which the three journeys have none since 0.17.0 (test:
tests/test_journeys.py).  *Handed down*: a function given to a lower room and called back
through a parameter, a registry or torch -- the contract of a higher-order room, listed and
left: the replay runner calls the unit's step body (kernels/replay.py: it must hold the body to
capture it as a CUDA graph), a forward hook and torch's function mode run inside the model's
forward, a quadrature integrates the activation it is handed, the fold's tangent recursion
calls each op's map through the registry.

Usage: python benchmarks/journeys.py [--show] [mlp module point]
(``--show``: each module entered from more than one other, with its callers, and each room
entered twice, with the calls that entered it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

GPT2 = """import transformers
def make():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2Model(cfg)
"""


def _module(filename: str) -> str | None:
    i = filename.find("/sigprop/")
    return None if i < 0 or "/tests/" in filename else filename[i + 1 :]


def _by_name(frame) -> bool:
    """Whether the call that made ``frame`` came from sigprop code naming the callee (a global,
    an attribute or a method of that name), not a function handed down (a parameter, a registry
    entry, a protocol method torch or Python calls)."""
    back, name = frame.f_back, frame.f_code.co_name
    return (
        back is not None
        and _module(back.f_code.co_filename) is not None
        and not name.startswith("__")
        and name in back.f_code.co_names
    )


def _reentry(frame, m: str) -> tuple | None:
    """(by name?, the call's path of rooms) where module ``m`` is on the stack already below
    another module's frame; None where it is not."""
    chain: list = []  # the rooms on the stack from the caller outward, consecutive ones merged
    f = frame.f_back
    while f is not None:
        cm = _module(f.f_code.co_filename)
        if cm is not None and (not chain or chain[-1][0] != cm):
            chain.append((cm, f.f_code.co_name))
        f = f.f_back
    if not chain or chain[0][0] == m or all(c[0] != m for c in chain[1:]):
        return None
    i = next(k for k, c in enumerate(chain) if k > 0 and c[0] == m)
    path = (f"{m}:{frame.f_code.co_name}",) + tuple(f"{c}:{fn}" for c, fn in chain[: i + 1])
    return _by_name(frame), path


def trace(run) -> tuple[set, list, dict]:
    """(the sigprop modules whose code ran, the calls that crossed modules, the rooms entered
    twice: {path of the call: by name?}) of ``run()``."""
    rooms: set = set()
    moves: list = []
    twice: dict = {}

    def hook(frame, event, arg):
        if event != "call":
            return
        m = _module(frame.f_code.co_filename)
        if m is None:
            return
        rooms.add(m)
        caller = frame.f_back
        while caller is not None and _module(caller.f_code.co_filename) is None:
            caller = caller.f_back
        cm = None if caller is None else _module(caller.f_code.co_filename)
        if cm != m:
            moves.append((cm, m))
            again = _reentry(frame, m)
            if again is not None:
                twice[again[1]] = again[0]

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        sys.setprofile(hook)
        try:
            run()
        finally:
            sys.setprofile(None)
    return rooms, moves, twice


def journey(name: str, tmp: Path):
    """The callable of one journey."""
    if name == "mlp":
        from sigprop.cli import main

        return lambda: main(["mlp", "--depth", "20", "--device", "cpu"])
    if name == "module":
        from sigprop.cli import main

        factory = tmp / "gpt2_factory.py"
        factory.write_text(GPT2)
        args = ["module", f"{factory}:make", "--input-shape", "8", "--vocab", "100", "--samples", "8"]
        return lambda: main([*args, "--device", "cpu"])
    from sigprop import api, specs
    from sigprop.kinds.mlp import MLPSpec

    spec = MLPSpec(depth=10, input_dim=64, width=specs.WidthSpec(64, 64), inits=("he",))
    return lambda: api.probe(spec, specs.ProbeSpec(samples=16, device="cpu")).to_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("journeys", nargs="*", default=["mlp", "module", "point"])
    ap.add_argument("--show", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.journeys:
            run = journey(name, Path(tmp))
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                run()  # warm: the imports are not the journey
            rooms, moves, twice = trace(run)
            callers: dict = {}
            for a, b in moves:
                callers.setdefault(b, set()).add(a)
            multi = {b: v for b, v in callers.items() if len(v) > 1}
            named = {p[0].split(":")[0] for p, by in twice.items() if by}
            handed = {p[0].split(":")[0] for p, by in twice.items() if not by}
            print(
                f"{name}: {len(rooms)} modules, {len(set(moves))} moves between them, "
                f"{len(multi)} modules entered from more than one other module; rooms entered "
                f"twice: {len(named)} by name, {len(handed)} through a function handed down"
            )
            if args.show:
                for b, v in sorted(multi.items()):
                    print(f"    {b} <- {', '.join(sorted(x or '(outside)' for x in v))}")
                for path, by in sorted(twice.items()):
                    print(f"    twice ({'by name' if by else 'handed down'}): {' <- '.join(path)}")


if __name__ == "__main__":
    main()
