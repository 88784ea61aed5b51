"""Depth that reuses its weights: the moments between two states of one sample that a weight read
at several nodes correlates (docs/theory.md §16, "Depth that reuses its weights").  No torch here.

A model whose layers share a weight -- a looped block, ALBERT's one layer at every depth, layers
deep-copied and not re-drawn -- adds branches that are not independent: the same W applied to
g_l and g_m gives outputs whose inner product per unit is f <g_l, g_m>/n (f = ||W||^2/rows, the
dense map's factor), so a residual sum's second moment gains twice the summands' cross moment.
``Cross.pair(a, b)`` is that cross moment between the states of nodes a and b of one sample, per
element: (S, K), S = E[x_a(t) x_b(t)] at one token and K = E[x_a(t) x_b(s)] between two tokens,
in the infinite-width limit of a program of matrix products (Yang 2019's Netsor: the outputs of
one W at several inputs are jointly Gaussian with covariance f times the inputs' inner products,
independent of every other weight's outputs and of the inputs).  By the later node's op:

* a weight layer's output (``dense``, an attention's output projection) -- Gaussian: with a
  node that reads the same draw (``GraphNode.weight``), f times its inputs' cross moment; with
  anything else, by Stein's lemma, through what the other node is made of (0 for an output of
  another weight, an input, an embedding);
* sums, scalings, offsets, reshapes: linear; a norm: its gain over the token's RMS;
* an activation: with another activation, the two-input Gaussian quadrature
  (``theory.bivariate_moment``); with a Gaussian node, Stein: E[phi'(u)] times u's cross moment;
* an attention: a mean over its keys, weights E[P_ts] (uniform, or causal), on the values'
  cross moments -- the fluctuations of two attentions' weights taken as independent (their
  logits share W_q, W_k; at logit variance s^2 the neglected term is below (e^{s^2} - 1)/T of
  the same-token part).

Any other op on the way raises ``Unsupported``: the fold then stops there (measured only)."""

from __future__ import annotations

from sigprop import theory
from sigprop.maps.state import MAPS, law_of, merged

#: graph nodes that are no op's: the probe's inputs and the model's constants, each its own draw
MARKERS = {"input": "fresh", "const": "fresh"}
#: the roles linear in their inputs per token (``Cross._through``), both ways (``BackCross.share``)
LINEAR = frozenset({"linear", "sum", "offset"})


def role(nd) -> str | None:
    """Node ``nd``'s role in the cross moments (its op's record, ``OpMap.cross``; None: not read)."""
    return law_of(nd, "cross") or MARKERS.get(nd.op)  # markers have no record


def values(nd) -> int | None:
    """The input an attention mixes (``OpMap.values``): its other inputs (query, key) enter only
    through the logits, independent of every other share."""
    return law_of(nd, "values")


class Unsupported(Exception):
    """A node the cross moments do not read (its name and op)."""


def _mixing(params) -> tuple[float, float]:
    """An attention's mean weights as two numbers: w_d, the weight a query puts on its own token,
    and w_o, on another given token, each averaged over the queries (and the other tokens):
    1/T both for a bidirectional one; causal (query t reads t + 1 keys) H_T/T and (T - H_T)/(T (T
    - 1))."""
    T = max(int(params.tokens), 1)
    if not params.causal or T == 1:
        n = max(int(params.keys), 1)
        return 1.0 / n, 1.0 / n
    harmonic = sum(1.0 / (t + 1) for t in range(T))
    return harmonic / T, (T - harmonic) / (T * (T - 1))


def mix(sk: tuple[float, float], params) -> tuple[float, float]:
    """(S, K) of a state with the other side's values mixed by an attention's mean weights."""
    wd, wo = _mixing(params)
    S, K = sk
    return wd * S + (1.0 - wd) * K, wo * S + (1.0 - wo) * K


