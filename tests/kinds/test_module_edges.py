"""The edges of ordinary user models (issue 37): what an external check and a new user hit in
0.10.1 -- stochastic ops left on, side heads read as the output, a sum of a node with itself,
leftover modules, wrong shapes, sizes, NaN weights, data that overflows the run's dtype, weights
init_ does not understand.  Each test failed on 0.10.1."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from walks import trace

import sigprop
from sigprop import api, specs
from sigprop.cli import main
from sigprop.errors import SigpropError
from sigprop.kinds.module import ModuleSpec
from sigprop.model.build import prepare
from sigprop.model.init import init_, init_notes


# --------------------------------------------------------------------------------------------
# item 1: no stochastic op during any probe
# --------------------------------------------------------------------------------------------
class Attention(nn.Module):
    """A block as a PyTorch user writes it: nn.MultiheadAttention (its dropout read from the
    module's training flag, not an nn.Dropout), a functional scaled_dot_product_attention with a
    dropout_p, F.dropout, a DropPath that draws a Bernoulli mask, and an RReLU (random slopes)."""

    def __init__(self, p: float = 0.5, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.mha = nn.MultiheadAttention(d, 4, dropout=p, batch_first=True)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mlp = nn.Linear(d, d)
        self.act = nn.RReLU()
        self.drop_path = DropPath(p)
        self.p = p

    def forward(self, x):
        h = self.inp(x)
        a, _ = self.mha(h, h, h)
        s = F.scaled_dot_product_attention(self.q(a), self.k(a), self.v(a), dropout_p=self.p)
        s = F.dropout(s, self.p, self.training)
        return s + self.drop_path(self.act(self.mlp(s)))


class DropPath(nn.Module):
    """timm's stochastic depth, written out: a per-sample Bernoulli mask in training mode."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


def _with(p: float):
    """The same weights (one seed) with dropout rate p everywhere."""

    def factory():
        torch.manual_seed(3)
        return Attention(p)

    return factory


def test_dropout_in_every_form_is_off_during_a_probe():
    """Dropout 0.5 in MHA, SDPA, F.dropout and a DropPath gives bit-identical forward and backward
    ratios to the same weights with 0, across seeds of the probe (0.10.1: MHA's site +40%, and
    the numbers moved with --seed).  The same for the spectrum and the curvature."""
    kw = dict(input_shape=(6, 16), sites="leaves", samples=8, device="cpu")
    a = sigprop.probe_module(model=_with(0.5), **kw)
    b = sigprop.probe_module(model=_with(0.0), **kw)
    for la, lb in zip(a.runs[0].layers, b.runs[0].layers):
        assert la.forward.rms == lb.forward.rms and la.backward.rms == lb.backward.rms
    sa = sigprop.spectrum(
        ModuleSpec(model=_with(0.5), input_shape=(6, 16)), specs.SpectrumSpec(samples=2, seeds=1)
    )
    sb = sigprop.spectrum(
        ModuleSpec(model=_with(0.0), input_shape=(6, 16)), specs.SpectrumSpec(samples=2, seeds=1)
    )
    assert sa.runs[0].draws[0]["mean"] == sb.runs[0].draws[0]["mean"]
    hs = specs.HessianSpec(samples=16, seeds=1, iters=5)
    ha = api.hessian(ModuleSpec(model=_with(0.5), input_shape=(6, 16)), hs)
    hb = api.hessian(ModuleSpec(model=_with(0.0), input_shape=(6, 16)), hs)
    assert ha.runs[0].draws[0].eigenvalue == hb.runs[0].draws[0].eigenvalue


def test_batch_norm_keeps_its_training_statistics():
    """Only stochastic ops are turned off: a batch norm still normalises over the probe's batch."""
    model = prepare(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)), "cpu", torch.float32)
    assert model[1].training and not model[2].training
    y = model(torch.randn(64, 4) * 5 + 3)
    assert y.mean(0).abs().max() < 1e-5


