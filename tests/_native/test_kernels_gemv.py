"""The single-token kernels of decode (isa/x86_gemv.h: Q4_K, Q6_K) against the per-row
reference: with one token pi_op_matmul runs them on the AVX
paths, and every output must have the bits of the scalar path's row dot (which equals the
AVX row dot and llama.cpp's, tests/_native/test_kernels_kquants.py) on random blocks
(every bit pattern of quants, scales and mins) and real quantized weights, for odd row
counts, ragged splits across the pool's chunks, and 1 to 35 super-blocks (Qwen2.5's
ffn_down). An ISA this CPU lacks is skipped."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from powerinfer_backend import _native

from tests._native.test_kernels_kquants import activations, native_matmul, weights
from tests.fixtures.ggml import ggml_base

lib = _native.lib

TYPES = ("Q4_K", "Q6_K")
# (n_rows, n_cols): 1, 3, 5, 6, 7, 37 rows; 1 to 35 super-blocks
SHAPES = [(1, 256), (3, 512), (7, 768), (37, 1280), (5, 2816), (6, 8960)]


@pytest.mark.parametrize("tname", TYPES)
@pytest.mark.parametrize("name", ["avx2", "avx512"])
def test_matvec_bit_identical_to_row_dot(pool, tname, name):
    if name not in _native.supported_isas():
        pytest.skip(f"this CPU lacks {name}")
    for n_rows, n_cols in SHAPES:
        for real in (False, True):
            if real and ggml_base() is None:
                continue  # real K-quant weights need llama-cpp-python's libggml-base
            _, wq = weights(tname, n_rows, n_cols, real=real)
            x = activations(1, n_cols, n_rows + n_cols)
            try:
                _native.set_isa("scalar")
                ref = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
                _native.set_isa(name)
                assert lib.pi_matmul_has_matvec(int(GT[tname])) == 1, f"{name}: no {tname} matvec"
                got = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
            finally:
                _native.set_isa("auto")
            assert np.isfinite(ref).all()
            bad = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
            assert bad.size == 0, (
                f"{name} {tname} real={real} {n_rows}x{n_cols}: rows {bad[:4].tolist()} differ, "
                f"max |diff| {np.abs(got - ref).max():.3g}"
            )


def test_no_matvec_elsewhere():
    assert lib.pi_matmul_has_matvec(int(GT.Q8_K)) == 0  # an activation type
    assert lib.pi_matmul_has_matvec(int(GT.F32)) == 0  # the row loop
    assert lib.pi_matmul_has_matvec(int(GT.Q8_0)) == 0  # the row loop (two rows per step were slower)
    assert lib.pi_matmul_has_matvec(-1) == 0
    try:
        _native.set_isa("scalar")
        assert lib.pi_matmul_has_matvec(int(GT.Q4_K)) == 0  # the scalar path is the reference
    finally:
        _native.set_isa("auto")
