"""The example outputs quoted in README.md and docs/*.md, checked against the tool (issue 27, item 9).

An example is a fenced ``text`` block whose first line is ``$ sigprop ...``: each ``$`` line is a
command, the lines under it are quoted from its output (stdout and stderr, as a terminal shows
them).  A quoted line must appear in the output, in order; ``...`` on a line of its own skips
any number of lines, and ``...`` inside a line skips part of it.  Numbers are compared to the
precision they are printed with: a decimal number may differ by one unit in its last printed
digit (float32 kernels may round differently on another CPU, and a value on a rounding boundary
then prints one step away), as may an integer from 100 on (a float printed to three digits, such
as 766); an integer below 100 (an index, a count) must be equal, and a duration (a number
followed by " s") is not compared at all.

``python tests/docs/examples.py --update [FILE ...]`` runs every example and writes the tool's
lines over the quoted ones (each quoted line is replaced by the output line it matches, its
elisions kept), so that the docs are regenerated from the tool, not edited by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```text\n(\$ sigprop .*?)^```", re.S | re.M)
NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:e[-+]?\d+)?"
ELIDED = "..."


@dataclass
class Example:
    path: Path
    command: str
    quoted: list[str] = field(default_factory=list)
    #: (start, end) character offsets of each quoted line in the file
    spans: list[tuple[int, int]] = field(default_factory=list)


def examples(paths=DOCS) -> list[Example]:
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            pos = m.start(1)
            for line in m.group(1).splitlines(keepends=True):
                body = line.rstrip("\n")
                if body.startswith("$ "):
                    out.append(Example(path, body[2:]))
                elif body.strip() and body.strip() != ELIDED:
                    out[-1].quoted.append(body.rstrip())
                    out[-1].spans.append((pos, pos + len(body)))
                pos += len(line)
    return out


def run(example: Example, cwd: Path) -> list[str]:
    """The command's output lines (stderr merged, as a terminal shows them), on the CPU."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("COLUMNS", None)
    args = shlex.split(example.command)
    exe = Path(sys.executable).with_name("sigprop")
    proc = subprocess.run(
        [str(exe) if exe.exists() else "sigprop", *args[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return [line.rstrip() for line in (proc.stderr + proc.stdout).splitlines()]


def _pattern(fragment: str) -> tuple[re.Pattern, list[str]]:
    """A regex for one fragment of a quoted line (numbers captured, whitespace loose) and its numbers."""
    parts = re.split(f"({NUMBER})", fragment.strip())
    regex, numbers = "", []
    for i, part in enumerate(parts):
        if i % 2:
            regex += rf"(?<![\d.])({NUMBER})(?![\d])"  # a whole number: "1" never matches inside "21"
            numbers.append(part)
        else:
            regex += (
                r"\s+".join(re.escape(w) for w in part.split(" "))
                if part.strip()
                else (r"\s*" if part else "")
            )
    return re.compile(regex), numbers


def _close(quoted: str, actual: str, after: str) -> bool:
    """Equal to the printed precision (module docstring)."""
    if re.match(r"\s*s\b", after):  # a duration
        return True
    if re.fullmatch(
        r"[-+]?\d+", quoted
    ):  # below 100 a count or an index; from 100 also a float printed to 3 digits
        return quoted == actual or (
            abs(int(quoted)) >= 100
            and re.fullmatch(r"[-+]?\d+", actual) is not None
            and abs(int(quoted) - int(actual)) <= 1
        )
    mantissa = quoted.lower().split("e")[0]
    exponent = int(quoted.lower().split("e")[1]) if "e" in quoted.lower() else 0
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0 ** (exponent - decimals)
    return abs(float(quoted) - float(actual)) <= unit * (1 + 1e-9)


def match_line(quoted: str, line: str) -> list[tuple[int, int]] | None:
    """Where each fragment of ``quoted`` stands in ``line`` (spans), or None."""
    spans, at = [], 0
    for fragment in [f for f in quoted.split(ELIDED)]:
        if not fragment.strip():
            continue
        pattern, numbers = _pattern(fragment)
        found = None
        for m in pattern.finditer(line, at):
            if all(_close(q, a, line[m.end(k + 1) :]) for k, (q, a) in enumerate(zip(numbers, m.groups()))):
                found = m
                break
        if found is None:
            return None
        spans.append(found.span())
        at = found.end()
    return spans


def compare(
    example: Example, lines: list[str]
) -> tuple[list[str], list[tuple[int, list[tuple[int, int]]] | None]]:
    """(problems, per quoted line the index of the output line it matched and the fragment spans)."""
    problems, matches, at = [], [], 0
    for q in example.quoted:
        for i in range(at, len(lines)):
            spans = match_line(q, lines[i])
            if spans is not None:
                matches.append((i, spans))
                at = i + 1
                break
        else:
            matches.append(None)
            near = max(lines[at:] or [""], key=lambda l: _similarity(q, l))
            problems.append(
                f"{example.path.name}: `{example.command}`: not in its output (in order):\n  quoted: {q}\n  "
                f"nearest: {near}"
            )
    return problems, matches


def _same_integers(quoted: str, line: str) -> bool:
    """The line has the quoted line's words and its integers (a table row's index, a width) in
    place, decimals free: the line to write over it."""
    free = re.sub(r"(?<![\d.])(\d+\.\d*|\d*\.\d+)(e[-+]?\d+)?|(?<= )[=·≠~](?= |$)", "...", quoted)
    return match_line(free, line) is not None


def _similarity(a: str, b: str) -> int:
    sa = re.sub(NUMBER, "#", a).split()
    sb = set(re.sub(NUMBER, "#", b).split())
    return sum(w in sb for w in sa)


def update(paths) -> int:
    """Rewrite every quoted line with the output line it is closest to (elisions kept)."""
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "docs").symlink_to(ROOT / "docs")
        (Path(tmp) / "examples").symlink_to(ROOT / "examples")  # the docs' own example models
        for path in paths:
            text = path.read_text(encoding="utf-8")
            edits = []
            for ex in [e for e in examples([path])]:
                lines = run(ex, Path(tmp))
                at = 0
                for q, span in zip(ex.quoted, ex.spans):
                    best = max(
                        range(at, len(lines)),
                        key=lambda i: (_same_integers(q, lines[i]), _similarity(q, lines[i])),
                        default=None,
                    )
                    if best is None:
                        continue
                    new = _rewrite(q, lines[best])
                    if new != q:
                        edits.append((span, new))
                    at = best + 1
            for (a, b), new in sorted(edits, reverse=True):
                text = text[:a] + new + text[b:]
            changed += len(edits)
            path.write_text(text, encoding="utf-8")
    return changed


def _rewrite(quoted: str, line: str) -> str:
    """``quoted`` with each fragment replaced by the part of ``line`` with the same words (numbers
    free); a line without elisions becomes ``line``."""
    if ELIDED not in quoted.strip(" "):
        return line
    out, at = [], 0
    for fragment in quoted.split(ELIDED):
        if not fragment.strip():
            out.append(fragment)
            continue
        # decimals free, integers (indices, widths, stage numbers) and words as quoted
        skeleton = re.sub(
            r"(?<![\d.])[-+]?(\d+\.\d*|\d*\.\d+)(e[-+]?\d+)?|(?<![\d.])\d+e[-+]?\d+", "\0", fragment.strip()
        )
        regex = "".join(
            f"({NUMBER})" if c == "\0" else (r"\s+" if c == " " else re.escape(c)) for c in skeleton
        )
        m = re.compile(regex).search(line, at)
        if m is None:
            out.append(fragment)
            continue
        lead = fragment[: len(fragment) - len(fragment.lstrip())]
        trail = fragment[len(fragment.rstrip()) :]
        out.append(lead + m.group(0) + trail)
        at = m.end()
    return ELIDED.join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="write the tool's lines over the quoted ones")
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    paths = [p.resolve() for p in args.files] or DOCS
    if args.update:
        print(f"{update(paths)} quoted lines rewritten")
        return
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "docs").symlink_to(ROOT / "docs")
        (Path(tmp) / "examples").symlink_to(ROOT / "examples")  # the docs' own example models
        for ex in examples(paths):
            problems, _ = compare(ex, run(ex, Path(tmp)))
            for p in problems:
                print(p)
            bad += len(problems)
    print(f"{bad} quoted lines differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
