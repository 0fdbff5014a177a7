"""Sparsity vs perplexity vs decode speed for the down-only sparse FFN with one global
|h| threshold on every layer (no per-layer calibration yet): held-out text = the last
10% of tinyshakespeare. Usage: python bench/sparse_frontier.py [--chunks 4] [--ctx 512]"""

import argparse
import time
from pathlib import Path

import numpy as np

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.loader.models import default_model_path
from powerinfer_backend.sparsity.perplexity import perplexity
from powerinfer_backend.text.tokenizer import LlamaCppTokenizer

TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def _chunk_eval(ctx):
    """perplexity's chunk evaluator over ``ctx`` (every row's logits)."""

    def eval_chunk(chunk):
        ctx.truncate(0)
        return ctx.eval(chunk, logits_all=True)

    return eval_chunk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--thresholds",
        default="0,0.005,0.01,0.02,0.03,0.05,0.08",
        help="comma-separated; the first row always runs dense",
    )
    args = ap.parse_args()
    path = default_model_path()
    data = TEXT.read_bytes()
    text = data[int(len(data) * 0.9) :].decode("utf-8", "ignore")
    tok = LlamaCppTokenizer(path)
    tokens = tok.tokenize(text.encode())
    g = load_gguf(path, verbose=False)
    model = NativeModel(g)
    hp = g.hparams
    down_t = [
        np.ascontiguousarray(g.tensors[f"blk.{i}.ffn_down.weight"].to_float32().reshape(hp.n_embd, hp.n_ff).T)
        for i in range(hp.n_layer)
    ]
    print(f"{'threshold':>9} {'ffn sparsity':>12} {'ppl':>9} {'vs dense':>9} {'decode tok/s':>12}")
    base = None
    for t in [float(x) for x in args.thresholds.split(",")]:
        ctx = NativeContext(model, n_ctx=args.ctx, n_batch=args.ctx, n_threads=args.threads)
        if base is not None:  # the first row is the dense baseline
            for i in range(hp.n_layer):
                ctx.set_ffn_sparsity(i, down_t[i], t)
        r = perplexity(tokens, _chunk_eval(ctx), args.ctx, args.chunks)
        used, total = ctx.ffn_stats(reset=True)
        ctx.truncate(0)
        logits = ctx.eval(tokens[:8])
        t0 = time.perf_counter()
        for _ in range(48):
            logits = ctx.eval([int(np.argmax(logits))])
        tps = 48 / (time.perf_counter() - t0)
        sparsity = 1 - used / total if total else 0.0
        if base is None:
            base = r["ppl"]
        print(
            f"{'dense' if total == 0 else t:>9} {sparsity:>12.3f} {r['ppl']:>9.3f} {r['ppl'] / base - 1:>+9.2%} "
            f"{tps:>12.1f}"
        )
        ctx.close()


if __name__ == "__main__":
    main()
