"""sigprop's own nets as torch modules at a width, for the coordinate check (a kind names its
builder here: sigprop/kinds/).  Plain weights, no weight normalization: the abc-parametrizations
are stated for plain weights (Yang & Hu 2021, section 3); WN's gain would hold each layer's
scale whatever the draw."""

from __future__ import annotations

import torch.nn as nn


def relu_mlp(width: int, depth: int, input_dim: int, classes: int, bias: bool = True) -> nn.Module:
    """``depth`` Linear layers (input_dim -> width -> ... -> classes) with a ReLU between: the
    MLP of Yang et al. (2021)'s coordinate checks (their Figure 5's MLP)."""
    dims = [input_dim] + [width] * (depth - 1) + [classes]
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(dims[i], dims[i + 1], bias=bias))
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def relu_cnn(width: int, depth: int, channels_in: int, classes: int) -> nn.Module:
    """``depth`` 3 x 3 convs (channels_in -> width -> ... -> width, stride 1, padding 1) with a
    ReLU after each, a global average pool and a linear readout to ``classes``: the CNN of Yang et
    al. (2021)'s coordinate checks, plain."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Conv2d(channels_in if i == 0 else width, width, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
