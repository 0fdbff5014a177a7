"""Throughput of the batched matrix products per weight type (pi_op_matmul on a 1-thread
pool, thread CPU seconds, best of --repeats), in G int8 multiply-adds per second, at
several token counts: 1 token runs the row dot of decode, more run the tiled kernels
(isa/x86_tiles.h); for the types with a row-group layout (pi_repack, what Llama runs by
default) a second line, "+groups", runs the same weights repacked (isa/x86_groups.h).
Weights are random quantized rows (SmolLM2- and Qwen-sized shapes); the result does not
depend on their values. Prints the load average.

    python bench/tile_kernels.py [--types Q4_1 Q8_0 Q4_K Q6_K] [--tokens 1 4 8 64] [--rows 1536 --cols 1536]
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

from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants  # noqa: E402

from powerinfer_backend import _native  # noqa: E402


def random_rows(tname: str, n_rows: int, n_cols: int, rng) -> np.ndarray:
    """Random quantized bytes with small finite F16 block scales (every block type keeps
    its scale(s) in its first bytes; the K-quants' are set the same way below)."""
    t = GT[tname]
    block, tsize = quants.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, size=(n_rows, n_cols // block, tsize), dtype=np.uint8)
    scale = rng.uniform(0.002, 0.01, size=b.shape[:2]).astype("<f2")[..., None].view(np.uint8)
    at = {"Q6_K": tsize - 2}.get(tname, 0)  # Q6_K's d is its last two bytes
    b[..., at : at + 2] = scale
    if tname in ("Q4_1", "Q4_K", "Q5_K"):
        b[..., 2:4] = scale
    return b.reshape(n_rows, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 64])
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--cols", type=int, default=1536)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa", default="auto")
    a = ap.parse_args()
    ffi, lib = _native.ffi, _native.lib
    _native.set_isa(a.isa)
    pp = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(1, pp), "pi_pool_create")
    rng = np.random.default_rng(0)
    print(f"{a.rows} x {a.cols} weights, G MAC/s per thread at {a.tokens} tokens")
    try:
        for tname in a.types:
            t = int(GT[tname])
            w = random_rows(tname, a.rows, a.cols, rng)
            kernels = [(tname, lib.pi_op_matmul, w)]
            size = lib.pi_repack_size(t, a.rows, a.cols)
            if size > 0:
                g = np.empty(size, np.uint8)
                _native.check(lib.pi_repack(t, ffi.from_buffer(w), a.rows, a.cols, ffi.from_buffer(g)), "pi_repack")
                kernels.append((f"{tname}+groups", lib.pi_op_matmul_grouped, g))
            for label, fn, data in kernels:
                rates = []
                for n_tok in a.tokens:
                    x = rng.standard_normal((n_tok, a.cols)).astype(np.float32)
                    y = np.zeros((n_tok, a.rows), np.float32)
                    xp, yp = ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(y))
                    best = float("inf")
                    for _ in range(a.repeats):
                        t0 = time.thread_time()
                        rc = fn(pp[0], t, ffi.from_buffer(data), a.rows, a.cols, xp, n_tok, yp)
                        _native.check(rc, label)
                        best = min(best, time.thread_time() - t0)
                    rates.append(a.rows * a.cols * n_tok / best / 1e9)
                print(f"{label:<12} " + " ".join(f"{r:7.1f}" for r in rates))
    finally:
        lib.pi_pool_free(pp[0])
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
