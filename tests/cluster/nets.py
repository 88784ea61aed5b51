"""A model factory for the cluster's module sweeps (imported by path on every worker)."""

import os

import torch.nn as nn


def make(depth: int = 2, width: int = 16, fail: bool = False, die: bool = False) -> nn.Module:
    """A ReLU MLP on 3 x 8 x 8 inputs; ``fail=True`` raises (a point that fails), ``die=True``
    ends the process that builds it (a point that kills its worker)."""
    if die:
        os._exit(3)
    if fail:
        raise ValueError("this configuration is asked to fail")
    layers = [nn.Flatten(), nn.Linear(3 * 8 * 8, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))
