"""The Haar draws of consecutive dense layers of one shape in chunks (CUDA): one batched call per
chunk, each chunk one step of the runner with its own generators.  ``w`` is the walk
(sigprop/walker/walk.py); a unit takes part when it says ``haar_chunks`` (a dense layer does)."""

from __future__ import annotations

from functools import partial

import torch

from sigprop.inits import LayerRole
from sigprop.kernels import device, sampling


class HaarChunks:
    """Directions of K consecutive dense layers of one shape drawn in one batched Haar call
    (CUDA: ``kernels.sampling.haar_chunk`` says when, and how many), each chunk one step of the runner
    with its own generators (one ``LayerGenerators`` row per layer of a chunk).  Covers layers
    2..L (layer 1 reads the input width)."""

    def __init__(self, w, K: int) -> None:
        self.K, self.L = K, len(w.units)
        self.rows = [sampling.LayerGenerators(w.seed, w.draws, w.device) for _ in range(K)]
        self.current: dict = {}

    @classmethod
    def maybe(cls, w) -> "HaarChunks | None":
        if not all(getattr(u, "haar_chunks", False) for u in w.units):
            return None
        widths = [w.units[0].role.fan_in] + [u.role.fan_out for u in w.units]
        K = sampling.haar_chunk(
            w.scheme, widths, w.S, w.device, torch.finfo(w.dtype).bits // 8, device.available_bytes(w.device)
        )
        return cls(w, K) if K else None

    def generators(self) -> list:
        return [g for row in self.rows for g in row.gens]

    def covers(self, layer: int) -> bool:
        return layer >= 2

    def span(self, layer: int) -> tuple[int, int]:
        """(first layer, layer count) of the chunk holding ``layer``."""
        first = 2 + ((layer - 2) // self.K) * self.K
        return first, min(self.K, self.L - first + 1)

    def _draw(self, anchor, w, role: LayerRole, count: int):
        gens = [row.gens for row in self.rows[:count]]
        g = torch.stack(
            [torch.stack([sampling.gaussian(role, gen, w.device, w.dtype) for gen in row]) for row in gens]
        )
        p = sampling.haar_params(w.scheme, role, g)
        return {"v": p.v, "g": p.g, "scale": p.scale}

    def step_keys(self, w) -> list:
        """The runner's keys of the chunks' steps, one per chunk each time a walk enters it
        (forward; and backward when streaming)."""
        spans = {self.span(layer) for layer in range(2, self.L + 1)}
        keys = [self._key(w, first, count) for first, count in sorted(spans)]
        return keys * (1 + bool(w.stream and w.keep))

    def _key(self, w, first: int, count: int) -> tuple:
        return ("chunk", w.units[first - 1].role, count)

    def _run(self, w, layer: int) -> None:
        first, count = self.span(layer)
        role = w.units[first - 1].role
        self.current = w.runner.run(
            self._key(w, first, count),
            partial(self._draw, w=w, role=role, count=count),
            {"anchor": w.ref},
            sampling.chunk_reseeder(self.rows, first, count),
        )

    def forward(self, w, layer: int) -> tuple[dict, int]:
        """The chunk holding ``layer`` (drawn when the walk enters it) and the layer's index in it."""
        first, _ = self.span(layer)
        if layer == first:
            self._run(w, layer)
        return self.current, layer - first

    def backward(self, w, layer: int) -> torch.Tensor:
        """Streaming: the layer's directions, the chunk redrawn when the walk enters it from above."""
        first, count = self.span(layer)
        if layer == first + count - 1:
            self._run(w, layer)
        return self.current["v"][layer - first]
