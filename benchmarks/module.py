"""The cost of probing a user's model (``sigprop module``; issue 29 item 7, issue 37 item 13)
against its floor.

The floor is the bare work a backward ratio needs: the model's forward on the batch and autograd
for the input's gradient only (weights needing no gradient), in plain torch -- for token inputs
(GPT-2) the gradient at the embeddings' output, where a probe's graph starts.  sigprop adds the
hooks at the sites (one per-sample sum of squares forward and backward), a forward of two samples
(the sites called, the memory), the fx trace (a forward of two samples for the shapes) and the
moment maps.  Each side runs in its own process, one model after another, cold (imports
excluded, the model's construction included on both sides) and then warm (the median of the
later calls), with its peak RSS.

Models (``--models``, default bn-resnet,gpt2,unet): a batch-normalised CIFAR ResNet-20 (3 x 32 x
32), Hugging Face's GPT-2 from a small config (4 layers, 256 wide, 64 tokens), ``llama``: a
LlamaModel from a small config (4 layers, 256 wide, 4 heads on 2 key/value heads, 64 tokens), MONAI's 2-D UNet
(1 x 96 x 96, channels 16-128); ``densenet`` is 0.9.0's DenseNet121 at 3 x 224 x 224; ``tiny``, a
3-layer MLP, shows the fixed cost.

Usage: python benchmarks/module.py [--samples 64] [--threads 1] [--models bn-resnet,gpt2,unet]
       [--calls 11] [--device cpu]
Prints per model and side the cold and warm seconds and the peak RSS, and the warm ratio
sigprop / floor (the issue's target: <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def bn_resnet():
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, c_in: int, c: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.relu = nn.ReLU()
            self.short = (
                nn.Sequential(nn.Conv2d(c_in, c, 1, stride, bias=False), nn.BatchNorm2d(c))
                if stride != 1 or c_in != c
                else nn.Identity()
            )

        def forward(self, x):
            return self.relu(self.short(x) + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))

    layers, c_in = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for c, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(c_in, c, stride if i == 0 else 1))
            c_in = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def gpt2():
    import transformers

    cfg = transformers.GPT2Config(
        n_embd=256, n_layer=4, n_head=4, n_positions=64, vocab_size=1000, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(cfg)


def gpt2_12():
    """Issue 39's target: a 12-layer GPT-2 (one site per layer, token cosine, attention entropy)."""
    import transformers

    cfg = transformers.GPT2Config(
        n_embd=256, n_layer=12, n_head=4, n_positions=64, vocab_size=1000, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(cfg)


def llama():
    """Issue 50 item 4: a Llama-family decoder from a small config (RMSNorm, rotary positions, a
    gated MLP, grouped-query attention), whose theory the decoder maps of 0.16.0 compose."""
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        vocab_size=1000,
        attn_implementation="sdpa",
    )
    return transformers.LlamaModel(cfg)


def unet():
    from monai.networks.nets import UNet

    return UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(16, 32, 64, 128), strides=(2, 2, 2))


def densenet():
    from monai.networks.nets import DenseNet121

    return DenseNet121(spatial_dims=2, in_channels=3, out_channels=10)


def tiny():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


#: name -> (factory, input shape, token vocabulary or None)
MODELS = {
    "bn-resnet": (bn_resnet, (3, 32, 32), None),
    "gpt2": (gpt2, (64,), 1000),
    "gpt2-12": (gpt2_12, (64,), 1000),
    "llama": (llama, (64,), 1000),
    "unet": (unet, (1, 96, 96), None),
    "densenet": (densenet, (3, 224, 224), None),
    "tiny": (tiny, (32,), None),
}


def _floor(name: str, samples: int, device: str) -> None:
    """The bare forward and the input's (or the embeddings') gradient, as a probe needs them."""
    import torch

    factory, shape, vocab = MODELS[name]
    torch.manual_seed(0)
    model = factory().to(device)
    model.train()
    for m in model.modules():  # as a probe runs it: dropout off, batch norm on the batch
        if isinstance(m, torch.nn.Dropout):
            m.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if vocab is None:
        x = torch.randn(samples, *shape, device=device, requires_grad=True)
        y = model(x)
        start = x
    else:
        ids = torch.randint(vocab, (samples, *shape), device=device)
        got = {}

        def grab(mod, args, out):
            out.requires_grad_(True)
            got["h"] = out

        h = model.get_input_embeddings().register_forward_hook(grab)
        y = model(ids)
        h.remove()
        start = got["h"]
    y = y[0] if not isinstance(y, torch.Tensor) else y
    e = torch.randn_like(y)
    torch.autograd.grad(y, start, e)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child(side: str, name: str, samples: int, threads: int, calls: int, device: str) -> None:
    import torch

    torch.set_num_threads(threads)
    factory, shape, vocab = MODELS[name]
    times = []
    for _ in range(calls):
        if side == "floor":
            t0 = time.perf_counter()  # the model's construction counts on both sides
            _floor(name, samples, device)
            times.append(time.perf_counter() - t0)
        else:
            import sigprop
            from sigprop import api  # noqa: F401  (imports are not the probe's time)

            t0 = time.perf_counter()
            sigprop.probe_module(
                model=factory, input_shape=shape, vocab=vocab, samples=samples, device=device, threads=threads
            )
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"cold": times[0], "warm": statistics.median(times[1:]), "rss_mib": rss}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:7]), sys.argv[7])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="bn-resnet,gpt2,unet")
    ap.add_argument("--calls", type=int, default=11, help="calls per process: the first is cold")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    for name in a.models.split(","):
        got = {}
        for side in ("floor", "sigprop"):
            argv = [__file__, "--child", side, name, str(a.samples), str(a.threads), str(a.calls), a.device]
            out = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
            if out.returncode != 0:  # a model zoo not installed here (MONAI on a GPU image): said, not fatal
                print(f"{name}: {side} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
                break
            got[side] = json.loads(out.stdout.strip().splitlines()[-1])
        if len(got) < 2:
            continue
        f, s = got["floor"], got["sigprop"]
        print(
            f"{name}, {a.samples} samples, {a.threads} thread(s), {a.device}: floor cold {f['cold']:.3f} s "
            f"warm {f['warm']:.3f} s peak {f['rss_mib']:.0f} MiB; sigprop cold {s['cold']:.3f} s warm "
            f"{s['warm']:.3f} s peak {s['rss_mib']:.0f} MiB; ratio warm {s['warm'] / f['warm']:.2f} "
            f"(cold {s['cold'] / f['cold']:.2f}, memory {s['rss_mib'] / f['rss_mib']:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