def test_a_model_that_draws_random_numbers_is_refused_naming_the_module(capsys, tmp_path):
    """Noise the probe cannot turn off (torch.randn_like in a forward): one line naming the call
    and the module, exit 2, nothing measured."""
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import torch, torch.nn as nn\n"
        "class Noisy(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.a = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        return self.a(x) + torch.randn_like(x)\n"
        "def net():\n    return nn.Sequential(nn.Linear(8, 8), Noisy())\n"
    )
    for cmd in (["module"], ["spectrum", "module"], ["hessian", "module"]):
        assert main([*cmd, f"{nets}:net", "--input-shape", "8", "--samples", "4"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "torch.randn_like in '1' (Noisy)" in err[0], err


# --------------------------------------------------------------------------------------------
# item 2: the output the error vectors enter is the one the verdict reads
# --------------------------------------------------------------------------------------------
class SideHead(nn.Module):
    """A dict output whose first tensor is the real output and a 1-unit side head beside it that
    receives no gradient -- its module registered last, so 0.10.1 read it as the end."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.out = nn.Linear(64, 32)
        self.side = nn.Linear(64, 1)

    def forward(self, x):
        h = self.body(x)
        return {"y": self.out(h), "aux": self.side(h).detach()}


def test_a_side_head_is_marked_and_never_read_by_a_verdict(capsys):
    r = sigprop.probe_module(model=SideHead, input_shape=(32,), samples=16, device="cpu")
    run = r.runs[0]
    side = run.layers[-1]
    assert side.name == "side" and side.off_path and side.backward.rms is None
    assert all(not l.off_path and l.backward.rms > 0 for l in run.layers[:-1])
    forward, backward = run.verdict_checks("preserved")
    assert forward.name == "forward ratio at site out" and backward.name == "backward ratio at site body.1"
    assert forward.log10_measured == pytest.approx(run.layers[-2].forward.log10_mean)
    notes = r.config["site_notes"]
    assert any("'y'" in n and "'aux'" in n for n in notes)
    assert any(n.startswith("off the output's path: side") for n in notes)
    assert r.to_dict()["runs"][0]["layers"][-1]["off_output_path"] is True
    assert (
        main(["module", "tests/kinds/test_module_edges.py:SideHead", "--input-shape", "32", "--samples", "8"])
        == 0
    )
    out = capsys.readouterr().out
    assert "off path" in out and "typical forward ratio at site out" in out


def test_berts_pooler_is_off_the_path_of_last_hidden_state():
    """Hugging Face's BERT returns last_hidden_state first; its pooler (the last auto site) is not
    on that path: marked, no backward ratio, the verdict reads the encoder's last layer."""
    transformers = pytest.importorskip("transformers")

    def bert():
        cfg = transformers.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100
        )
        return transformers.BertModel(cfg)

    r = sigprop.probe_module(model=bert, input_shape=(8,), vocab=100, samples=4, device="cpu")
    run = r.runs[0]
    assert [l.name for l in run.layers if l.off_path] == ["pooler"]
    assert [l.name for l in run.layers] == ["embeddings", "encoder.layer.0", "encoder.layer.1", "pooler"]
    # token ids into a stack of layers: read across them (issue 67), the pooler off the path unread
    assert run.verdict_checks("preserved")[0].name == (
        "forward ratio across the layers, encoder.layer.0 to encoder.layer.1 (2 layers)"
    )


# --------------------------------------------------------------------------------------------
# item 4: a sum of a node with itself
# --------------------------------------------------------------------------------------------
class Sums(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Linear(64, 64), nn.Linear(64, 64), how

    def forward(self, x):
        h = self.a(x)
        if self.how == "twice":
            s = h + h
        elif self.how == "scaled":
            s = h + 2 * h
        elif self.how == "halved":
            s = h / 2 + h
        else:  # shared: h and relu(h) share h with no weight layer between
            s = h + torch.relu(h)
        return self.b(s)


@pytest.mark.parametrize("how, factor", [("twice", 2.0), ("scaled", 3.0), ("halved", 1.5)])
def test_a_sum_of_a_node_with_itself_is_exact(how, factor):
    """h + c h is (1 + c) h: the traced prediction at b is (1 + c) times the one at a's output
    scaled by b (0.10.1 predicted sqrt(2) for h + h: two independent summands), and the measured
    ratios agree (256 samples: the prediction is the ratio's RMS; a Linear of width 64 moves one
    draw's RMS by a few percent, 10% asserted)."""
    r = sigprop.probe_module(
        model=lambda: Sums(how), input_shape=(64,), sites="a,b", samples=256, device="cpu"
    )
    a, b = r.runs[0].layers
    plain = sigprop.probe_module(
        model=lambda: Sums("twice"), input_shape=(64,), sites="a", samples=256, device="cpu"
    )
    assert a.forward.predicted == pytest.approx(plain.runs[0].layers[0].forward.predicted, rel=1e-12)
    assert b.forward.rms == pytest.approx(b.forward.predicted, rel=0.1)
    assert a.backward.rms == pytest.approx(a.backward.predicted, rel=0.1)
    # exact in the map: the sum is a scale node of factor^2 on h
    nodes, _, _ = trace(Sums(how), torch.randn(2, 64), [])
    scale = [nd for nd in nodes if nd.op == "scale" and nd.forward == pytest.approx(factor**2)]
    assert len(scale) == 1


def test_summands_sharing_a_node_without_a_weight_layer_are_named():
    r = sigprop.probe_module(model=lambda: Sums("shared"), input_shape=(64,), sites="a,b", samples=8)
    notes = r.config["theory_notes"]
    assert len(notes) == 1 and "summands that share a with no weight layer between" in notes[0]
    assert r.runs[0].layers[1].forward.predicted is None


def test_a_constant_offset_has_a_map():
    """h + a tensor of the model (a learned positional embedding) + a number: mean and mean
    square of the constant enter q (0.10.1: the tensor was mapped as the identity, silently)."""

    class Offset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(32, 32)
            self.pos = nn.Parameter(torch.full((8, 32), 0.5))

        def forward(self, x):
            return self.a(x) + self.pos + 1.0

    r = sigprop.probe_module(model=Offset, input_shape=(8, 32), sites="a", samples=4)
    nodes, _, _ = trace(Offset(), torch.randn(2, 8, 32), [])
    offsets = [(nd.bias, nd.forward) for nd in nodes if nd.op == "offset"]
    assert offsets == [(0.5, 0.25), (1.0, 1.0)]
    assert not r.config["theory_notes"]


# --------------------------------------------------------------------------------------------
# item 5: a module the forward never calls; parameters that do not reach the loss
# --------------------------------------------------------------------------------------------
class Leftover(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.old_head = nn.Linear(16, 5)

    def forward(self, x):
        return self.body(x)


def test_auto_sites_skip_a_module_the_forward_never_calls():
    r = sigprop.probe_module(model=Leftover, input_shape=(16,), samples=8, device="cpu")
    assert [l.name for l in r.runs[0].layers] == ["body.1", "body.2"]
    assert r.config["site_notes"] == ["not measured: old_head (never called by the model's forward)"]
    with pytest.raises(SigpropError, match="'old_head' is never called") as e:
        sigprop.probe_module(model=Leftover, input_shape=(16,), sites="old_head", samples=4)
    assert e.value.field == "sites"


@pytest.mark.parametrize("model", [Leftover, SideHead])
def test_the_curvature_leaves_out_parameters_that_do_not_reach_the_loss(model):
    """hessian module on a leftover head or a detached side output (0.10.1: "internal error: the
    differentiated tensor appears to not have been used in the graph"): those parameters are left
    out and named; the Hessian is taken over the rest."""
    shape = (16,) if model is Leftover else (32,)
    r = api.hessian(
        ModuleSpec(model=model, input_shape=shape), specs.HessianSpec(samples=8, seeds=1, iters=5)
    )
    note = [n for n in r.config["model_notes"] if "do not reach the loss" in n]
    left = "old_head.weight, old_head.bias" if model is Leftover else "side.weight, side.bias"
    assert len(note) == 1 and note[0].endswith(left)
    every = sum(p.numel() for p in model().parameters())
    head = sum(p.numel() for n, p in model().named_parameters() if n.split(".")[0] in ("old_head", "side"))
    width = 16 if model is Leftover else 32
    assert r.environment["parameters"] == every - head + width * 10 + 10


# --------------------------------------------------------------------------------------------
# items 6-9: wrong shapes, sizes that cannot fit, NaN weights, data that overflows
# --------------------------------------------------------------------------------------------
@pytest.fixture
def nets(tmp_path):
    p = tmp_path / "nets.py"
    p.write_text(
        "import torch, torch.nn as nn\n"
        "def plain():\n    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))\n"
        "def nan():\n    m = plain()\n    with torch.no_grad():\n        m[0].weight[0, 0] = float('nan')\n"
        "    return m\n"
    )
    return p


COMMANDS = (["module"], ["spectrum", "module"], ["hessian", "module"])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and "internal error" not in err[0], err
    return err[0]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_a_wrong_input_shape_is_one_line_on_every_path(nets, cmd, capsys):
    assert main([*cmd, f"{nets}:plain", "--input-shape", "33", "--samples", "4"]) == 2
    assert "--input-shape" in _one_line(capsys)


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize(
    "size", [["--input-shape", "3,100000,100000"], ["--input-shape", "32", "--samples", "100000000"]]
)
def test_sizes_that_cannot_fit_are_refused_before_the_run(nets, cmd, size, capsys):
    argv = [*cmd, f"{nets}:plain", *size]
    if cmd[0] == "hessian" and "--samples" not in size:
        argv += ["--samples", "64"]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "GiB" in line and ("--input-shape" in line or "--samples" in line)


@pytest.mark.parametrize(
    "argv",
    [
        ["mlp", "--depth", "100000000", "--width", "4", "--samples", "2"],
        ["hessian", "mlp", "--depth", "100000000"],
        ["spectrum", "resnet", "--blocks", "100000000"],
    ],
)
def test_a_plan_too_deep_for_the_host_is_refused_before_it_is_built(argv, capsys):
    """0.10.1 counted the width, not the depth: an OOM kill at 22.8 GB, no message."""
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "GiB" in line and ("--depth" in line or "--blocks" in line)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_nan_weights_are_one_line_the_same_on_every_path(nets, cmd, capsys):
    assert main([*cmd, f"{nets}:nan", "--input-shape", "32", "--samples", "4"]) == 2
    line = _one_line(capsys)
    assert "init 'as-is': the model's weights: 0.weight holds NaN or inf (1 of 2048 entries)" in line


@pytest.mark.parametrize("cmd", COMMANDS)
def test_data_that_overflows_the_run_dtype_is_refused(nets, cmd, tmp_path, capsys):
    """Finite in the file (float64), inf in float32: 0.10.1 let it through and printed plausible
    numbers with exit 0."""
    path = tmp_path / "big.npz"
    np.savez(
        path, x=np.random.default_rng(0).standard_normal((16, 32)) * 1e40, y=np.zeros(16, dtype=np.int64)
    )
    assert main([*cmd, f"{nets}:plain", "--input-shape", "32", "--data", str(path), "--samples", "8"]) == 2
    line = _one_line(capsys)
    assert "--data" in line and "overflows float32" in line and "--dtype float64" in line
    assert (
        main(
            [
                *cmd,
                f"{nets}:plain",
                "--input-shape",
                "32",
                "--data",
                str(path),
                "--samples",
                "8",
                "--dtype",
                "float64",
            ]
            + (["--iters", "3"] if cmd[0] == "hessian" else [])
        )
        == 0
    )
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# item 10: every parameter set or named; what init_ assumed without a graph
# --------------------------------------------------------------------------------------------
def test_init_names_every_parameter_it_leaves():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
            self.norm = nn.LayerNorm(16)
            self.out = nn.Linear(16, 16)

        def forward(self, ids):
            h = self.emb(ids)
            a, _ = self.attn(h, h, h)
            return self.out(self.norm(a))

    model = Mixed()
    records = init_(model, "proposed")
    named = {r.name: r for r in records}
    assert named["out"].set and named["attn.out_proj"].set
    # issue 39: the attention's q, k, v projections and the embedding are drawn too
    assert named["attn"].set and named["attn"].note == "q, k, v projections"
    assert named["emb"].set and named["emb"].note == "rows N(0, I)"
    assert named["norm"].set and named["norm"].note == "gain 1, offset 0"
    # every parameter is set or named
    covered = {f"{r.name}.{p}" for r in records if not r.set for p in r.parameters}
    covered |= {
        f"{r.name}.{p}"
        for r in records
        if r.set
        for p, _ in model.get_submodule(r.name).named_parameters(recurse=False)
    }
    assert covered == {n for n, _ in model.named_parameters()}
    assert init_notes("proposed", records) == []  # nothing left


def test_what_init_assumed_without_a_graph_is_said(capsys, tmp_path):
    """A model no graph can be read of: every Linear keeps the model's own weights (0.18.0 drew them
    as ReLU layers: a guessed gain), named under the table and in the JSON (0.10.1: only in a
    per-layer record nobody printed)."""

    class Untraceable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
                return self.b(torch.relu(self.a(x)))
            return self.b(torch.relu(self.a(x)))

    r = sigprop.probe_module(model=Untraceable, input_shape=(8,), inits="proposed", samples=4)
    notes = [n for n in r.config["init_notes"] if "roles not read" in n]
    assert len(notes) == 1 and notes[0].startswith(
        "init 'proposed': 2 of 2 weight layers' roles not read (torch.fx"
    )
    assert "kept as the model drew them" in notes[0] and notes[0].endswith(": a, b")
    assert math.isfinite(r.runs[0].layers[-1].forward.rms)


@pytest.mark.parametrize(
    "family, field, call",
    [
        ("probe", "stream", lambda m: api.probe(m, specs.ProbeSpec(samples=4, device="cpu", stream=True))),
        ("probe", "graphs", lambda m: api.probe(m, specs.ProbeSpec(samples=4, device="cpu", graphs=True))),
        ("probe", "fuse", lambda m: api.probe(m, specs.ProbeSpec(samples=4, device="cpu", fuse=True))),
        (
            "probe",
            "correlations",
            lambda m: api.probe(m, specs.ProbeSpec(samples=4, device="cpu", correlations=(0.5,))),
        ),
        (
            "hessian",
            "head",
            lambda m: api.hessian(m, specs.HessianSpec(samples=4, device="cpu", head="init")),
        ),
        (
            "spectrum",
            "depths",
            lambda m: api.spectrum(m, specs.SpectrumSpec(samples=4, device="cpu", depths=(1, 2))),
        ),
    ],
)
def test_the_api_refuses_in_the_words_the_kind_declares(family, field, call):
    """A model's refusals are declared once (``ModuleKind.refuses``, which the CLI's help and
    errors read); the engine raises the same words through the API (0.16.0 wrote them again in
    engines/model.py)."""
    from sigprop import kinds

    model = ModuleSpec(model=lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU()), input_shape=(4,))
    with pytest.raises(SigpropError) as got:
        call(model)
    assert got.value.field == field
    assert got.value.message.startswith(kinds.get("module").refuses[family][field])


def test_the_module_kind_keeps_no_state_the_engine_fills():
    """The model engine builds the run's record of what it found (``engines.model.ModulePlan``),
    says the sites off the output's path there, and hands it to the kind: the kind neither
    creates it empty for the engine to fill, nor adds to it while assembling (issue 51 item 2)."""
    from sigprop import kinds
    from sigprop.kinds.base import Kind

    kind = type(kinds.get("module"))
    assert kind.plan is Kind.plan and kind.memory is Kind.memory
    r = sigprop.probe_module(model=SideHead, input_shape=(32,), samples=8, inits=["as-is", "proposed"])
    notes = [n for n in r.config["site_notes"] if n.startswith("off the output's path")]
    assert notes == [
        "off the output's path: side (the output's gradient does not reach it: no backward "
        "ratio, read by no verdict)"
    ]
