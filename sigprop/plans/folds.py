"""The folds of a plan: each walks the nested steps once (``fold``) and composes one family of
the steps' maps -- the energy forward and backward (``predict``), the pair kernels
(``predict_correlation``), the Jacobian's moments (``predict_jacobian``, ``predict_density``).
No torch here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sigprop import theory
from sigprop.inits import InitScheme
from sigprop.plans.steps import (
    BatchNorm,
    Block,
    Record,
    Step,
    _Energy,
    _standardises,
    input_shape,
    layers,
    nest,
)


class NotDerived(Exception):
    """A fold meets a step whose map it does not compose (its words: which step)."""


def fold(items, f, state, reverse: bool = False):
    """The one walk of every fold: the nested steps (``nest``) in order (``reverse``: from the
    top), each paid the visit it declares (its ``visit``: ``f.layer`` for ``Linear`` and
    ``Conv``, ``f.record``, ``f.block`` for a ``Block`` -- the fold walks its branch as it
    needs --, ``f.batch_norm``) and the state handed on.  No fold dispatches on the step's type
    (neural-tangents' ``serial``: each layer's kernel_fn composed with the next's), and the walk
    does not call back into the step's module to be dispatched (one descent: the fold, then the
    step's maps)."""
    for it in reversed(items) if reverse else items:
        state = getattr(f, it.visit)(it, state)
    return state


# --------------------------------------------------------------------------------------------
# the fold: RMS ratios, branch ratios and branch-to-skip gains at every Record
# --------------------------------------------------------------------------------------------
@dataclass
class Prediction:
    """ln RMS ratios at every Record -- forward ||h||/||x|| (None: no closed form, e.g. d <= 2
    with a bias), backward relative to the top Record (None where a step has no backward map) --
    the ln RMS branch ratio ||alpha F(h)||/||h|| of every residual block (None likewise), and per
    block the branch-to-skip power ratios (forward, backward) that the finite-width spread reads
    (the backward one is the forward's where there is no backward map)."""

    ln_forward: list[float] | None
    ln_backward: list[float] | None
    ln_branch: list[float] | None
    gains: list[tuple[float, float]]


def predict(
    steps: Sequence[Step],
    scheme: InitScheme,
    x_energy=None,
    e_energy=None,
    gains_at_d: bool = False,
    weight_factor: float = 1.0,
) -> Prediction:
    """The composition of the steps' energy maps (docs/theory.md §3, §7, §11).

    Forward the state is (A, B): the input-driven map A[x] (linear in x's energy map) and the
    bias-driven map B; a weighted step maps both (``theory.conv_layer_energy``, halved by its
    ReLU) and adds its bias energy to B; a standardised step (``scheme.standardizes`` or batch
    norm) resets them to A = 0, B = its units (halved by a ReLU); a block sums the skip's maps
    (the identity, or the projection) and alpha^2 times the branch's -- the cross term vanishes
    in expectation, the branch's last layer being sign-symmetric.  E||h||^2/||x||^2 = sum A +
    sum B E[1/||x||^2], with 1/(d - 2) for x ~ N(0, I_d).  Backward (walking the steps in
    reverse) the gradient map is scattered back through each layer's transposed window (times
    row_sq / k^2), halved where the walk passes a ReLU, and a block sums the skip's and alpha^2
    times the branch's maps; a pre-activation Record (the MLP's dl/da^l) is read behind its
    layer's mask.  ``x_energy`` [H, W] / ``e_energy``: the prediction conditional on one given
    input / top error (a probe shares them across draws); by default the inputs and errors are
    N(0, I).  The forward branch-to-skip gains compare the two paths' energies as the ratios
    read them (the bias-driven parts weighted by E[1/||x||^2]); ``gains_at_d``: at the state's
    power with ||x||^2 = d instead (the dense ResNet's spread model, docs/theory.md §7; the two
    differ only with biases, by O(1/d)).  ``weight_factor``: the same net with every weight
    layer's output variance times that factor -- its rows' second moment, or a layer the init
    standardises, its output's; a batch norm after a layer undoes it -- the alternative the
    ``theory`` verdict must tell apart (``separation``, docs/theory.md §4)."""
    tree = nest(steps)
    C, H, W = input_shape(steps)
    if x_energy is None:
        x_energy = np.full((H, W), 1.0 / (H * W))
        log_inv_x2 = -math.log(C * H * W - 2) if C * H * W > 2 else math.inf
    else:
        log_inv_x2 = -math.log(float(x_energy.sum()))
    forward = _ForwardFold(scheme, weight_factor, log_inv_x2, C * H * W if gains_at_d else None)
    fold(tree, forward, (_Energy.of(x_energy / float(x_energy.sum())), _Energy(np.zeros((H, W)), -math.inf)))
    out_fwd = None if any(not math.isfinite(v) for v in forward.fwd) else forward.fwd
    if any(_standardises(st, scheme) for st in layers(steps)):
        # no backward map: the forward gains stand for both (docs/theory.md §7)
        return Prediction(out_fwd, None, None, [(g, g) for g in forward.gains])
    top = layers(steps)[-1].out_hw()
    d = _Energy.of(np.full(top, 1.0) if e_energy is None else np.asarray(e_energy, dtype=float))
    back = _BackwardFold(scheme, weight_factor)
    fold(tree, back, d, reverse=True)
    return Prediction(out_fwd, back.ratios(), forward.branch, list(zip(forward.gains, reversed(back.gains))))


class _ForwardFold:
    """``predict``'s forward fold: the state (A, B) through the tree (``nest``), each Record's ln
    RMS ratio (``fwd``), each block's ln branch ratio (``branch``) and forward branch-to-skip
    gain (``gains``).  E||h||^2/||x||^2 = sum A + sum B E[1/||x||^2] (``total``: the bias-driven
    part over ||x||^2; none: no E[1/||x||^2] needed -- it diverges for d <= 2, where only a
    bias-free net has a prediction); the gains at the state's power with ||x||^2 = d where
    ``d`` is given (``power``)."""

    def __init__(self, scheme: InitScheme, weight_factor: float, log_inv_x2: float, d: int | None) -> None:
        self.scheme, self.weight_factor, self.log_inv_x2, self.d = scheme, weight_factor, log_inv_x2, d
        self.fwd: list[float] = []
        self.branch: list[float] = []
        self.gains: list[float] = []

    def total(self, s) -> float:
        return s[0].ln if s[1].ln == -math.inf else theory.logaddexp(s[0].ln, s[1].ln + self.log_inv_x2)

    def power(self, s) -> float:
        return self.total(s) if self.d is None else theory.logaddexp(s[0].ln + math.log(self.d), s[1].ln)

    def record(self, it: Record, state):
        self.fwd.append(0.5 * self.total(state))
        return state

    def layer(self, it, state):
        return it.energy(state, self.scheme, self.weight_factor, it.relu)

    def batch_norm(self, it: BatchNorm, state):
        raise ValueError(
            "a BatchNorm step has no per-sample energy map (theory.bn_resnet_prediction predicts the BN net)"
        )

    def block(self, b: Block, state):
        """The skip's maps (the identity, or the projection) plus alpha^2 times the branch's: the
        cross term vanishes in expectation, the branch's last layer being sign-symmetric."""
        f = fold(b.inner, self, state)
        s = state
        close = b.close
        if close.projection is not None:
            s = close.projection.energy(state, self.scheme, self.weight_factor, relu=False)
        a2 = theory.safe_log(self.scheme.alpha(close.blocks_in_stage) ** 2)
        self.branch.append(0.5 * (a2 + self.total(f) - self.total(state)))
        self.gains.append(math.exp(min(a2 + self.power(f) - self.power(s), 700.0)))
        return (s[0].plus(f[0], a2), s[1].plus(f[1], a2))


class _BackwardFold:
    """``predict``'s backward fold: the gradient's energy map from the top through the tree in
    reverse, halved where the walk passes a ReLU, a block the skip's plus alpha^2 times the
    branch's; a pre-activation Record (the MLP's dl/da^l) read behind its layer's mask.  The ln
    RMS ratios at the Records relative to the top one (``ratios``), and each block's backward
    gain (``gains``, top first)."""

    HALF = theory.safe_log(0.5)

    def __init__(self, scheme: InitScheme, weight_factor: float) -> None:
        self.scheme, self.weight_factor = scheme, weight_factor
        self.bwd: list[float] = []
        self.gains: list[float] = []
        self.top, self.mask_done = True, False

    def ratios(self) -> list[float]:
        bwd = self.bwd[::-1]
        top_ln = bwd and bwd[-1]
        return [v - top_ln for v in bwd]

    def record(self, it: Record, d):
        if it.pre_activation:
            if not self.top:
                d = _Energy(d.m, d.ln + self.HALF)  # the mask of the ReLU this Record stands behind
            self.mask_done = True
        self.bwd.append(0.5 * d.ln)
        self.top = False
        return d

    def layer(self, it, d):
        if it.relu and not self.mask_done:
            d = _Energy(d.m, d.ln + self.HALF)
        self.mask_done = False
        return it.energy_back(d, self.scheme, self.weight_factor)

    def block(self, b: Block, d):
        close = b.close
        s = (
            d
            if close.projection is None
            else close.projection.energy_back(d, self.scheme, self.weight_factor)
        )
        self.mask_done = False  # the branch's last ReLU is its own
        f = fold(b.inner, self, d, reverse=True)
        a2 = theory.safe_log(self.scheme.alpha(close.blocks_in_stage) ** 2)
        self.gains.append(math.exp(min(a2 + f.ln - s.ln, 700.0)))
        self.mask_done = False
        return s.plus(f, a2)


#: the alternative a ``theory`` band must tell apart: every weight layer's variance off by this
#: factor, down and up (He's g = 1 against the proposed g = sqrt 2 in a ReLU net; docs/theory.md §4)
SEPARATION_FACTOR = 2.0


@dataclass
class Separation:
    """Per Record the ln shifts (down, up) of the predicted forward and backward ratios with every
    weight layer's variance divided and multiplied by ``SEPARATION_FACTOR`` (None where the
    prediction has none)."""

    forward: list[tuple[float, float]] | None
    backward: list[tuple[float, float]] | None

    @staticmethod
    def of(base: list | None, down: list | None, up: list | None) -> list[tuple[float, float]] | None:
        if not base or not down or not up:
            return None
        return [(d - b, u - b) for b, d, u in zip(base, down, up)]

    def span(self, direction: str, a: int, b: int) -> tuple[float, float] | None:
        """The shifts of the ratio of Record a to Record b (a stage ratio)."""
        rows = self.forward if direction == "forward" else self.backward
        if rows is None:
            return None
        return (rows[a][0] - rows[b][0], rows[a][1] - rows[b][1])


def separation(steps: Sequence[Step], scheme: InitScheme, pred: Prediction, by=None, **kw) -> Separation:
    """``pred``'s shifts with every weight layer's variance halved and doubled (``by``, the fold
    that made ``pred`` -- ``plans.graphs.graph_predict``, the engine's; ``predict`` by default --
    with ``weight_factor``; ``kw``: the keywords ``pred`` was made with)."""
    by = predict if by is None else by
    lo = by(steps, scheme, weight_factor=1.0 / SEPARATION_FACTOR, **kw)
    hi = by(steps, scheme, weight_factor=SEPARATION_FACTOR, **kw)
    return Separation(
        Separation.of(pred.ln_forward, lo.ln_forward, hi.ln_forward),
        Separation.of(pred.ln_backward, lo.ln_backward, hi.ln_backward),
    )


def predict_correlation(steps: Sequence[Step], scheme: InitScheme, c0: float, batch: int) -> list[float]:
    """The infinite-width cosine of two inputs' states at every Record, for inputs x_a, x_b ~
    N(0, I) of cosine c0 and equal norms (docs/theory.md §10, §11 "Correlations").

    The state is three per-position kernels: K_aa(p) = E sum_c h^a_{c,p} h^a_{c,p} (= K_bb), K_ab
    (the pair) and K_perp (two inputs of different pairs: what centring over a batch reads).  A
    weighted step gives each output channel pre-activations with second moments r/(c_in k^2)
    times the window sums of the kernels plus the bias variance; at infinite width they are
    jointly Gaussian, so a ReLU maps them by the arc-cosine law per position
    (``theory.relu_cosine_map``, Cho & Saul 2009); c_out channels sum.  A standardised step --
    a data-dependent layer, batch norm (``BatchNorm`` and a ReLU, or a conv's) -- centres and
    scales each unit over the batch of ``batch`` inputs made of pairs (``theory.standardized``).
    A block adds the skip's kernels and alpha^2 times the branch's (the cross terms vanish).
    The cosine at a Record is sum_p K_ab / sum_p K_aa."""
    C, H, W = input_shape(steps)
    ones = np.ones((H, W)) * C
    out: list[float] = []

    def cosine(k) -> float:
        aa = float(k[0].sum())
        return float(k[1].sum()) / aa if aa > 0 else math.nan

    class Pairs:
        """The three kernels through each step (``pair_kernels``: a layer's, a batch norm's)."""

        def record(self, it: Record, k):
            out.append(cosine(k))
            return k

        def layer(self, it, k):
            return it.pair_kernels(k, scheme, batch)

        batch_norm = layer

        def block(self, b: Block, k):
            f = fold(b.inner, self, k)
            close = b.close
            s = k if close.projection is None else close.projection.pair_kernels(k, scheme, batch, relu=False)
            a2 = scheme.alpha(close.blocks_in_stage) ** 2
            M = max(s[3], f[3] if a2 > 0 else -math.inf)
            ws, wf = math.exp(s[3] - M), (a2 * math.exp(f[3] - M) if a2 > 0 else 0.0)
            return tuple(ws * x + wf * y for x, y in zip(s[:3], f[:3])) + (M,)

    fold(nest(steps), Pairs(), (ones, c0 * ones, 0.0 * ones, 0.0))
    return out


# --------------------------------------------------------------------------------------------
# the input-output Jacobian's spectrum (sigprop/spectra.py; docs/theory.md §14)
# --------------------------------------------------------------------------------------------
def upto(steps: Sequence[Step], units: int) -> tuple:
    """The plan of its first ``units`` recorded states (a leading input Record kept): the steps
    up to the (units)-th Record after it."""
    lead = 1 if steps and isinstance(steps[0], Record) else 0
    seen = 0
    for i, st in enumerate(steps[lead:], start=lead):
        if isinstance(st, Record):
            seen += 1
            if seen == units:
                return tuple(steps[: i + 1])
    return tuple(steps)


def predict_jacobian(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectrumPrediction:
    """The large-width mean and variance of the eigenvalues of J J^T (J the Jacobian of the
    plan's last state in its input; docs/theory.md §14).  Dense layers compose by
    ``theory.chain_variance`` (any widths: each one's mean squared row norm, the scheme's, its
    ReLU's derivative moments and its directions' S-transform coefficient); a residual block with
    a dense branch multiplies the mean by g2 + a (g2 = 1 for an identity skip, else the
    projection's mean squared row norm) and adds ``theory.block_variance`` (a = alpha^2 times
    the branch's mean) as a layer of ratio d_out/d_in.  Other plans (convolutions, batch norm)
    take the mean from the backward map of
    ``predict`` where the input and the last state are recorded states (mean sigma^2 = the
    squared RMS backward ratio); their variance is not derived (``why`` says which step)."""

    def moments(st) -> tuple[float, float]:
        got = st.jacobian_moments(scheme)
        if isinstance(got, str):
            raise NotDerived(got)
        return got

    class Chain:
        """(mean, variance) of the Jacobian's squared singular values through each step."""

        def record(self, it: Record, state):
            return state

        def batch_norm(self, it: BatchNorm, state):
            raise NotDerived("batch norm")

        def layer(self, it, state):
            mean, v = state
            g2, s1 = moments(it)
            mu1, mu2 = theory.RELU_MU if it.relu else (1.0, 1.0)
            return mean * g2 * mu1, theory.chain_variance(v, it.role.fan_out / it.role.fan_in, mu1, mu2, s1)

        def block(self, b: Block, state):
            mean, v = state
            branch = fold(b.inner, self, (1.0, 0.0))
            close = b.close
            a = scheme.alpha(close.blocks_in_stage) ** 2 * branch[0]
            if close.projection is None:
                return mean * (1.0 + a), v + theory.block_variance(a, branch[1])
            g2, s1 = moments(close.projection)
            r = close.projection.role.fan_out / close.projection.role.fan_in
            # S^T S in the input space: the Gram of S^T (ratio 1/r)
            v_skip = theory.gram_variance(1.0 / r, s1)
            return mean * (g2 + a), r * v + theory.block_variance(a, branch[1], g2, r, v_skip)

    try:
        if scheme.moments is None or scheme.standardizes:
            raise NotDerived(f"init {scheme.name}")
        mean, v = fold(nest(steps), Chain(), (1.0, 0.0))
        return theory.SpectrumPrediction(mean, v * mean * mean)
    except NotDerived as exc:
        got = exc.args[0]
    mean = math.nan
    states = isinstance(steps[0], Record) and isinstance(steps[-1], Record) and not steps[-1].pre_activation
    if states and not scheme.standardizes and not any(isinstance(st, BatchNorm) for st in steps):
        back = predict(steps, scheme).ln_backward
        if back and back[0] is not None:
            mean = math.exp(2.0 * back[0])
    return theory.SpectrumPrediction(mean, None, f"the variance is not derived for {got} yet")


def predict_density(steps: Sequence[Step], scheme: InitScheme) -> theory.SpectralDensity | None:
    """The large-width eigenvalue density of J J^T for a chain of dense layers of any widths
    (``theory.free_density``: orthogonal or iid directions, ReLU or none); None for other plans
    (residual blocks, convolutions: their S-transforms are not composed here) or where the fixed
    point cannot be followed (a spectrum of atoms: one layer)."""
    if scheme.moments is None or scheme.standardizes:
        return None
    out = []

    class Chain:
        """Each dense layer's (row_sq, ReLU, S-transform coefficient, fan-in, fan-out)."""

        def record(self, it: Record, state):
            return state

        def layer(self, it, state):
            got = it.jacobian_moments(scheme)
            if isinstance(got, str):
                raise NotDerived(got)
            out.append((got[0], it.relu, got[1], it.role.fan_in, it.role.fan_out))

        def block(self, b: Block, state):
            raise NotDerived("residual blocks")

        batch_norm = block

    try:
        fold(nest(steps), Chain(), None)
    except NotDerived:
        return None
    return theory.free_density(out) if len(out) > 1 else None


# --------------------------------------------------------------------------------------------
# the finite-width spread (docs/theory.md §4, §7, §11)
# --------------------------------------------------------------------------------------------
@dataclass
class Spread:
    """The per-sample spread of ln(ratio) at every Record: its cumulants (drift below ln RMS,
    variance, third) from the input forward [R, 3] and from the top Record backward [R, 3]; per
    residual block the variance it adds forward and backward and its branch ratio's variance."""

    forward: np.ndarray
    backward: np.ndarray
    block_forward: list[float]
    block_backward: list[float]
    branch: list[float]

    @property
    def variances(self) -> tuple[np.ndarray, np.ndarray]:
        """The variance of ln(ratio) at every Record, forward and backward."""
        return self.forward[:, 1], self.backward[:, 1]


class _SpreadEvents:
    """``spread``'s visits, in the plan's order: each step's own law (``spread``), a block's
    from its branch (the ResNet step law, ``theory.resnet_step_variance``)."""

    def __init__(self, orthogonal: bool, gains) -> None:
        self.orthogonal, self.gains = orthogonal, gains
        self.blocks: list[tuple[float, float, float]] = []

    def record(self, it: Record, acc):
        return [*acc, ("record", it, None)]

    def layer(self, it, acc):
        return [*acc, ("layer", it, it.spread(self.orthogonal))]

    def batch_norm(self, it: BatchNorm, acc):
        return [*acc, ("bn", it, it.spread())]

    def block(self, b: Block, acc):
        """A block adds (4 g/d + g^2 v_branch + v_skip) / (4 (1 + g)^2) at its branch-to-skip
        power ratio g (``gains``, else 1/B_k: the proposed init's), its branch's power varying by
        the MLP law over its channels (``theory.branch_variance``), a projection's by 2/c_out, d
        the units of the block's output (forward) or input (backward); its branch ratio by a
        quarter of the branch's (docs/theory.md §7)."""
        k = len(self.blocks)
        inner = layers(b.inner)
        chans = [inner[0].channels_in] + [st.role.fan_out for st in inner]
        o = inner[0].law_orthogonal(self.orthogonal)
        v_s = 2.0 / chans[-1] if b.close.projection is not None else 0.0
        g_f, g_b = (1.0 / b.close.blocks_in_stage,) * 2 if self.gains is None else self.gains[k]
        # the branch's power: its layers' law and a batch norm's ReLU's (the BN net's W BN(h)^+:
        # 2/d + 3/d; until 0.17 its step law left the 3/d out, docs/theory.md §7)
        norms = fold(b.inner, _Norms(), 0.0)
        v_f = theory.branch_variance(chans, o) + norms
        f = theory.resnet_step_variance(g_f, v_f, v_s, inner[-1].units_out)
        v_b = theory.branch_variance(chans[::-1], o) + norms
        back = theory.resnet_step_variance(g_b, v_b, v_s, inner[0].units_in)
        self.blocks.append((f, back, v_f / 4.0))
        return [*acc, ("block", b, (0.0, f, 0.0), (0.0, back, 0.0))]


class _Norms:
    """The relative power variance a branch's batch norms add (``BatchNorm.power_variance``)."""

    def record(self, it, v):
        return v

    def layer(self, it, v):
        return v

    def batch_norm(self, it, v):
        return v + it.power_variance()

    def block(self, b, v):
        return fold(b.inner, self, v)


def _plus(a, b) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


def spread(steps: Sequence[Step], orthogonal: bool, gains=None) -> Spread:
    """The finite-width spread of every Record of a plan, composed from its steps' own laws
    (``spread``, ``spread_mask``, ``spread_back``) over the one walk: forward, each Record the
    sum of what the steps before it add; backward from the top Record, walking as ``predict``'s
    backward fold does -- a ReLU's mask where the walk passes it (a pre-activation Record stands
    behind its layer's), with the width of the layer above (the MLP's exact law: W^{l+1}^T then
    the mask of n_l units).  ``orthogonal``: the rows' law where a layer's applies it;
    ``gains``: each block's branch-to-skip power ratios (forward, backward; ``predict``'s
    ``gains``), None for the proposed init's 1/B_k.  Replaces the four recursions the kinds
    kept until 0.17 (the MLP's cumulants, the CNN's conv law, the ResNet's and the WRN's block
    laws; tests/closed_forms.py keeps them as the oracle)."""
    events = _SpreadEvents(orthogonal, gains)
    acc = fold(nest(steps), events, [])
    zero = (0.0, 0.0, 0.0)
    fwd, run = [], zero
    for kind, it, *adds in acc:
        if kind == "record":
            fwd.append(run)
        else:
            run = _plus(run, adds[0])
    bwd, run, top, mask_done, above = [], zero, True, False, None
    for i in reversed(range(len(acc))):
        kind, it, *adds = acc[i]
        if kind == "record":
            behind = acc[i - 1][1] if i and acc[i - 1][0] == "layer" else None
            if it.pre_activation and behind is not None:  # the layer whose mask it stands behind
                if not top:
                    run = _plus(run, behind.spread_mask(orthogonal, above or behind.role.fan_out))
                mask_done = True
            bwd.append(run)
            top = False
            continue
        if kind == "layer":
            if it.relu and not mask_done:
                run = _plus(run, it.spread_mask(orthogonal, above or it.role.fan_out))
            elif not it.relu:
                run = _plus(run, it.spread_back())
            above = it.role.fan_out
        else:
            run = _plus(run, adds[-1])
            if kind == "block":  # the width below it, for a ReLU layer's law under it
                above = layers(it.inner)[0].channels_in
        mask_done = False
    blocks = events.blocks
    return Spread(
        np.array(fwd).reshape(-1, 3),
        np.array(bwd[::-1]).reshape(-1, 3),
        [b[0] for b in blocks],
        [b[1] for b in blocks],
        [b[2] for b in blocks],
    )
