"""Real model zoos at random init (issue 29, item 5c; the ``[models]`` extra, which CI installs):
MONAI's DenseNet121, UNet, SegResNet and ViT and Hugging Face's BERT and GPT-2 from small configs
(nothing downloaded) each probe without error, as-is and with the paper's init, every ratio finite
or an honest zero, with the table rendered.  What they show is in docs/quickstart.md."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

import sigprop
from sigprop import report

monai_nets = pytest.importorskip("monai.networks.nets")
transformers = pytest.importorskip("transformers")

MONAI = {
    "DenseNet121": (
        lambda: monai_nets.DenseNet121(spatial_dims=2, in_channels=3, out_channels=10),
        (3, 32, 32),
    ),
    "UNet": (
        lambda: monai_nets.UNet(
            spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2)
        ),
        (1, 32, 32),
    ),
    "SegResNet": (
        lambda: monai_nets.SegResNet(spatial_dims=2, init_filters=8, in_channels=1, out_channels=2),
        (1, 32, 32),
    ),
    "ViT": (
        lambda: monai_nets.ViT(
            in_channels=3,
            img_size=(32, 32),
            patch_size=(8, 8),
            hidden_size=48,
            mlp_dim=96,
            num_layers=2,
            num_heads=4,
            spatial_dims=2,
        ),
        (3, 32, 32),
    ),
}


def bert():
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100
    )
    return transformers.BertModel(cfg)


def gpt2():
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=100, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(cfg)


def _check(r) -> None:
    for run in r.runs:
        assert len(run.layers) >= 2
        for layer in run.layers:
            assert (
                layer.forward.rms is not None and math.isfinite(layer.forward.rms) and layer.forward.rms > 0
            )
            assert layer.backward.dead_fraction in (0.0, 1.0)  # a site off the output's path reads 0
    assert report.to_csv(r).splitlines()[0].startswith("init,layer,site,width")
    report.render_table(r, Console(file=io.StringIO(), width=160))


#: the MONAI nets whose every op has a moment map (ViT: fx cannot trace it)
TRACED = ("DenseNet121", "SegResNet", "UNet")


@pytest.mark.parametrize("name", sorted(MONAI))
def test_monai_models_probe(name, capsys):
    factory, shape = MONAI[name]
    r = sigprop.probe_module(
        model=factory, input_shape=shape, inits=["as-is", "proposed"], samples=4, device="cpu"
    )
    _check(r)
    if name in TRACED:  # poolings, interpolation, transposed convs and concatenations mapped
        assert not r.config["theory_notes"]
        assert r.runs[0].layers[-1].forward.predicted is not None


@pytest.mark.parametrize("factory", [bert, gpt2])
def test_transformers_models_probe(factory, capsys):
    r = sigprop.probe_module(model=factory, input_shape=(8,), vocab=100, samples=4, device="cpu")
    _check(r)
