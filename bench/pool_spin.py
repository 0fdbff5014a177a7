"""The thread pool's wait policy and chunking, measured: our decode tokens/s and CPU
seconds per token beside 0, 1, 2 busy processes, for each spin setting
(POWERINFER_POOL_SPIN_US: 0 = never spin, a fixed spin in us, or "auto" = 50 us unless
the last wait was preempted) and chunks per thread (POWERINFER_POOL_CHUNKS; 1 = one
part per thread, as the pool before chunking), on one loaded model.

    python bench/pool_spin.py [--model PATH] [--threads 2] [--busy 0,1,2] [--n-decode 32] [--repeats 3]

Settings are interleaved within each repeat (drift hits them alike); medians are printed
with the 1-minute load average at the start of each busy level.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

import numpy as np  # noqa: E402

from powerinfer_backend.cli.busy import busy_processes  # noqa: E402
from powerinfer_backend.engine import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402

PROMPT = [504, 2365, 6354, 16438, 27003, 690, 260]


def one(model, n_threads: int, n_decode: int) -> tuple[float, float]:
    """(decode tok/s, process CPU s per token) of a fresh context (its pool reads the env)."""
    ctx = NativeContext(model, n_ctx=n_decode + 16, n_batch=16, n_threads=n_threads)
    logits = ctx.eval(PROMPT)[-1]
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n_decode):
        logits = ctx.eval([int(np.argmax(logits))])[-1]
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    return n_decode / dt, dc / n_decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", default="0,1,2")
    ap.add_argument("--spins", default="0,50,2000,auto", help="POWERINFER_POOL_SPIN_US values")
    ap.add_argument("--chunks", default="1,4", help="POWERINFER_POOL_CHUNKS values")
    ap.add_argument("--n-decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = NativeModel(load_gguf(a.model or default_model_path(), verbose=False))
    settings = [(s, c) for c in a.chunks.split(",") for s in a.spins.split(",")]
    print(f"threads {a.threads}, {a.n_decode} tokens, median of {a.repeats}, {os.cpu_count()} CPUs")
    print(f"{'busy':>4} {'load':>5} {'chunks':>6} {'spin_us':>7} {'tok/s':>7} {'cpu ms/tok':>10}")
    for n_busy in (int(x) for x in a.busy.split(",")):
        with busy_processes(n_busy):
            time.sleep(0.5)
            load = os.getloadavg()[0]
            res = {s: [] for s in settings}
            for _ in range(a.repeats):
                for spin, chunks in settings:
                    os.environ["POWERINFER_POOL_SPIN_US"], os.environ["POWERINFER_POOL_CHUNKS"] = spin, chunks
                    res[(spin, chunks)].append(one(model, a.threads, a.n_decode))
            for (spin, chunks), v in res.items():
                print(
                    f"{n_busy:>4} {load:>5.1f} {chunks:>6} {spin:>7} {statistics.median(x[0] for x in v):>7.1f} "
                    f"{1e3 * statistics.median(x[1] for x in v):>10.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
