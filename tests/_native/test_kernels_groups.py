"""Row groups (pi_repack / pi_op_matmul_grouped; pi_internal.h "Row groups", isa/x86_groups.h
and scalar.c): Q4_0 matrices laid out as 16 interleaved rows. Every ISA path this CPU has
gives the scalar path's bits; a token's outputs are the same bits alone and in any batch
(1 to 17 tokens: every AVX token tile, full and partial) and for any thread count (part
boundaries round down to whole groups); the values agree with the file's row order to
float rounding; shapes and types without the layout are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from powerinfer_backend import _native

from tests._native.test_kernels_tiles import block32_weights, each_isa  # noqa: F401 (fixture)

ffi, lib = _native.ffi, _native.lib
Q4_0 = int(GT.Q4_0)
# (n_rows, n_cols, n_tok): one block, SmolLM2's n_embd, tokens ending on each tile size
SHAPES = [(16, 32, 1), (48, 576, 17), (32, 96, 9), (64, 640, 4), (160, 256, 3), (16, 64, 6)]


def _repack(w: np.ndarray, n_rows: int, n_cols: int) -> np.ndarray:
    g = np.empty(lib.pi_repack_size(Q4_0, n_rows, n_cols), np.uint8)
    _native.check(lib.pi_repack(Q4_0, ffi.from_buffer(w), n_rows, n_cols, ffi.from_buffer(g)), "pi_repack")
    return g


def _grouped(pool, g: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty((x.shape[0], n_rows), np.float32)
    rc = lib.pi_op_matmul_grouped(
        pool,
        Q4_0,
        ffi.from_buffer(g),
        n_rows,
        n_cols,
        ffi.from_buffer("float[]", x),
        x.shape[0],
        ffi.from_buffer("float[]", y),
    )
    _native.check(rc, "pi_op_matmul_grouped")
    return y


def _row_order(pool, w, n_rows, n_cols, x) -> np.ndarray:
    y = np.empty((x.shape[0], n_rows), np.float32)
    rc = lib.pi_op_matmul(
        pool,
        Q4_0,
        ffi.from_buffer(w),
        n_rows,
        n_cols,
        ffi.from_buffer("float[]", x),
        x.shape[0],
        ffi.from_buffer("float[]", y),
    )
    _native.check(rc, "pi_op_matmul")
    return y


def _case(n_rows, n_cols, n_tok, real):
    w = np.ascontiguousarray(block32_weights("Q4_0", n_rows, n_cols, real))
    x = np.random.default_rng(n_rows + n_cols).standard_normal((n_tok, n_cols)).astype(np.float32)
    x[:, ::7] *= 4  # larger activations: quantized activations near +-127
    return w, x


def test_repack_moves_every_byte_once():
    n_rows, n_cols = 32, 96
    w, _ = _case(n_rows, n_cols, 1, False)
    g = _repack(w, n_rows, n_cols)
    assert g.nbytes == w.nbytes == n_rows * (n_cols // 32) * 18
    blocks = w.reshape(n_rows, n_cols // 32, 18)
    grp = g.reshape(n_rows // 16, n_cols // 32, 288)
    for r in (0, 7, 16, 31):
        for i in range(n_cols // 32):
            b = grp[r // 16, i]
            assert b[2 * (r % 16) : 2 * (r % 16) + 2].tobytes() == blocks[r, i, :2].tobytes()  # d
            qs = b[32:].reshape(4, 16, 4)[:, r % 16, :].reshape(16)
            assert qs.tobytes() == blocks[r, i, 2:].tobytes()


@pytest.mark.parametrize("real", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_bits_on_every_isa_alone_and_batched(pool1, each_isa, shape, real):  # noqa: F811 (the fixture)
    n_rows, n_cols, n_tok = shape
    w, x = _case(n_rows, n_cols, n_tok, real)
    g = _repack(w, n_rows, n_cols)
    batch = _grouped(pool1, g, n_rows, n_cols, x)
    alone = np.stack([_grouped(pool1, g, n_rows, n_cols, x[t : t + 1])[0] for t in range(n_tok)])
    assert np.array_equal(batch.view(np.uint32), alone.view(np.uint32)), f"{each_isa}: batch != alone"
    _native.set_isa("scalar")
    scalar = _grouped(pool1, g, n_rows, n_cols, x)
    _native.set_isa(each_isa)
    assert np.array_equal(batch.view(np.uint32), scalar.view(np.uint32)), (
        f"{each_isa} vs scalar: max |diff| {np.abs(batch - scalar).max()}"
    )
    # the file's row order: the same products, other float roundings
    ref = _row_order(pool1, w, n_rows, n_cols, x)
    assert np.abs(batch - ref).max() <= 2e-6 * np.abs(ref).max()


def test_grouped_threads_split_on_whole_groups():
    """2 and 3 threads split 48 rows (3 groups) at rows 24 / 16, 32: rounded to whole groups,
    every row is computed once, with the single thread's bits."""
    n_rows, n_cols, n_tok = 48, 576, 5
    w, x = _case(n_rows, n_cols, n_tok, True)
    g = _repack(w, n_rows, n_cols)
    outs = []
    for n in (1, 2, 3):
        pool = _native.ffi.new("pi_pool **")
        _native.check(lib.pi_pool_create(n, pool), "pool")
        try:
            for nt in (1, n_tok):
                outs.append((n, nt, _grouped(pool[0], g, n_rows, n_cols, x[:nt])))
        finally:
            lib.pi_pool_free(pool[0])
    for n, nt, y in outs:
        want = next(o for m, k, o in outs if m == 1 and k == nt)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (n, nt)


NO_LAYOUT = [("Q4_1", 16, 32), ("Q4_0", 17, 32), ("Q4_0", 8, 32), ("Q4_0", 16, 48), ("Q4_0", 0, 32)]


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
