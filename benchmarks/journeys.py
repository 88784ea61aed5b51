"""How many rooms a journey through sigprop enters: per journey, the sigprop modules whose code
runs, the moves between them (distinct caller-module -> callee-module pairs of the calls) and the
modules entered from more than one other module -- measured by a profiler hook (``sys.setprofile``)
on a second, warm run (imports done), for issue 51's three journeys:

* ``mlp``: ``sigprop mlp --depth 20`` (the CLI, the table);
* ``module``: ``sigprop module`` on a small GPT-2 (two layers of 32; the [models] extra);
* ``point``: one sweep point's probe as a Dask worker runs it (``api.probe`` of an MLP and its
  JSON document; no CLI).

Usage: python benchmarks/journeys.py [--show] [mlp module point]
(``--show``: each module entered from more than one other, with its callers).
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


def trace(run) -> tuple[set, list]:
    """(the sigprop modules whose code ran, the calls that crossed modules) of ``run()``."""
    rooms: set = set()
    moves: list = []

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

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        sys.setprofile(hook)
        try:
            run()
        finally:
            sys.setprofile(None)
    return rooms, moves


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
            rooms, moves = trace(run)
            callers: dict = {}
            for a, b in moves:
                callers.setdefault(b, set()).add(a)
            multi = {b: v for b, v in callers.items() if len(v) > 1}
            print(
                f"{name}: {len(rooms)} modules, {len(set(moves))} moves between them, "
                f"{len(multi)} modules entered from more than one other module"
            )
            if args.show:
                for b, v in sorted(multi.items()):
                    print(f"    {b} <- {', '.join(sorted(x or '(outside)' for x in v))}")


if __name__ == "__main__":
    main()
