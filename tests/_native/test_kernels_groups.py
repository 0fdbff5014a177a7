"""Row groups (pi_repack / pi_op_matmul_grouped; pi_internal.h "Row groups", isa/x86_groups.h
and scalar.c): Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K matrices laid out as 16 interleaved rows.
Every ISA path this CPU has gives the scalar path's bits; a token's outputs are the same bits alone and in any batch
(1 to 17 tokens: every AVX token tile, full and partial) and for any thread count (part
boundaries round down to whole groups); the values agree with the file's row order to
float rounding; shapes and types without the layout are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from powerinfer_backend import _native

from tests._native.test_kernels_kquants import activations, weights
from tests._native.test_kernels_tiles import block32_weights, each_isa  # noqa: F401 (fixture)

ffi, lib = _native.ffi, _native.lib
# (n_rows, n_cols, n_tok): one block, SmolLM2's n_embd, tokens ending on each tile size
SHAPES = {
    "Q4_0": [(16, 32, 1), (48, 576, 17), (32, 96, 9), (64, 640, 4), (160, 256, 3), (16, 64, 6)],
    "Q5_0": [(16, 32, 1), (48, 640, 17), (32, 96, 9), (16, 64, 6)],
    "Q8_0": [(16, 32, 1), (48, 576, 17), (32, 96, 9), (16, 64, 6)],
    "Q4_K": [(16, 256, 1), (48, 768, 17), (32, 512, 9), (64, 256, 4), (16, 1280, 3), (32, 256, 6)],
    "Q5_K": [(16, 256, 1), (48, 768, 17), (32, 512, 9), (16, 1280, 3), (32, 256, 6)],
    "Q6_K": [(16, 256, 1), (48, 768, 17), (32, 512, 9), (16, 1280, 3), (32, 256, 6)],
}
CASES = [(t, shape) for t, shapes in SHAPES.items() for shape in shapes]


def _repack(t: int, w: np.ndarray, n_rows: int, n_cols: int) -> np.ndarray:
    g = np.empty(lib.pi_repack_size(t, n_rows, n_cols), np.uint8)
    _native.check(lib.pi_repack(t, ffi.from_buffer(w), n_rows, n_cols, ffi.from_buffer(g)), "pi_repack")
    return g


def _product(fn, pool, t: int, w: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray) -> np.ndarray:
    """y (n_tok, n_rows) of ``fn`` (pi_op_matmul over rows, pi_op_matmul_grouped over groups)"""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty((x.shape[0], n_rows), np.float32)
    rc = fn(
        pool,
        t,
        ffi.from_buffer(w),
        n_rows,
        n_cols,
        ffi.from_buffer("float[]", x),
        x.shape[0],
        ffi.from_buffer("float[]", y),
    )
    _native.check(rc, "product")
    return y


def _grouped(pool, t, g, n_rows, n_cols, x):
    return _product(lib.pi_op_matmul_grouped, pool, t, g, n_rows, n_cols, x)


def _row_order(pool, t, w, n_rows, n_cols, x):
    return _product(lib.pi_op_matmul, pool, t, w, n_rows, n_cols, x)


def _case(tname, n_rows, n_cols, n_tok, real):
    """(quantized rows: random quants or real ones, activations with outliers)"""
    if tname in ("Q4_0", "Q5_0", "Q8_0"):
        w = block32_weights(tname, n_rows, n_cols, real)
    else:
        w = weights(tname, n_rows, n_cols, real)[1]
    return np.ascontiguousarray(w), activations(n_tok, n_cols, n_rows + n_cols)


def test_repack_moves_every_byte_once():
    n_rows, n_cols = 32, 96
    w, _ = _case("Q4_0", n_rows, n_cols, 1, False)
    g = _repack(int(GT.Q4_0), w, n_rows, n_cols)
    assert g.nbytes == w.nbytes == n_rows * (n_cols // 32) * 18
    blocks = w.reshape(n_rows, n_cols // 32, 18)
    grp = g.reshape(n_rows // 16, n_cols // 32, 288)
    for r in (0, 7, 16, 31):
        for i in range(n_cols // 32):
            b = grp[r // 16, i]
            assert b[2 * (r % 16) : 2 * (r % 16) + 2].tobytes() == blocks[r, i, :2].tobytes()  # d
            qs = b[32:].reshape(4, 16, 4)[:, r % 16, :].reshape(16)
            assert qs.tobytes() == blocks[r, i, 2:].tobytes()


def test_repack_q5_0_and_q8_0_keep_every_quant():
    n_rows, n_cols = 32, 64
    w, _ = _case("Q5_0", n_rows, n_cols, 1, False)
    g = _repack(int(GT.Q5_0), w, n_rows, n_cols)
    assert g.nbytes == w.nbytes
    blocks, grp = w.reshape(n_rows, 2, 22), g.reshape(n_rows // 16, 2, 352)
    for r in (0, 5, 16, 31):
        for i in range(2):
            b, src, k = grp[r // 16, i], blocks[r, i], r % 16
            assert b[2 * k : 2 * k + 2].tobytes() == src[0:2].tobytes()
            assert b[96:].reshape(4, 16, 4)[:, k, :].tobytes() == src[6:].tobytes()
            qh = int.from_bytes(src[2:6].tobytes(), "little")
            hb = b[32:96].view("<u8").reshape(4, 2)
            for c in range(4):
                for j in range(4):
                    assert (int(hb[c, 0]) >> (4 * k + j)) & 1 == (qh >> (4 * c + j)) & 1
                    assert (int(hb[c, 1]) >> (4 * k + j)) & 1 == (qh >> (16 + 4 * c + j)) & 1
    w, _ = _case("Q8_0", n_rows, n_cols, 1, False)
    g = _repack(int(GT.Q8_0), w, n_rows, n_cols)
    blocks, grp = w.reshape(n_rows, 2, 34), g.reshape(n_rows // 16, 2, 544)
    for r in (0, 31):
        b, src, k = grp[r // 16, 1], blocks[r, 1], r % 16
        assert b[2 * k : 2 * k + 2].tobytes() == src[0:2].tobytes()
        assert b[32:].reshape(8, 16, 4)[:, k, :].tobytes() == src[2:].tobytes()


def test_repack_q4_K_moves_every_byte_once():
    n_rows, n_cols = 32, 512
    w, _ = _case("Q4_K", n_rows, n_cols, 1, False)
    g = _repack(int(GT.Q4_K), w, n_rows, n_cols)
    assert g.nbytes == w.nbytes
    blocks = w.reshape(n_rows, 2, 144)
    grp = g.reshape(n_rows // 16, 2, 2304)
    for r in (0, 9, 16, 31):
        for i in range(2):
            b, src, k = grp[r // 16, i], blocks[r, i], r % 16
            assert b[2 * k : 2 * k + 2].tobytes() == src[0:2].tobytes()  # d
            assert b[32 + 2 * k : 34 + 2 * k].tobytes() == src[2:4].tobytes()  # dmin
            scales = b[64:256].reshape(3, 16, 4)[:, k, :].reshape(12)
            assert scales.tobytes() == src[4:16].tobytes()
            assert b[256:].reshape(32, 16, 4)[:, k, :].tobytes() == src[16:].tobytes()


def test_repack_q5_K_moves_every_byte_once():
    n_rows, n_cols = 16, 256
    w, _ = _case("Q5_K", n_rows, n_cols, 1, False)
    g = _repack(int(GT.Q5_K), w, n_rows, n_cols)
    assert g.nbytes == w.nbytes == 16 * 176
    for r in (0, 9, 15):
        src = w[r]
        assert g[2 * r : 2 * r + 2].tobytes() == src[0:2].tobytes()  # d
        assert g[32 + 2 * r : 34 + 2 * r].tobytes() == src[2:4].tobytes()  # dmin
        assert g[64:256].reshape(3, 16, 4)[:, r, :].tobytes() == src[4:16].tobytes()  # scales
        assert g[256:768].reshape(8, 16, 4)[:, r, :].tobytes() == src[16:48].tobytes()  # qh
        assert g[768:].reshape(32, 16, 4)[:, r, :].tobytes() == src[48:].tobytes()  # qs


def test_repack_q6_K_keeps_every_value():
    """Each row's scales and d in place, and its 6-bit values (the file's q + 32) where the
    layout says: element 16j + 4c + k of row r in sub-block j's ql[c // 2][r][k] (nibble c % 2)
    and qh[r][k] (bits 2c, 2c + 1)."""
    n_rows, n_cols = 32, 512
    w, _ = _case("Q6_K", n_rows, n_cols, 1, True)
    g = _repack(int(GT.Q6_K), w, n_rows, n_cols)
    assert g.nbytes == w.nbytes == n_rows * 2 * 210
    blocks, grp = w.reshape(n_rows, 2, 210), g.reshape(n_rows // 16, 2, 3360)
    for r in (0, 9, 16, 31):
        for i in range(2):
            src, b, k = blocks[r, i], grp[r // 16, i], r % 16
            ql, qh = src[:128].astype(int), src[128:192].astype(int)
            # the file's 6-bit values in element order (llama.cpp's dequantize_row_q6_K)
            u = np.empty(256, int)
            for half in range(2):
                lo, hi = ql[64 * half : 64 * half + 64], qh[32 * half : 32 * half + 32]
                e = 128 * half + np.arange(32)
                u[e] = (lo[:32] & 15) | (hi & 3) << 4
                u[e + 32] = (lo[32:] & 15) | (hi >> 2 & 3) << 4
                u[e + 64] = (lo[:32] >> 4) | (hi >> 4 & 3) << 4
                u[e + 96] = (lo[32:] >> 4) | (hi >> 6 & 3) << 4
            assert b[2 * k : 2 * k + 2].tobytes() == src[208:210].tobytes()  # d
            assert b[32:288].reshape(16, 16)[:, k].tobytes() == src[192:208].tobytes()  # scales by sub-block
            sub = b[288:].reshape(16, 192).astype(int)
            got = np.empty(256, int)
            for j in range(16):
                lq, hq = sub[j, :128].reshape(2, 16, 4)[:, k, :], sub[j, 128:].reshape(16, 4)[k]
                for c in range(4):
                    got[16 * j + 4 * c : 16 * j + 4 * c + 4] = (lq[c // 2] >> 4 * (c % 2) & 15) | (hq >> 2 * c & 3) << 4
            assert np.array_equal(got, u)


@pytest.mark.parametrize("real", [False, True])
@pytest.mark.parametrize("tname, shape", CASES)
def test_grouped_bits_on_every_isa_alone_and_batched(pool1, each_isa, tname, shape, real):  # noqa: F811 (the fixture)
    n_rows, n_cols, n_tok = shape
    t = int(GT[tname])
    w, x = _case(tname, n_rows, n_cols, n_tok, real)
    g = _repack(t, w, n_rows, n_cols)
    batch = _grouped(pool1, t, g, n_rows, n_cols, x)
    alone = np.stack([_grouped(pool1, t, g, n_rows, n_cols, x[k : k + 1])[0] for k in range(n_tok)])
    assert np.array_equal(batch.view(np.uint32), alone.view(np.uint32)), f"{each_isa}: batch != alone"
    _native.set_isa("scalar")
    scalar = _grouped(pool1, t, g, n_rows, n_cols, x)
    _native.set_isa(each_isa)
    assert np.array_equal(batch.view(np.uint32), scalar.view(np.uint32)), (
        f"{each_isa} vs scalar: max |diff| {np.abs(batch - scalar).max()}"
    )
    # the file's row order: the same products, other float roundings
    ref = _row_order(pool1, t, w, n_rows, n_cols, x)
    assert np.abs(batch - ref).max() <= 2e-6 * np.abs(ref).max()


def test_grouped_threads_split_on_whole_groups():
    """2 and 3 threads split 48 rows (3 groups) at rows 24 / 16, 32: rounded to whole groups,
    every row is computed once, with the single thread's bits."""
    n_rows, n_cols, n_tok = 48, 576, 5
    t = int(GT.Q4_0)
    w, x = _case("Q4_0", n_rows, n_cols, n_tok, True)
    g = _repack(t, w, n_rows, n_cols)
    outs = []
    for n in (1, 2, 3):
        pool = _native.ffi.new("pi_pool **")
        _native.check(lib.pi_pool_create(n, pool), "pool")
        try:
            for nt in (1, n_tok):
                outs.append((n, nt, _grouped(pool[0], t, g, n_rows, n_cols, x[:nt])))
        finally:
            lib.pi_pool_free(pool[0])
    for n, nt, y in outs:
        want = next(o for m, k, o in outs if m == 1 and k == nt)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (n, nt)


