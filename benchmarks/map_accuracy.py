"""How far a traced transformer's moment maps are from the measurement, averaged over draws
(docs/theory.md §15, docs/reliability.md §1g): per case, D draws of S samples (``sigprop module
--seeds D``), and at every site the measured RMS forward and backward ratios against the
predicted (the worst site's |measured/predicted - 1|, and the first site's backward) and the
token cosine's worst |measured - predicted|.  The error of the maps is what is left once the
draws average the measurement's own spread: the across-draw standard error of the first site's
backward is printed beside it (``se``).

    python benchmarks/map_accuracy.py --draws 8 [--cases post_d64_T16_L24,...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

import sigprop

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))  # the cases' factories, also when sigprop loads this file
from reliability_transformers import ENCODER  # noqa: E402

FACTORIES = os.path.join(os.path.dirname(HERE), "reliability_transformers.py")


#: name: (target, args, input shape, vocab)
CASES = {
    "pre_d64_T16_L6": (ENCODER, ["d=64", "layers=6"], "16,64", None),
    "pre_d64_T16_L24": (ENCODER, ["d=64", "layers=24"], "16,64", None),
    "post_d64_T16_L6": (ENCODER, ["d=64", "layers=6", "norm_first=False"], "16,64", None),
    "post_d128_T32_L12": (ENCODER, ["layers=12", "norm_first=False", "d=128"], "32,128", None),
    "post_d64_T16_L24": (ENCODER, ["d=64", "layers=24", "norm_first=False"], "16,64", None),
    "post_d64_T16_L48": (ENCODER, ["d=64", "layers=48", "norm_first=False"], "16,64", None),
    "gpt2_d64_T32_L4": (f"{FACTORIES}:gpt2", ["layers=4"], "32", 1000),
    "bert_d64_T16_L4": (f"{FACTORIES}:bert", ["layers=4"], "16", 1000),
    "vit_d128_L4": (f"{FACTORIES}:vit", ["layers=4"], "3,32,32", None),
}


def run_case(name: str, draws: int, samples: int) -> dict:
    target, args, shape, vocab = CASES[name]
    t0 = time.perf_counter()
    r = sigprop.probe_module(
        target=target, args=args, input_shape=shape, vocab=vocab, seeds=draws, samples=samples
    )
    run = r.runs[0]
    fwd, bwd, cos = [], [], []
    for layer in run.layers:
        for st, out in ((layer.forward, fwd), (layer.backward, bwd)):
            if st.log10_predicted is not None and st.log10_rms is not None:
                out.append(st.log10_rms - st.log10_predicted)
        tok = layer.tokens
        if tok is not None and tok.predicted is not None:
            cos.append(tok.mean - tok.predicted)
    first = run.layers[run.ends[1]].backward
    first_err = (first.log10_rms - first.log10_predicted) if first.log10_predicted is not None else None
    se = first.log10_draw_std / math.sqrt(draws) if first.log10_draw_std else None

    def worst(v):
        return 10 ** max(v, key=abs) - 1 if v else float("nan")

    return {
        "case": name,
        "forward": worst(fwd),
        "backward": worst(bwd),
        "first_backward": float("nan") if first_err is None else 10**first_err - 1,
        "first_se": float("nan") if se is None else se * math.log(10),
        "cosine": max(cos, key=abs) if cos else float("nan"),
        "sites": len(run.layers),
        "seconds": time.perf_counter() - t0,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    print(f"sigprop {sigprop.__version__}, torch {torch.__version__}, {a.draws} draws x {a.samples} samples")
    heads = " ".join(f"{h:>9s}" for h in ("fwd worst", "bwd worst", "bwd first"))
    print(f"{'case':20s} {heads} {'± se':>6s} {'cos worst':>9s} {'s':>5s}")
    for name in a.cases.split(","):
        c = run_case(name, a.draws, a.samples)
        print(
            f"{name:20s} {c['forward']:+9.1%} {c['backward']:+9.1%} {c['first_backward']:+9.1%} "
            f"{c['first_se']:6.1%} {c['cosine']:+9.3f} {c['seconds']:5.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
