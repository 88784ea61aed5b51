"""The synthetic networks described as data (STYLE.md layers: ``nets``).  No torch here.

A :class:`ResNetPlan` is everything about a residual network that is decided before any weight
is drawn: the residual-stream width of each stage, the hidden widths inside each block (drawn
from ``--width`` with the seed), which block opens a stage with a projection shortcut, and the
role of every layer (what the init registry needs to set its gain).  The engine runs a plan;
theory predicts from it; the report labels rows with it.

Architecture (Arpit et al. 2019, eq. 6, section 4 "Implementation details", footnote 4; WRN of Arpit et al. 2019, Figure 5):

    h^{b} = S_b h^{b-1} + alpha * F_b(h^{b-1}),   F_b = D x [WN-FC -> ReLU ->] WN-FC

with S_b the identity, except for the first block of stage k > 1, where S_b = P is a WN linear
projection that doubles the residual width (as the strided 1x1 shortcut of a WRN does with
channels) and F_b's first layer reads the old width and its last layer writes the new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sigprop.inits import LayerRole


@dataclass(frozen=True)
class Block:
    """Residual block ``index`` (1-based over the whole net) maps h^{index-1} to h^{index}."""

    index: int
    stage: int  # 1-based
    index_in_stage: int  # 0-based
    blocks_in_stage: int
    widths: tuple[int, ...]  # (d_in, n_1, ..., n_D, d_out): the branch's layer widths
    projection: bool  # the skip path is a WN linear projection d_in -> d_out

    @property
    def d_in(self) -> int:
        return self.widths[0]

    @property
    def d_out(self) -> int:
        return self.widths[-1]

    @property
    def depth(self) -> int:
        """D: the number of ReLU layers in the branch (the branch has D + 1 linear layers)."""
        return len(self.widths) - 2

    def branch_roles(self) -> list[LayerRole]:
        w = self.widths
        roles = []
        for j in range(1, len(w)):
            kind = "block_last" if j == len(w) - 1 else "relu"
            roles.append(LayerRole(w[j - 1], w[j], kind, self.blocks_in_stage, self.index_in_stage))
        return roles

    def projection_role(self) -> LayerRole | None:
        if not self.projection:
            return None
        return LayerRole(self.d_in, self.d_out, "projection", self.blocks_in_stage, self.index_in_stage)

    def layer_ids(self) -> list[int]:
        """Generator ids of the branch layers and (last) the projection: unique over the net and
        the same for every init (common random numbers)."""
        base = self.index * (self.depth + 2)
        return [base + j for j in range(self.depth + 2)]


@dataclass(frozen=True)
class ResNetPlan:
    dim: int
    stage_dims: tuple[int, ...]
    blocks: tuple[Block, ...]
    #: the BN net of De & Smith 2020, appendix C starts with a stem x^1 = W^0 BN(x^0)^+ (entry 1)
    stem: bool = False

    @property
    def stages(self) -> int:
        return len(self.stage_dims)

    def entry_dims(self) -> list[int]:
        """Width of h^0 .. h^{K B}."""
        return [self.dim] * (1 + self.stem) + [b.d_out for b in self.blocks]

    def entry_stages(self) -> list[int]:
        """Stage of the block that produced each entry (0 for the input h^0)."""
        return [0] + [1] * self.stem + [b.stage for b in self.blocks]

    def stage_span(self, k: int) -> tuple[int, int]:
        """(first, last) entry indices of stage k (1-based): h^first is the stage input."""
        idx = [b.index for b in self.blocks if b.stage == k]
        first = 0 if (k == 1 and self.stem) else idx[0] - 1
        return first, idx[-1]

    def hidden_widths(self) -> list[list[int]]:
        return [list(b.widths[1:-1]) for b in self.blocks]


def resnet_plan(dim: int, stages: int, blocks: int, block_depth: int, hidden: list[int], stem: bool = False) -> ResNetPlan:
    """Build the plan; ``hidden`` holds stages * blocks * block_depth widths, block by block.
    With ``stem`` (the BN net) entry 1 is the stem's output and block b produces entry b + 1."""
    if len(hidden) != stages * blocks * block_depth:
        raise ValueError("one hidden width per ReLU layer of every block")
    stage_dims = tuple(dim * 2**k for k in range(stages))
    out = []
    it = iter(hidden)
    index = int(stem)
    for k in range(stages):
        for j in range(blocks):
            index += 1
            d_out = stage_dims[k]
            d_in = stage_dims[k - 1] if (k > 0 and j == 0) else d_out
            widths = (d_in, *[next(it) for _ in range(block_depth)], d_out)
            out.append(Block(index, k + 1, j, blocks, widths, projection=d_in != d_out))
    return ResNetPlan(dim=dim, stage_dims=stage_dims, blocks=tuple(out), stem=stem)