class Cross:
    """The cross moments between nodes of one fold (``pair``), memoised; ``ancestors[i]``: the
    shared draws read at node i or upstream of it (a Gaussian node's cross moment with a node that
    has not read its draw is 0 at once)."""

    def __init__(self, fold, keys: frozenset, merged) -> None:
        # ``merged``: a state's parts as one (``state.merged``, passed in by the fold)
        self.fold, self.nodes, self.keys, self.merged = fold, fold.nodes, keys, merged
        self.memo: dict = {}
        self.ancestors: list[frozenset] = []
        for nd in self.nodes:
            up = frozenset().union(*(self.ancestors[j] for j in nd.inputs)) if nd.inputs else frozenset()
            self.ancestors.append(up | {nd.weight} if nd.weight in keys else up)

    def _state(self, i: int):
        st = self.fold.states[i]
        if st is None:
            raise Unsupported(f"{self.nodes[i].name} (no state)")
        return self.merged(st)

    def pair(self, a: int, b: int) -> tuple[float, float]:
        """(S, K) between nodes a and b (``Unsupported`` where an op on the way has no rule)."""
        if a == b:
            s = self._state(a)
            return s.q, s.tok
        if a < b:
            a, b = b, a
        got = self.memo.get((a, b))
        if got is None:
            got = self.memo[(a, b)] = self._pair(a, b)
        return got

    def _pair(self, a: int, b: int) -> tuple[float, float]:
        nd = self.nodes[a]
        r = role(nd)
        if r is None:
            raise Unsupported(f"{nd.name} ({nd.op})")
        if r == "fresh":  # its own draw, independent of every earlier node
            m = self._state(a).mean * self._state(b).mean
            return m, m
        if r in LINEAR:
            return self._through(a, b)
        if r == "mix":  # the values' cross moments, mixed over the keys
            return mix(self.pair(nd.inputs[values(nd)], b), nd.params)
        if r == "act":
            return self._activation(a, b)
        return self._gaussian(a, b)

    def factor(self, nd) -> float:
        """The multiple of its input a node linear in it holds, both ways (its record's
        ``factor``): 1 for a reshape, a sum or an offset, c for a scaling by c, a per-token norm's
        gain over the token's RMS; a batch norm has none here."""
        law = MAPS[nd.op].factor
        if law is None:
            return 1.0
        c = law(nd, self._state(nd.inputs[0]))
        if c is None:
            raise Unsupported(f"{nd.name} (batch statistics)")
        return c

    def _gaussian(self, a: int, b: int) -> tuple[float, float]:
        """Node a a weight's output (b earlier): with b of the same draw, f times the inputs' cross
        moment; else through what b is made of (Stein)."""
        nd, other = self.nodes[a], self.nodes[b]
        if nd.weight not in self.keys or nd.weight not in self.ancestors[b]:
            return 0.0, 0.0  # b has not read a's weight: a is independent of it, mean 0
        theirs = role(other)
        if theirs == "gaussian" and other.weight == nd.weight:
            rec = MAPS[nd.op]  # one draw read twice: its record's law on their inputs' moments
            S, K = self.pair(nd.inputs[rec.reads], other.inputs[rec.reads])
            return rec.draw(nd, other, S, K, False)
        if theirs in ("gaussian", "fresh"):
            return 0.0, 0.0  # another draw's output, or an input: independent of a's
        if theirs == "act":  # Stein: E[phi'(u)] times a's cross moment with u
            u = self._state(other.inputs[0])
            e = theory.derivative_mean(other.fn[1], u.mean, u.q)
            S, K = self.pair(a, other.inputs[0])
            return e * S, e * K
        if theirs == "mix":
            return mix(self.pair(a, other.inputs[values(other)]), other.params)
        return self._through(b, a)  # b linear in its inputs: its rule, a held

    def _through(self, x: int, other: int) -> tuple[float, float]:
        """The cross moment of node ``other`` with node x, x linear in its inputs (a reshape, a
        sum, a scaling, an offset, a per-token norm): x's rule applied to ``other``'s cross
        moments with x's inputs."""
        nd = self.nodes[x]
        r = role(nd)
        if r not in LINEAR:
            raise Unsupported(f"{nd.name} ({nd.op})")
        if r == "sum":
            parts = [self.pair(j, other) for j in nd.inputs]
            return sum(p[0] for p in parts), sum(p[1] for p in parts)
        S, K = self.pair(nd.inputs[0], other)
        if r == "offset":
            m = nd.bias * self._state(other).mean
            return S + m, K + m
        c = self.factor(nd)
        return c * S, c * K

    def _activation(self, a: int, b: int) -> tuple[float, float]:
        """phi(u) at node a: with an activation, the two-input quadrature at the same token (S)
        and at two tokens (K); with a Gaussian node or an input, Stein; else through b's inputs."""
        nd, other = self.nodes[a], self.nodes[b]
        u = self._state(nd.inputs[0])
        theirs = role(other)
        if theirs == "act":
            v = self._state(other.inputs[0])
            S, K = self.pair(nd.inputs[0], other.inputs[0])
            f = lambda c: theory.bivariate_moment(nd.fn[0], other.fn[0], u.mean, u.q, v.mean, v.q, c)
            return f(S), f(K)
        if theirs in ("gaussian", "fresh"):
            e = theory.derivative_mean(nd.fn[1], u.mean, u.q)
            y = self._state(b)
            m = self._state(a).mean * y.mean
            S, K = self.pair(nd.inputs[0], b)
            return e * (S - u.mean * y.mean) + m, e * (K - u.mean * y.mean) + m
        if theirs == "mix":
            return mix(self.pair(a, other.inputs[values(other)]), other.params)
        return self._through(b, a)


