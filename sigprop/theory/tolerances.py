"""The tolerances every comparison of a measurement with its theory uses (one table, STYLE habit 9;
docs/theory.md, "finite-width spread")."""

from __future__ import annotations

import math

LN10 = math.log(10.0)

# --------------------------------------------------------------------------------------------
# Tolerances: the one table every comparison of measurement with theory uses (STYLE habit 9).
# --------------------------------------------------------------------------------------------
#: how many finite-width standard deviations a measured value may sit from its prediction
#: before a layer's status mark turns red (docs/theory.md, "finite-width spread").
Z_AGREEMENT = 3.0
#: the same for the ``--check`` gate.  3 sigma of the *per-sample* spread, which bounds the
#: spread of the sample mean across weight draws (docs/theory.md explains why).
Z_CHECK = 3.0
#: per-layer constant c in Var[ln(||h^l||^2/||h^{l-1}||^2)] ~= c / n_l for i.i.d. isotropic rows
#: (Gaussian, He, uniform): 3 from the fourth moment of a half-Gaussian + 2 from the chi-square
#: spread of the row projection (docs/theory.md).
SPREAD_C_GAUSSIAN = 5.0
#: the half-Gaussian's part alone: a ReLU after a batch norm (no row projection before it), whose
#: positive part's share of the power fluctuates by 3/n (docs/theory.md §7)
SPREAD_C_HALF_GAUSSIAN = 3.0
#: for orthogonal rows the projection spread is reduced to 2*(1 - n_out/n_in)^+ .
SPREAD_C_ORTHOGONAL_BASE = SPREAD_C_HALF_GAUSSIAN

# A traced model's theory band (docs/theory.md §15, "Which traced bands are a test"): the
# prediction is composed on each draw's own weights, so the band is the measurement's own
# standard error (z of them) plus the maps' stated accuracy.
#: the variance of a run's measured value across weight draws, as a share of one sample's
#: variance (ln RMS ratio or token cosine): measured over 32 draws on 11 models
#: (benchmarks/reliability.py: 0.03 to 1.0, median 0.15; docs/reliability.md)
DRAW_SHARE = 0.25
#: the accuracy the infinite-width maps are held to on a traced model, per direction: the RMS
#: ratio's relative error forward and backward, the token cosine's absolute error (issue 48's
#: and issue 50's bounds; docs/theory.md §15 lists where they are met)
MAP_ACCURACY_FORWARD = math.log(1.06)
MAP_ACCURACY_BACKWARD = math.log(1.10)
MAP_ACCURACY_COSINE = 0.05
#: a traced band's power (docs/theory.md §15, "A band's power"): the smallest relative miss of
#: the maps it catches in ``POWER_LEVEL`` of runs -- the band's half-width plus z_{0.9} = 1.2816
#: standard errors -- and the miss every band is asked to catch (issue 67: 25%); a band whose
#: power is wider is named under the table with the draws (--seeds) that would narrow it
POWER_LEVEL = 0.9
Z_POWER = 1.2815515655446004
POWER_TARGET_PERCENT = 25
POWER_TARGET = math.log(1.0 + POWER_TARGET_PERCENT / 100)
#: the draws from which a traced band reads the spread of the maps' miss across them instead of
#: (where wider than) the draw share's model: the miss per draw (measured over that draw's own
#: prediction) varies across draws from 0.04 to 5 times one sample's variance by model
#: (docs/reliability.md §8), so from 8 draws the run's own spread, with Student's t quantile at
#: the z's level for draws - 1 degrees of freedom (4.5 at 8 draws, 3.6 at 16)
EMPIRICAL_DRAWS = 8
