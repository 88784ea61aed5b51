"""Transformer edges (issue 66, item 4): a site that holds no node of the traced graph (an
eval-mode dropout: GPT-2's ``drop`` after its two embeddings, GPT-NeoX's ``emb_dropout``, the
ratios' reference site) passes on its input's prediction; the theory verdict is read at the
site nearest the end that has a prediction, naming those without; the key/value cache's note
names the outermost models only (Phi-3, Falcon: every layer holds the config)."""

from __future__ import annotations

import torch
import torch.nn as nn

import sigprop
from sigprop.model.trace import trace_graph

transformers = __import__("pytest").importorskip("transformers")


class Hidden(nn.Module):
    """A Hugging Face base model returning its last hidden state."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids).last_hidden_state


def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=32)
    return Hidden(transformers.GPT2Model(cfg))


def neox():
    cfg = transformers.GPTNeoXConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256, vocab_size=500,
        max_position_embeddings=32,
    )  # fmt: skip
    return Hidden(transformers.GPTNeoXModel(cfg))


def _probe(make):
    return sigprop.probe_module(model=make(), input_shape=(12,), vocab=500, inits="as-is", samples=32)


def test_gpt2_s_dropout_site_has_its_input_s_prediction():
    r = _probe(gpt2)
    run = r.runs[0]
    rows = {rec.name: rec for rec in run.layers}
    drop = rows["m.drop"].forward
    assert drop.predicted is not None and abs(drop.rms / drop.predicted - 1) < 0.06, (
        drop.rms,
        drop.predicted,
    )
    assert all(rec.forward.predicted is not None for rec in run.layers)
    assert run.agrees_with_theory


def test_neox_s_first_site_is_nodeless_and_every_site_is_predicted():
    """GPT-NeoX's first site is ``emb_dropout``, the ratios' reference: with no node it left every
    forward ratio without a prediction, and no note said why."""
    r = _probe(neox)
    run = r.runs[0]
    assert run.layers[0].name == "m.emb_dropout"
    for rec in run.layers:
        f = rec.forward
        assert f.predicted is not None and abs(f.rms / f.predicted - 1) < 0.06, (rec.name, f.rms, f.predicted)
    assert run.agrees_with_theory


def test_a_nodeless_site_between_two_states_reads_its_input():
    """The state a nodeless site passes on is the one the next site reads from outside itself,
    checked on the trace: GPT-2's drop is the sum of the two embeddings."""
    model = gpt2().eval()
    traced = trace_graph(model, torch.randint(0, 500, (2, 12)))
    sites = ["m.wte", "m.drop", "m.h.0"]
    drop = traced.where(sites)[1]
    # the state there: wte(ids) + wpe, a state plus a table -- directly where the export dropped the
    # eval-mode dropout (the probe's), through its identity node where it kept it
    state = traced.nodes[drop].inputs[0] if traced.nodes[drop].op == "identity" else drop
    assert traced.nodes[state].op == "offset"
    if "m.drop" in traced.last_in:  # the dropout kept: drop its site's nodes, as the probe's export does
        traced.last_in.pop("m.drop"), traced.first_in.pop("m.drop")
        assert traced.where(sites)[1] == drop  # the state h.0 reads from before it: the site's output


class _Sort(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


def test_the_theory_verdict_is_read_where_a_prediction_is():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), _Sort())
    r = sigprop.probe_module(model=model, input_shape=(32,), inits="as-is", samples=64)
    run = r.runs[0]
    forward = next(c for c in run.verdict_checks("theory") if c.name.startswith("RMS forward"))
    assert forward.name == "RMS forward ratio at site 1" and forward.passed
    assert "read at the site nearest 4 that has a prediction; none at 4" in forward.note
    from sigprop.report.common import gate_text

    assert "(read at the site nearest 4" in gate_text(forward)


def test_the_cache_note_names_the_outermost_model():
    cfg = transformers.Phi3Config(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128,
        vocab_size=500, max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    model = Hidden(transformers.Phi3Model(cfg))
    r = sigprop.probe_module(model=model, input_shape=(12,), vocab=500, inits="as-is", samples=8)
    notes = [n for n in r.config["theory_notes"] if "key/value cache" in n]
    assert len(notes) == 1 and "cache of 'm' off" in notes[0], notes