class BackCross:
    """The gradients' cross moments where weights are shared (docs/theory.md §16): under the
    gradient independence assumption -- exact here, the output's error being drawn independently
    (Yang 2020, Tensor Programs III) -- a node's gradient is a sum over its readers of W^T
    (gradient) for a weight layer (a Gaussian of its own, W^T drawn once for all its readers),
    phi'(x) (gradient) for an activation (phi' independent of the backward Gaussians), and a
    multiple of the reader's gradient for a sum, a scaling, a norm (its gain over the token's
    RMS) or an attention's values (a mean over its queries).  ``fork(i)``: the cross terms between
    node i's readers' shares, which a fold that sums its readers' r leaves out; an attention's
    query and key paths are taken as independent of every other share (their weights enter
    through the logits' fluctuations: below the values' path at the logit variances the attention
    maps cover)."""

    def __init__(self, fold, forward: Cross) -> None:
        self.fold, self.nodes, self.keys, self.fwd = fold, fold.nodes, forward.keys, forward
        n = len(self.nodes)
        self.readers: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for k, nd in enumerate(self.nodes):
            for pos, j in enumerate(nd.inputs):
                self.readers[j].append((k, pos))
        # the shared draws a node's gradient has passed through (at its readers or after them)
        self.after: list[frozenset] = [frozenset()] * n
        for i in range(n - 1, -1, -1):
            got = set()
            for k, _ in self.readers[i]:
                got |= self.after[k]
                if self.nodes[k].weight in self.keys:
                    got.add(self.nodes[k].weight)
            self.after[i] = frozenset(got)
        self.memo: dict = {}

    def total(self, i: int) -> tuple[float, float]:
        """The fold's gradient at node i (its readers' shares and their cross terms)."""
        g = self.fold.grads[i]
        if g is None or self.fold.poisoned[i] or len(g) != 1:
            raise Unsupported(f"{self.nodes[i].name} (its gradient)")
        return g[0][0], g[0][1]

    def grad(self, i: int, j: int) -> tuple[float, float]:
        """(S, K) between the gradients at nodes i and j: the earlier one's readers' shares."""
        if i == j:
            return self.total(i)
        a, b = min(i, j), max(i, j)
        key = ("B", a, b)
        if key not in self.memo:
            parts = [self.share(k, pos, a, b) for k, pos in self.readers[a]]
            self.memo[key] = (sum(p[0] for p in parts), sum(p[1] for p in parts))
        return self.memo[key]

    def share(self, k: int, pos: int, a: int, b: int) -> tuple[float, float]:
        """E[C . g_b], C the share of node a's gradient from its reader k (a's input ``pos``)."""
        nd = self.nodes[k]
        r = role(nd)
        if r in LINEAR:
            c = self.fwd.factor(nd)
            S, K = self.grad(k, b)
            return c * S, c * K
        if r == "act":
            return self._act(k, a, b)
        if values(nd) is not None and pos != values(nd):
            return 0.0, 0.0  # an attention's query and key paths: independent of every other share
        if r == "mix":
            return mix(self.grad(k, b), nd.params)
        if r == "gaussian":
            return self.gaussian(k, b)
        raise Unsupported(f"{nd.name} ({nd.op})")

    def gaussian(self, k: int, b: int) -> tuple[float, float]:
        """E[W_k^T g_k . g_b]: through b's readers, f_b times the gradients' cross moment at a
        reader of the same draw, 0 at another draw's."""
        w = self.nodes[k].weight
        if w not in self.keys or w not in self.after[b]:
            return 0.0, 0.0
        key = ("G", k, b)
        if key in self.memo:
            return self.memo[key]
        S = K = 0.0
        for k2, pos2 in self.readers[b]:
            other = self.nodes[k2]
            theirs = role(other)
            if theirs in LINEAR:
                c = self.fwd.factor(self.nodes[k2])
                s, t = self.gaussian(k, k2)
                s, t = c * s, c * t
            elif theirs == "act":
                x = self.fwd._state(b)
                e = theory.derivative_mean(other.fn[1], x.mean, x.q)
                s, t = self.gaussian(k, k2)
                s, t = e * s, e * t
            elif values(other) is not None and pos2 != values(other):
                s = t = 0.0
            elif theirs == "mix":
                s, t = mix(self.gaussian(k, k2), other.params)
            elif theirs == "gaussian":
                s, t = self.same(k, k2) if other.weight == w else (0.0, 0.0)
            else:
                raise Unsupported(f"{other.name} ({other.op})")
            S, K = S + s, K + t
        self.memo[key] = (S, K)
        return S, K

    def same(self, k: int, k2: int) -> tuple[float, float]:
        """E[W^T g_k . W^T g_k2], one draw W read at nodes k and k2: f_b times the gradients'
        cross moment (an attention's values: W_v^T mean_queries(W_o^T g), both sides mixed)."""
        nd = self.nodes[k]
        S, K = self.grad(k, k2)
        return MAPS[nd.op].draw(nd, self.nodes[k2], S, K, True)

    def _act(self, k: int, a: int, b: int) -> tuple[float, float]:
        """C = phi'(x_a) g_k against g_b: with b read by one activation only, E[phi'(x_a)
        phi'(x_b)] (the two-input quadrature at the forward cross moments) times the gradients'
        cross moment; with b read by no activation, E[phi'(x_a)] times it."""
        nd = self.nodes[k]
        x = self.fwd._state(a)
        rb = self.readers[b]
        if len(rb) == 1 and role(self.nodes[rb[0][0]]) == "act":
            k2 = rb[0][0]
            y = self.fwd._state(b)
            Sf, Kf = self.fwd.pair(a, b)
            f = lambda c: theory.bivariate_moment(nd.fn[1], self.nodes[k2].fn[1], x.mean, x.q, y.mean, y.q, c)
            S, K = self.grad(k, k2)
            return f(Sf) * S, f(Kf) * K
        if any(role(self.nodes[k2]) == "act" for k2, _ in rb):
            raise Unsupported(f"{self.nodes[b].name} (an activation among several readers)")
        e = theory.derivative_mean(nd.fn[1], x.mean, x.q)
        S, K = self.grad(k, b)
        return e * S, e * K

    def forks(self, i: int) -> bool:
        """Whether node i's readers' shares may correlate: two or more, a shared draw after each
        of two of them (a reader's own weight counted)."""
        rs = self.readers[i]
        if len(rs) < 2:
            return False
        seen = [self.after[k] | ({self.nodes[k].weight} & self.keys) for k, _ in rs]
        return any(seen[x] & seen[y] for x in range(len(seen)) for y in range(x + 1, len(seen)))

    def fork(self, i: int) -> tuple[float, float]:
        """Twice the cross moments between the shares node i's readers give it."""
        shares = self.readers[i]
        S = K = 0.0
        for n1 in range(len(shares)):
            for n2 in range(n1 + 1, len(shares)):
                s, t = self._between(shares[n1], shares[n2], i)
                S, K = S + 2.0 * s, K + 2.0 * t
        return S, K

    def _between(self, one, two, i: int) -> tuple[float, float]:
        """E[C_1 . C_2], two readers' shares of node i's gradient."""
        (k1, p1), (k2, p2) = one, two
        kinds = []
        for k, p in (one, two):
            r, v = role(self.nodes[k]), values(self.nodes[k])
            if v is not None and p != v:
                return 0.0, 0.0  # a query or key path
            kinds.append("lin" if r in LINEAR or r == "mix" else r)
        if kinds[1] == "lin" and kinds[0] != "lin":
            (k1, p1), (k2, p2), kinds = (k2, p2), (k1, p1), kinds[::-1]
        if kinds[0] == "lin":  # c g_k1 (or its mean over queries) against the other share
            S, K = self.share(k2, p2, i, k1)
            if role(self.nodes[k1]) == "mix":
                return mix((S, K), self.nodes[k1].params)
            c = self.fwd.factor(self.nodes[k1])
            return c * S, c * K
        if kinds == ["act", "act"]:
            raise Unsupported(f"{self.nodes[i].name} (read by two activations)")
        if "act" in kinds:  # phi'(x_i) g_act against W^T g: E[phi'] times it
            g, act = (k1, k2) if kinds[1] == "act" else (k2, k1)
            x = self.fwd._state(i)
            e = theory.derivative_mean(self.nodes[act].fn[1], x.mean, x.q)
            S, K = self.gaussian(g, act)
            return e * S, e * K
        w1, w2 = self.nodes[k1].weight, self.nodes[k2].weight
        return self.same(k1, k2) if w1 and w1 == w2 and w1 in self.keys else (0.0, 0.0)


