"""The tiled prefill kernels of Q5_0 and the K-quants (several weight rows x several
tokens per step, isa/x86_tiles.h and scalar.c) against the row dot of decode: a batch of
tokens must give every token the same float bits as that token alone (pi_op_matmul with
one token runs the row dot), on every instruction-set path this CPU has, for shapes
whose rows, tokens and n_cols are not multiples of the tile (rows x tokens: scalar 1 x 4,
AVX2 1 x 8, AVX-512 2 x 8; a pool thread's rows come in runs of 16). An ISA this CPU
lacks is skipped."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from powerinfer_backend import _native

from tests._native.test_kernels_kquants import activations, native_matmul, weights
from tests.fixtures.ggml import ggml_base

ffi, lib = _native.ffi, _native.lib

TYPES = ("Q5_0", "Q4_K", "Q5_K", "Q6_K")
# (n_rows, n_cols, n_tok): n_cols in super-blocks of 256 (K-quants) or blocks of 32 (Q5_0)
SHAPES = {"K": [(1, 256, 2), (5, 768, 3), (37, 512, 9), (18, 1280, 6)],
          "Q5_0": [(1, 32, 2), (7, 96, 5), (37, 640, 9), (18, 288, 4)]}


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def each_isa(request):
    if request.param not in _native.supported_isas():
        pytest.skip(f"this CPU lacks {request.param}")
    _native.set_isa(request.param)
    try:
        yield request.param
    finally:
        _native.set_isa("auto")


@pytest.mark.parametrize("tname", TYPES)
def test_tiles_bit_identical_to_row_dot(pool, each_isa, tname):
    isa = each_isa
    assert lib.pi_matmul_has_tiles(int(GT[tname])) == 1, f"{isa}: no tiled {tname} kernel"
    for n_rows, n_cols, n_tok in SHAPES["Q5_0" if tname == "Q5_0" else "K"]:
        for real in (False, True):
            if real and tname != "Q5_0" and ggml_base() is None:
                continue  # real K-quant weights need llama-cpp-python's libggml-base
            _, wq = weights(tname, n_rows, n_cols, real=real)
            x = activations(n_tok, n_cols, n_rows + 7 * n_tok)
            batch = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
            rows = np.concatenate([native_matmul(pool, GT[tname], wq, n_rows, n_cols, x[t:t + 1])
                                   for t in range(n_tok)])
            assert np.isfinite(batch).all()
            bad = np.argwhere(batch.view(np.uint32) != rows.view(np.uint32))
            assert bad.size == 0, (f"{isa} {tname} real={real} {n_rows}x{n_cols}x{n_tok}: "
                                   f"(token, row) {bad[:4].tolist()} differ, max |diff| "
                                   f"{np.abs(batch - rows).max():.3g}")


def test_no_tiles_for_other_types():
    assert lib.pi_matmul_has_tiles(int(GT.Q8_K)) == 0  # an activation type
    assert lib.pi_matmul_has_tiles(int(GT.F32)) == 0   # no tiled kernel: the row loop
    assert lib.pi_matmul_has_tiles(-1) == 0
