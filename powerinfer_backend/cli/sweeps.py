"""FFN density sweep (``powerinfer-backend bench --ffn-density-sweep``): one
decode-step FFN of a given shape (default a 7B llama: n_embd 4096, n_ff 11008),
dense (pi_op_matmul gate, up, down + SwiGLU) against the sparse operator
pi_op_ffn_sparse at densities 1.0, 0.5, 0.3, 0.1, 0.05 (random active sets), for
gate/up in Q4_0 and F16, time relative to dense.

The weights of several layers are allocated and the calls rotate over them, so
that, as in a real decode step over 32 layers, the weights come from memory rather
than from the last-level cache; ``mib`` sets the total. Per-call times, a low
percentile reported (robust against other load on the machine).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import _native
from .._native.enums import FfnForm
from ..engine.kernels import bind_ffn_sparse, bind_matmul
from ..engine.pool import NativePool

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


class _Layer:
    def __init__(self, rng, n_embd: int, n_ff: int, gtype: str, dense_down_type: str, down_t_types):
        self.gate = rand_weights(rng, gtype, n_ff, n_embd)
        self.up = rand_weights(rng, gtype, n_ff, n_embd)
        self.down = rand_weights(rng, dense_down_type, n_embd, n_ff)  # GGUF [n_ff, n_embd]
        self.down_t = {t: rand_weights(rng, t, n_ff, n_embd) for t in down_t_types}

    def nbytes(self):
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes + sum(a.nbytes for a in self.down_t.values())


#: (gate/up type, dense down type, transposed down types measured)
CONFIGS = (("Q4_0", "Q4_0", ("F16", "Q8_0", "Q4_0")), ("F16", "F16", ("F16",)))


def run_sweep(
    *,
    n_embd: int = 4096,
    n_ff: int = 11008,
    n_threads: int = 2,
    mib: int = 1200,
    rounds: int = 15,
    pct: float = 10.0,
    densities=DENSITIES,
    cpu_time: bool = False,
) -> dict:
    """Time the dense FFN and the sparse operator at each density.

    Args:
        n_embd, n_ff: the FFN shape (multiples of 32).
        n_threads: pool threads. mib: MiB of weights rotated over.
        rounds: timed rounds over all layers (one more warms up).
        pct: percentile of the per-call times reported.
        cpu_time: time by the thread's CPU time (needs n_threads == 1).

    Returns:
        ``{"n_embd", "n_ff", "threads", "isa", "configs": [{"gate_up", "down", "dense_ms",
        "rows": [{"down_t", "density", "ms", "rel", "rel_per_density"}]}]}``.

    Raises:
        ValueError: bad shape or thread count.
    """
    if n_embd % 32 or n_ff % 32 or n_embd < 32 or n_ff < 32:
        raise ValueError(f"n_embd and n_ff must be positive multiples of 32, got {n_embd}, {n_ff}")
    if cpu_time and n_threads != 1:
        raise ValueError("cpu_time needs n_threads == 1")
    clock = time.thread_time if cpu_time else time.perf_counter
    with NativePool(n_threads) as pool:
        return _sweep(pool, clock, n_embd, n_ff, n_threads, mib, rounds, pct, densities)


def _sweep(pool, clock, n_embd, n_ff, n_threads, mib, rounds, pct, densities) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, n_embd), dtype=np.float32)
    g, u, h = (np.empty((1, n_ff), np.float32) for _ in range(3))
    y = np.empty((1, n_embd), np.float32)
    n_used = np.empty(1, np.int64)
    result = {"n_embd": n_embd, "n_ff": n_ff, "threads": n_threads, "isa": _native.isa_name(), "configs": []}

    def dense(calls):
        gate, up, down = calls
        gate()
        up()
        np.multiply(g / (1 + np.exp(-g)), u, out=h)
        down()

    for gtype, dtype, dts in CONFIGS:
        per_layer = _Layer(np.random.default_rng(1), n_embd, n_ff, gtype, dtype, dts).nbytes()
        n_layers = max(1, -(-mib * 2**20 // per_layer))
        layers = [_Layer(np.random.default_rng(1 + i), n_embd, n_ff, gtype, dtype, dts) for i in range(n_layers)]
        # the C calls bound once per layer (pointers made outside the timed region)
        mm = [
            (
                bind_matmul(pool, TYPE_ID[gtype], L.gate, n_ff, n_embd, x, g),
                bind_matmul(pool, TYPE_ID[gtype], L.up, n_ff, n_embd, x, u),
                bind_matmul(pool, TYPE_ID[dtype], L.down, n_embd, n_ff, h, y),
            )
            for L in layers
        ]
        act_sets = {}
        for d in densities:
            sets = []
            for _ in layers:
                ids = np.sort(rng.choice(n_ff, int(round(d * n_ff)), replace=False)).astype(np.int32)
                sets.append((ids, np.array([0, ids.size], np.int64)))
            act_sets[d] = sets
        sp = {
            (i, dt, d): bind_ffn_sparse(
                pool,
                FfnForm.SWIGLU,
                TYPE_ID[gtype],
                L.gate,
                L.up,
                n_embd,
                n_ff,
                TYPE_ID[dt],
                L.down_t[dt],
                x,
                *act_sets[d][i],
                0.0,
                y,
                n_used,
            )
            for i, L in enumerate(layers)
            for dt in dts
            for d in densities
        }

        variants: list[tuple[Any, Any, Any]] = [("dense", None, None)] + [(dt, dt, d) for dt in dts for d in densities]
        times: dict[tuple, list[float]] = {v: [] for v in variants}
        for r in range(rounds + 1):
            for i in range(n_layers):  # the variants interleaved call by call
                for v in variants:
                    t0 = clock()
                    dense(mm[i]) if v[1] is None else sp[i, v[1], v[2]]()
                    if r:  # round 0 warms up
                        times[v].append(clock() - t0)
        stat = {v: float(np.percentile(ts, pct)) for v, ts in times.items()}
        td = stat[variants[0]]
        rows = [
            {
                "down_t": v[0],
                "density": v[2],
                "ms": stat[v] * 1e3,
                "rel": stat[v] / td,
                "rel_per_density": stat[v] / td / v[2],
            }
            for v in variants[1:]
        ]
        result["configs"].append(
            {"gate_up": gtype, "down": dtype, "layers_rotated": n_layers, "dense_ms": td * 1e3, "rows": rows}
        )
    return result


def format_sweep(r: dict) -> str:
    """Human-readable table of a :func:`run_sweep` result."""
    lines = [
        f"FFN density sweep: n_embd {r['n_embd']}, n_ff {r['n_ff']}, {r['threads']} threads, "
        f"isa {r['isa']}, decode (1 token)"
    ]
    for c in r["configs"]:
        lines.append(
            f"gate/up {c['gate_up']}, dense down {c['down']}: dense {c['dense_ms']:.3f} ms "
            f"({c['layers_rotated']} layers rotated)"
        )
        lines.append(f"  {'down_t':<6} {'density':>7} {'ms':>8} {'rel':>6} {'rel/d':>6}")
        for row in c["rows"]:
            lines.append(
                f"  {row['down_t']:<6} {row['density']:>7.2f} {row['ms']:>8.3f} {row['rel']:>6.3f} "
                f"{row['rel_per_density']:>6.2f}"
            )
    return "\n".join(lines)