def tangent(fold, fork: int, node: int) -> float | None:
    """E[x . (J x_fork)] per element: the moment of node ``node``'s state x with its response
    J x_fork to its upstream node ``fork``'s own state -- q of a branch made of weight layers
    and homogeneous activations, 0 through a normalisation (scale-invariant) -- by each op's
    ``OpMap.tangent`` along the nodes between them; None where an op on the way has none
    (docs/theory.md §15, "The centred residual stream").  Here, not on the ``Fold``: the ops'
    maps it calls read the fold's state (sigprop/maps/state.py) without calling back into it."""
    if node <= fork or fold.states[fork] is None:
        return None
    on_way = {node}  # the nodes between them: upstream of ``node``, after ``fork``
    for i in range(node, fork, -1):
        if i in on_way:
            on_way.update(j for j in fold.nodes[i].inputs if j >= fork)
    e: dict[int, float] = {fork: merged(fold.states[fork]).q}
    for i in sorted(on_way - {fork}):
        nd = fold.nodes[i]
        if not any(j in e for j in nd.inputs):
            continue  # does not move with the fork
        op = MAPS.get(nd.op)
        if op is None or op.tangent is None or fold.states[i] is None:
            return None
        got = op.tangent(nd, i, [e.get(j) for j in nd.inputs], fold)
        if got is None:
            return None
        e[i] = got
    return e.get(node)
