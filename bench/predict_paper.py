"""plan --predict's model on the PowerInfer paper's RTX 4090 setups, on paper (no weights).

PowerInfer (Song et al., SOSP'24, arXiv 2312.12456) measured FP16 ReLU models on one RTX
4090 (24 GB) against llama.cpp's layer split. This builds :class:`ModelSizes` of those
shapes (FP16 weights, or Q4_0 with --wtype; no GGUF needed), synthesizes per-neuron firing frequencies with a
power law (a mean firing rate, and the top --top-frac of each layer's neurons carrying
--top-mass of its activations), plans with our neuron planner and with placement="auto"
at --budget-gib and prints the
predicted decode tok/s of ours (with our ggml device reading every hot row, and in mode
predictor with it computing only the hot neurons the predictor selects, ``device_skips``:
their gate and up rows, every down column) and of llama.cpp's layer split, with the ratios.
docs/placement.md compares them with the paper's figures.

    python bench/predict_paper.py [--device-bandwidth 1008] [--host-bandwidth 67.2] [--rate 0.1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.hybrid.placement import (  # noqa: E402
    GiB,
    ModelSizes,
    TensorSize,
    full_device_bytes,
    plan_auto,
    plan_placement,
)
from powerinfer_backend.hybrid.placement import predict as pr  # noqa: E402

F32, F16, Q4_0 = 0, 1, 2
#: name -> (n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, gated): the public configs
SHAPES = {
    "LLaMA(ReLU)-2-7B": (32, 4096, 11008, 32, 32, 32000, True),
    "OPT-30B": (48, 7168, 28672, 56, 56, 50272, False),
    "Falcon(ReLU)-40B": (60, 8192, 32768, 128, 8, 65024, False),
    "LLaMA(ReLU)-2-70B": (80, 8192, 28672, 64, 8, 32000, True),
}


def paper_sizes(
    n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int, gated: bool, wtype: int = F16
) -> ModelSizes:
    """Matrices in ``wtype`` (F16, or Q4_0), F32 norms; ungated FFNs have no ffn_gate
    (biases left out: < 0.1% of the bytes)."""
    hd = n_embd // n_head
    w = wtype
    layer = {
        "attn_norm": TensorSize(F32, (n_embd,)),
        "attn_q": TensorSize(w, (n_embd, n_head * hd)),
        "attn_k": TensorSize(w, (n_embd, n_head_kv * hd)),
        "attn_v": TensorSize(w, (n_embd, n_head_kv * hd)),
        "attn_output": TensorSize(w, (n_head * hd, n_embd)),
        "ffn_norm": TensorSize(F32, (n_embd,)),
        "ffn_up": TensorSize(w, (n_embd, n_ff)),
        "ffn_down": TensorSize(w, (n_ff, n_embd)),
    }
    if gated:
        layer["ffn_gate"] = TensorSize(w, (n_embd, n_ff))
    return ModelSizes(
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head=hd,
        n_vocab=n_vocab,
        layers=(layer,) * n_layer,
        output_norm=TensorSize(F32, (n_embd,)),
        output=TensorSize(w, (n_embd, n_vocab)),
        cpu_down_t_type="f16" if w == F16 else "q8_0",
    )  # as down_t_dtype chooses


def power_law_freq(n_layer: int, n_ff: int, rate: float, top_frac: float, top_mass: float, seed: int = 0) -> np.ndarray:
    """(n_layer, n_ff) frequencies f(r) = min(1, A (r / n_ff)^-alpha) over the rank r,
    alpha such that the top ``top_frac`` carry ``top_mass`` of the activations (uncapped
    power law), A such that the mean is ``rate``; each layer's ranks shuffled."""
    alpha = 1 - np.log(top_mass) / np.log(top_frac)
    x = (np.arange(n_ff) + 0.5) / n_ff
    lo, hi = 0.0, 1.0
    for _ in range(100):  # bisection on A: the capped mean is increasing in A
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.minimum(1.0, mid * x**-alpha).mean() < rate else (lo, mid)
    f = np.minimum(1.0, lo * x**-alpha)
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(f) for _ in range(n_layer)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device-bandwidth", type=float, default=1008.0, help="GB/s (RTX 4090: 1008)")
    ap.add_argument("--host-bandwidth", type=float, default=67.2, help="GB/s (the paper's PC-High: 67.2)")
    ap.add_argument("--budget-gib", type=float, default=22.0, help="device budget (24 GB minus runtime)")
    ap.add_argument(
        "--budget-fraction", type=float, default=None, help="instead: this fraction of each model's full device bytes"
    )
    ap.add_argument("--wtype", choices=("f16", "q4_0"), default="f16", help="matrix type (default f16, the paper's)")
    ap.add_argument("--rate", type=float, default=0.1, help="mean firing rate (0.1 = 90%% sparsity)")
    ap.add_argument("--top-frac", type=float, default=0.26)
    ap.add_argument("--top-mass", type=float, default=0.8)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--mode",
        choices=pr.MODES,
        default="predictor",
        help="FFN mode of the CPU half (default predictor, PowerInfer's; relu: our exact/CATS ReLU)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, shape in SHAPES.items():
        s = paper_sizes(*shape, wtype={"f16": F16, "q4_0": Q4_0}[a.wtype])
        s = s.for_mode(a.mode)  # a sparse mode's layers keep their down_t once split
        budget = (
            int(a.budget_fraction * full_device_bytes(s, a.ctx, a.batch))
            if a.budget_fraction
            else int(a.budget_gib * GiB)
        )
        freq = power_law_freq(s.n_layer, s.n_ff, a.rate, a.top_frac, a.top_mass)
        plan = plan_placement(s, freq, budget, n_ctx=a.ctx, n_batch=a.batch)
        kw = dict(device_gbps=a.device_bandwidth, host_gbps=a.host_bandwidth, mode=a.mode)
        ggml = pr.predict_ours(s, plan, freq, **kw)
        skip = pr.predict_ours(s, plan, freq, device_skips=True, **kw)
        split = pr.predict_layer_split(
            s, budget, device_gbps=a.device_bandwidth, host_gbps=a.host_bandwidth, n_ctx=a.ctx, n_batch=a.batch
        )
        auto = plan_auto(s, freq, budget, n_ctx=a.ctx, n_batch=a.batch, **kw)
        rows.append(
            {
                "model": name,
                "budget_gib": budget / GiB,
                "file_gb": sum(t.nbytes for L in s.layers for t in L.values()) / 1e9,
                "hot_fraction": plan.hot_fraction,
                "hot_mass": float(np.mean([L.freq_mass for L in plan.layers])),
                "attn_on_device": sum(L.attn_on_device for L in plan.layers),
                "ours_ggml_tok_s": ggml.tok_s,
                "ours_skip_tok_s": skip.tok_s,
                "llama_cpp_tok_s": split.tok_s,
                "n_gpu_layers": split.n_gpu_layers,
                "ratio_ggml": ggml.tok_s / split.tok_s,
                "ratio_skip": skip.tok_s / split.tok_s,
                "auto_policy": auto.choice["policy"],
                "auto_tok_s": auto.choice["tok_s"][auto.choice["policy"]],
                "ratio_auto": auto.choice["ratio"],
            }
        )
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"device {a.device_bandwidth:g} GB/s, host {a.host_bandwidth:g} GB/s, firing rate {a.rate:g} "
        f"(top {a.top_frac:.0%} of neurons: {a.top_mass:.0%} of activations), {a.wtype}, mode {a.mode}"
    )
    print(
        f"{'model':20s} {'GB':>6s} {'budget GiB':>10s} {'attn on dev':>11s} {'hot%':>6s} {'hot mass':>8s} "
        f"{'ours ggml':>9s} {'ours skip':>9s} {'llama.cpp':>9s} {'-ngl':>5s} {'ratio':>6s} {'ratio skip':>10s} "
        f"{'auto':>9s} {'ratio auto':>10s} policy"
    )
    for r in rows:
        print(
            f"{r['model']:20s} {r['file_gb']:6.1f} {r['budget_gib']:10.1f} {r['attn_on_device']:11d} "
            f"{100 * r['hot_fraction']:6.1f} {r['hot_mass']:8.2f} {r['ours_ggml_tok_s']:9.2f} "
            f"{r['ours_skip_tok_s']:9.2f} {r['llama_cpp_tok_s']:9.2f} {r['n_gpu_layers']:5d} {r['ratio_ggml']:6.2f} "
            f"{r['ratio_skip']:10.2f} "
            f"{r['auto_tok_s']:9.2f} {r['ratio_auto']:10.2f} {r['auto_policy']}"
        )


if __name__ == "__main__":
    main()
