"""Decode of a synthetic 7B-shaped ReLU llama: dense vs predictor mode (issue 5's speed check).

Random Q4_0 weights of a 7B layer (n_embd 4096, n_ff 11008, 32 heads; --layers of
them; the model file of bench/relu_decode.py), ReLU (``powerinfer.ffn_act = "relu"``),
random predictors of rank --rank (F16 or Q8_0) with per-layer thresholds set to the
--density quantile of their scores on the FFN inputs of a few prompt tokens. Speed at
a given predicted density does not depend on what the predictor learned.

    python bench/predictor_decode.py [--layers 4] [--density 0.1] [--rank 256] [--threads 1 --cpu-time]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first; the imports below follow it (noqa: E402)

from relu_decode import build  # noqa: E402

from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down  # noqa: E402
from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import TensorView, load_gguf  # noqa: E402
from powerinfer_backend.sparsity.predictors import scores  # noqa: E402


def q8_view(name, arr):
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    raw = np.ascontiguousarray(quants.quantize(arr.astype(np.float32), T.Q8_0)).reshape(-1).view(np.uint8)
    return TensorView(name, int(T.Q8_0), (arr.shape[1], arr.shape[0]), raw, int(raw.nbytes))


def predictor_context(
    m, g, *, density: float, rank: int, pred_type: str, threads: int, n_ctx: int = 256, seed: int = 0
):
    """A NativeContext of ``m`` (model ``g``) in predictor mode: every layer's transposed down
    (the automatic type, ``down_t_dtype``) and random rank-``rank`` predictors (``pred_type``
    "f16" or "q8_0") with thresholds at the ``density`` quantile of their scores on the FFN
    inputs of 32 random prompt tokens. Returns (ctx, {"prompt", "pred_bytes", "down_t_type"})."""
    hp = g.hparams
    rng = np.random.default_rng(seed)
    prompt = [int(x) for x in rng.integers(1, hp.n_vocab, 32)]
    probe = NativeContext(m, n_ctx=256, n_batch=32, n_threads=threads)
    cap = np.zeros((hp.n_layer, 32, hp.n_embd), np.float32)
    probe.set_ffn_capture(cap)
    probe.eval(prompt)
    probe.close()
    pred = NativeContext(m, n_ctx=n_ctx, n_batch=32, n_threads=threads)
    dt = down_t_dtype(g)
    pred_bytes = 0
    for layer in range(hp.n_layer):
        fc1 = (rng.standard_normal((rank, hp.n_embd)) / np.sqrt(hp.n_embd)).astype(np.float16)
        fc2 = (rng.standard_normal((hp.n_ff, rank)) / np.sqrt(rank)).astype(np.float16)
        s = scores(fc1, fc2, cap[layer], n_threads=threads)
        thr = float(np.quantile(s, 1.0 - density))
        pred.set_ffn_sparsity(layer, transposed_down(g, layer, dtype=dt), 0.0)
        if pred_type == "q8_0":
            fc1, fc2 = q8_view(f"blk.{layer}.fc1.weight", fc1), q8_view(f"blk.{layer}.fc2.weight", fc2)
        pred.set_ffn_predictor(layer, fc1, fc2, thr)
        pred_bytes += fc1.nbytes + fc2.nbytes
    return pred, {"prompt": prompt, "pred_bytes": pred_bytes, "down_t_type": dt.upper()}


def relu_model(folder: str, layers: int):
    """bench/relu_decode.py's 7B-shaped ReLU Q4_0 file with ``layers`` layers in ``folder``
    (made once), loaded: (GGUFModel, NativeModel)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"relu7b-{layers}L-q4_0.gguf"
    build(path, layers)
    g = load_gguf(str(path), verbose=False)
    return g, NativeModel(g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer_relu_bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--pred-type", choices=("f16", "q8_0"), default="q8_0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu-time", action="store_true", help="time by process CPU time (use with --threads 1)")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    g, m = relu_model(args.dir, args.layers)
    dense = NativeContext(m, n_ctx=256, n_batch=32, n_threads=args.threads)
    pred, info = predictor_context(
        m, g, density=args.density, rank=args.rank, pred_type=args.pred_type, threads=args.threads
    )
    prompt, pred_bytes = info["prompt"], info["pred_bytes"]

    def decode(ctx):
        ctx.truncate(0)
        logits = ctx.eval(prompt[:4])
        t = clock()
        for _ in range(args.tokens):
            logits = ctx.eval([int(np.argmax(logits[-1]))])
        return clock() - t

    best = {"dense": float("inf"), "predictor": float("inf")}
    for _ in range(args.repeats):
        best["dense"] = min(best["dense"], decode(dense))
        pred.predictor_stats(reset=True)
        pred.ffn_stats(reset=True)
        best["predictor"] = min(best["predictor"], decode(pred))
    st = pred.predictor_stats()
    _, total = pred.ffn_stats(per_layer=True)
    dens = st["predicted"].sum() / max(1, total.sum())
    print(
        f"7B-shaped ReLU llama, {args.layers} layers, Q4_0, predictors rank {args.rank} {args.pred_type} "
        f"({pred_bytes / 2**20:.1f} MiB), {args.threads} threads, {args.tokens} tokens, "
        f"{'CPU time' if args.cpu_time else 'wall clock'}"
    )
    for k, v in best.items():
        print(f"  {k:<9} {args.tokens / v:7.2f} tok/s")
    print(
        f"  predictor / dense decode: {best['dense'] / best['predictor']:.2f}x at predicted density {dens:.3f}; "
        f"predictor {st['pred_ns'].sum() / 1e6:.1f} ms = {st['pred_ns'].sum() / max(1, st['ffn_ns'].sum()):.1%} "
        f"of the sparse FFN time"
    )


if __name__ == "__main__":
    main()
