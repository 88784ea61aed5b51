"""Every tensor sigprop turns into numpy is moved to the host first.

``Tensor.numpy()`` raises on a CUDA tensor ("can't convert cuda:0 device type tensor to numpy"),
so a ``.numpy()`` without ``.cpu()`` before it passes every CPU test and fails on the GPU: the
rotary tables of a Llama model (``ops/decoder._table``) did, found by the CUDA suite on an H100
(2026-11-28), where ``sigprop module examples/my_nets.py:llama`` stopped with an internal error.
CI has no GPU, so this reads the source: each ``.numpy()`` call's receiver chain must contain
``.cpu()`` (a no-op for a host tensor)."""

from __future__ import annotations

import ast
from pathlib import Path

import sigprop

ROOT = Path(sigprop.__file__).resolve().parent


def _chain_has_cpu(node: ast.AST) -> bool:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "cpu":
            return True
        node = node.func.value
    return False


def _unmoved(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "numpy"
            and not node.args
            and not _chain_has_cpu(node.func.value)
        ):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_a_numpy_read_without_cpu():
    assert _unmoved("v.expand(3).numpy()\n") == [1]
    assert _unmoved("v.expand(3).cpu().numpy()\nw.detach().cpu().double().numpy()\n") == []


def test_every_numpy_read_in_sigprop_is_on_the_host():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in sorted(ROOT.rglob("*.py"))
        if (lines := _unmoved(p.read_text()))
    }
    assert found == {}
