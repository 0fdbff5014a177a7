"""Orchestration overhead per decoded token of a ggml device placement, in microseconds, on
``ggml-cpu``: SmolLM2 decoded on the CPU engine (every layer's FFN over the split's transposed
down, threshold 0: the arithmetic a placed context runs) against the same context with the
lowest ``--hot`` neurons of every layer on the device (no attention, no output block), so the
device computes almost nothing and the difference is what a split costs: per layer a graph
built, allocated and run on the device thread, the activations copied in and out, the handoff
and the merge. With ``--seqs N`` N sequences decode together (one graph per sequence per
layer). Runs interleave, the best of each side is compared; the device trace gives the device
thread's time per hot-FFN graph.

    python bench/split_overhead.py [--runs 5] [--steps 64] [--hot 32] [--seqs 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from powerinfer_backend.engine import ggml, testing
from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.loader.models import default_model_path


def _decode(ctx, seqs: int, steps: int) -> float:
    """Seconds per decode step of ``seqs`` sequences after an 8-token prompt each."""
    for s in range(seqs):
        ctx.seq_truncate(s, 0)
    ctx.eval_seqs([(s, [1, 504, 3458, 314, 253, 1345, 30, 2 + s]) for s in range(seqs)])
    t0 = time.perf_counter()
    for i in range(steps):
        ctx.eval_seqs([(s, [253 + i + s]) for s in range(seqs)])
    return (time.perf_counter() - t0) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--hot", type=int, default=32, help="device neurons per layer (the lowest ids)")
    ap.add_argument("--seqs", type=int, default=1, help="sequences decoding together")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    g = load_gguf(default_model_path(), verbose=False)
    m = NativeModel(g)
    hp = g.hparams
    down_t = [transposed_down(g, i, dtype=down_t_dtype(g, split=True)) for i in range(hp.n_layer)]
    dev = ggml.GgmlDevice("CPU", 1)
    ctxs = {}
    for name in ("cpu", "device"):
        ctx = NativeContext(m, n_ctx=a.seqs * (a.steps + 64), n_batch=64, n_threads=1, n_seq_max=a.seqs)
        for i in range(hp.n_layer):
            ctx.set_ffn_sparsity(i, down_t[i], 0.0)
        if name == "device":
            layer = types.SimpleNamespace(attn_on_device=False, hot_ids=np.arange(a.hot, dtype=np.int32))
            ctx.set_ggml_device(dev, [layer] * hp.n_layer, False, 1 << 40)
        ctxs[name] = ctx
    best = {k: float("inf") for k in ctxs}
    for _ in range(a.runs):
        for k, ctx in ctxs.items():
            best[k] = min(best[k], _decode(ctx, a.seqs, a.steps))
    trace = {}
    if testing.AVAILABLE:  # per layer and step, from the device trace (medians over 16 decode steps)
        ctx = ctxs["device"]
        spans, pickup, wait = [], [], []
        for i in range(16):
            testing.trace(ctx, 4096)
            ctx.eval_seqs([(s, [300 + i + s]) for s in range(a.seqs)])
            ev = testing.trace_read(ctx)
            dev_iv = {layer: (t, b) for k, layer, t, b in ev if k == "ffn"}
            cold = {layer: (t, b) for k, layer, t, b in ev if k == "cold"}
            for layer, (t, b) in dev_iv.items():
                spans.append((b - t) / 1e3)  # the device thread's graphs
                pickup.append((t - cold[layer][0]) / 1e3)  # posted -> the device thread starts
                wait.append(max(0, b - cold[layer][1]) / 1e3)  # the caller done with its cold half -> device done
        testing.trace(ctx, 0)
        trace = {
            "device_graphs_us_per_layer_step": float(np.median(spans)),
            "device_pickup_us_median": float(np.median(pickup)),
            "caller_wait_us_median": float(np.median(wait)),
            "caller_wait_us_mean": float(np.mean(wait)),
        }
    per_tok = (best["device"] - best["cpu"]) / a.seqs * 1e6
    out = {
        "seqs": a.seqs,
        "hot": a.hot,
        "n_layer": hp.n_layer,
        "cpu_step_us": best["cpu"] * 1e6,
        "device_step_us": best["device"] * 1e6,
        "overhead_us_per_token": per_tok,
        "overhead_us_per_layer": per_tok / hp.n_layer,
        **trace,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    for ctx in ctxs.values():
        ctx.close()
    dev.close()
    m.close()
    print(json.dumps(out) if a.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