NO_LAYOUT = [
    ("Q4_1", 16, 32),
    ("Q6_K", 24, 256),
    ("Q4_0", 17, 32),
    ("Q4_0", 8, 32),
    ("Q4_0", 16, 48),
    ("Q4_0", 0, 32),
    ("Q4_K", 16, 128),
]


@pytest.mark.parametrize("type_name, n_rows, n_cols", NO_LAYOUT)
def test_no_layout_is_refused_by_name(pool1, type_name, n_rows, n_cols):
    t = int(GT[type_name])
    assert lib.pi_repack_size(t, n_rows, n_cols) == -1
    buf = np.zeros(4096, np.uint8)
    with pytest.raises(NotImplementedError, match="no row-group layout"):
        _native.check(lib.pi_repack(t, ffi.from_buffer(buf), n_rows, n_cols, ffi.from_buffer(buf)), "pi_repack")
    x = np.zeros((1, 64), np.float32)
    y = np.zeros(64, np.float32)
    rc = lib.pi_op_matmul_grouped(
        pool1, t, ffi.from_buffer(buf), n_rows, n_cols, ffi.from_buffer("float[]", x), 1, ffi.from_buffer("float[]", y)
    )
    assert rc != 0 and "no row-group layout" in ffi.string(lib.pi_last_error()).decode()
