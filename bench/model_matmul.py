"""Thread CPU time of every 2-D weight of a GGUF (default SmolLM2-135M Q4_1) through
pi_op_matmul at 1, 2 and 4 tokens on a 1-thread pool, summed per tensor kind: the
matmul share of one batched decode step of N sequences (serve --parallel), less
sensitive to other processes on the host than the wall-clock seqs_decode.py. Prints
the ratio of N tokens to 1 and the load average.

    python bench/model_matmul.py [--model PATH] [--tokens 1 2 4]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from gguf import GGUFReader  # noqa: E402

from powerinfer_backend import _native  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    ffi, lib = _native.ffi, _native.lib
    pp = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(1, pp), "pi_pool_create")
    tot = collections.defaultdict(float)
    rng = np.random.default_rng(0)
    try:
        for t in GGUFReader(a.model or default_model_path()).tensors:
            if len(t.shape) != 2:
                continue
            n_cols, n_rows = int(t.shape[0]), int(t.shape[1])
            w = np.ascontiguousarray(t.data).view(np.uint8)
            kind = (t.name.split(".")[-2] if t.name.startswith("blk.") else t.name, t.tensor_type.name)
            for n_tok in a.tokens:
                x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
                y = np.zeros((n_tok, n_rows), np.float32)
                best = float("inf")
                for _ in range(3 if n_rows > 10000 else 8):
                    t0 = time.thread_time()
                    _native.check(
                        lib.pi_op_matmul(
                            pp[0],
                            int(t.tensor_type),
                            ffi.from_buffer(w),
                            n_rows,
                            n_cols,
                            ffi.cast("float *", ffi.from_buffer(x)),
                            n_tok,
                            ffi.cast("float *", ffi.from_buffer(y)),
                        ),
                        "pi_op_matmul",
                    )
                    best = min(best, time.thread_time() - t0)
                tot[kind + (n_tok,)] += best
    finally:
        lib.pi_pool_free(pp[0])
    n0 = a.tokens[0]
    for kind in sorted({k[:2] for k in tot}):
        ms = [tot[kind + (n,)] * 1e3 for n in a.tokens]
        print(
            f"{kind[0]:<18} {kind[1]:<5} ms per step at {a.tokens} tokens: "
            + " ".join(f"{v:.2f}" for v in ms)
            + "  ("
            + ", ".join(f"x{v / ms[0]:.2f}" for v in ms[1:])
            + ")"
        )
    ms = [sum(v for k, v in tot.items() if k[2] == n) * 1e3 for n in a.tokens]
    print(
        f"all matmuls: {' '.join(f'{v:.2f}' for v in ms)} ms ("
        + ", ".join(f"x{v / ms[0]:.2f}" for v in ms[1:])
        + f" vs {n0} token); load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
