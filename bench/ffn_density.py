"""Microbenchmark (not a test): one decode-step FFN of a 7B shape (n_embd 4096,
n_ff 11008), dense (pi_op_matmul gate, up, down + SwiGLU in numpy) against the
sparse operator pi_op_ffn_sparse at several densities (random active sets).

The weights of several layers are allocated and the calls rotate over them, so
that, as in a real decode step over 32 layers, the weights come from memory rather
than from the (possibly very large) last-level cache; --mib sets the total.

    python3 bench/ffn_density.py [--threads 2] [--mib 1200] [--rounds 15] [--pct 10]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # this checkout's package

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib

N_EMBD, N_FF = 4096, 11008
TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 8}
ROW_BYTES = {"F16": lambda n: 2 * n, "Q4_0": lambda n: n // 32 * 18, "Q8_0": lambda n: n // 32 * 34}
DENSITIES = (1.0, 0.5, 0.3, 0.1, 0.05)


def rand_weights(rng, tname: str, n_rows: int, n_cols: int) -> np.ndarray:
    """Random bytes of a valid tensor (finite scales) of n_rows rows of n_cols."""
    if tname == "F16":
        return (rng.standard_normal((n_rows, n_cols), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)
    bsz = {"Q4_0": 18, "Q8_0": 34}[tname]
    b = rng.integers(0, 256, (n_rows, n_cols // 32, bsz), dtype=np.uint8)
    d = (rng.random((n_rows, n_cols // 32), dtype=np.float32) * 0.002 + 0.001).astype(np.float16)
    b[..., :2] = d.view(np.uint8).reshape(n_rows, n_cols // 32, 2)
    return b.reshape(n_rows, -1)


class Layer:
    def __init__(self, rng, gtype: str, dense_down_type: str, down_t_types):
        self.gtype = gtype
        self.gate = rand_weights(rng, gtype, N_FF, N_EMBD)
        self.up = rand_weights(rng, gtype, N_FF, N_EMBD)
        self.down_type = dense_down_type
        self.down = rand_weights(rng, dense_down_type, N_EMBD, N_FF)  # GGUF [n_ff, n_embd]
        self.down_t = {t: rand_weights(rng, t, N_FF, N_EMBD) for t in down_t_types}

    def nbytes(self):
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes + sum(a.nbytes for a in self.down_t.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mib", type=int, default=1200, help="total weight bytes to rotate over")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --threads 1: time by the thread's CPU time, not the wall clock "
                         "(ignores time spent descheduled on a loaded machine)")
    ap.add_argument("--pct", type=float, default=10.0, help="percentile of the per-call times reported")
    args = ap.parse_args()

    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time needs --threads 1")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    out = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(args.threads, out), "pool")
    pool = out[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, N_EMBD), dtype=np.float32)
    xb = ffi.from_buffer("float[]", x)
    g = np.empty((1, N_FF), np.float32)
    u = np.empty((1, N_FF), np.float32)
    h = np.empty((1, N_FF), np.float32)
    y = np.empty((1, N_EMBD), np.float32)
    gb, ub, hb, yb = (ffi.from_buffer("float[]", a) for a in (g, u, h, y))
    n_used = ffi.new("int64_t[1]")

    print(f"isa {_native.isa_name()}, {args.threads} threads, n_embd {N_EMBD}, n_ff {N_FF}, decode (n_tok 1), "
          f"{'thread CPU time' if args.cpu_time else 'wall clock'}")
    configs = [("Q4_0", "Q4_0", ("F16", "Q8_0", "Q4_0")), ("F16", "F16", ("F16",))]
    for gtype, dtype, dts in configs:
        per_layer = Layer(np.random.default_rng(1), gtype, dtype, dts).nbytes()
        n_layers = max(1, -(-args.mib * 2**20 // per_layer))
        layers = [Layer(np.random.default_rng(1 + i), gtype, dtype, dts) for i in range(n_layers)]
        ptr = [{k: ffi.from_buffer(getattr(L, k)) for k in ("gate", "up", "down")} for L in layers]
        ptr_t = [{t: ffi.from_buffer(a) for t, a in L.down_t.items()} for L in layers]
        act_sets = {}
        for d in DENSITIES:
            sets = []
            for _ in layers:
                ids = np.sort(rng.choice(N_FF, int(round(d * N_FF)), replace=False)).astype(np.int32)
                off = np.array([0, ids.size], np.int64)
                sets.append((ids, off, ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("int64_t[]", off)))
            act_sets[d] = sets

        def dense(i):
            p = ptr[i]
            _native.check(lib.pi_op_matmul(pool, TYPE_ID[gtype], p["gate"], N_FF, N_EMBD, xb, 1, gb), "mm")
            _native.check(lib.pi_op_matmul(pool, TYPE_ID[gtype], p["up"], N_FF, N_EMBD, xb, 1, ub), "mm")
            np.multiply(g / (1 + np.exp(-g)), u, out=h)
            _native.check(lib.pi_op_matmul(pool, TYPE_ID[dtype], p["down"], N_EMBD, N_FF, hb, 1, yb), "mm")

        def sparse(i, dt, d):
            p = ptr[i]
            _, _, ids, off = act_sets[d][i]
            _native.check(lib.pi_op_ffn_sparse(pool, lib.PI_FFN_SWIGLU, TYPE_ID[gtype], p["gate"], p["up"],
                                               N_EMBD, N_FF, TYPE_ID[dt], ptr_t[i][dt], xb, 1, ids, off,
                                               0.0, yb, n_used), "sparse")

        variants = [("dense", None, None)] + [(f"sparse down_t {dt}", dt, d) for dt in dts for d in DENSITIES]
        times = {v: [] for v in variants}
        for r in range(args.rounds + 1):
            for i in range(n_layers):  # the variants interleaved call by call
                for v in variants:
                    t0 = clock()
                    dense(i) if v[1] is None else sparse(i, v[1], v[2])
                    if r:  # round 0 warms up
                        times[v].append(clock() - t0)
        # per-call times; the low percentile is robust against other load on the machine
        stat = {v: (float(np.percentile(ts, args.pct)), float(np.median(ts))) for v, ts in times.items()}
        td, tdm = stat[variants[0]]
        print(f"\ngate/up {gtype}, dense down {dtype}: {n_layers} layers rotated "
              f"({n_layers * per_layer / 2**20:.0f} MiB incl. all down_t copies); dense p{args.pct:g} "
              f"{td * 1e3:.3f} ms, median {tdm * 1e3:.3f} ms")
        print(f"{'variant':<22} {'density':>7} {'ms':>8} {'rel':>6} {'rel/d':>6} {'med rel':>8}")
        for v in variants[1:]:
            t, tm = stat[v]
            print(f"{v[0]:<22} {v[2]:>7.2f} {t * 1e3:>8.3f} {t / td:>6.3f} {t / td / v[2]:>6.2f} {tm / tdm:>8.3f}")

    # one-off cost of building down_t from a GGUF down
    L = Layer(np.random.default_rng(99), "Q4_0", "Q4_0", ())
    dst = np.empty(N_FF * N_EMBD * 2, np.uint8)
    t0 = time.perf_counter()
    _native.check(lib.pi_op_transpose_to(TYPE_ID["F16"], ffi.from_buffer(L.down), TYPE_ID["Q4_0"], N_EMBD,
                                         N_FF, ffi.from_buffer(dst)), "transpose")
    print(f"\npi_op_transpose_to Q4_0 [n_ff, n_embd] -> F16 down_t: {time.perf_counter() - t0:.3f} s per layer")
    lib.pi_pool_free(pool)


if __name__ == "__main__":
    main()
