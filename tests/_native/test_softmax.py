"""The softmax kernels of the two llama.cpp builds (native/src/isa/softmax.h), chosen
with the F16 order (isa/select.c): its AVX2 build's exp over 8 lanes and its AVX-512
build's over 16, lanes summed in each build's order, chunk sums in double.

  * every ISA path gives the same bits for a given order (rows of 1..300 elements,
    masked cells, scores spread far enough to reach exp's underflow branches);
  * the order of the installed libggml-cpu's build equals its ggml_vec_soft_max_f32
    (then scaled by 1/sum, as ggml's soft_max op) bit for bit;
  * the two orders differ (their exp polynomials round differently) and both stay
    within float rounding of a float64 softmax.
"""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib

from tests.fixtures.ggml import ggml_cpu, ggml_soft_max

ORDERS = ("avx2", "avx512")
LENGTHS = range(1, 301)


def rows(n: int) -> np.ndarray:
    """Attention-like scores: a spread that reaches exp(-87..-104) (the two-step scaling
    and subnormal results) and beyond (zero), and masked cells at the end."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1.0, 8.0, 40.0])).astype(np.float32)
    if n > 4:
        x[rng.integers(0, n)] = x.max() - 95.0
        x[-(n // 5) :] = -np.inf
    return x


def ours(x: np.ndarray) -> np.ndarray:
    y = np.ascontiguousarray(x, dtype=np.float32).copy()
    _native.check(lib.pi_op_softmax(ffi.cast("float *", ffi.from_buffer(y)), y.size), "softmax")
    return y


def all_rows() -> list[np.ndarray]:
    return [ours(rows(n)) for n in LENGTHS]


@pytest.mark.parametrize("order", ORDERS)
def test_isa_paths_bit_identical(restore_order, order):
    _native.set_f16_order(order)
    ref = None
    for name in _native.supported_isas():
        _native.set_isa(name)
        out = all_rows()
        if ref is None:
            ref = out
            continue
        for n, a, b in zip(LENGTHS, out, ref):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name} != scalar ({order}, n={n})"


@pytest.mark.parametrize("order", ORDERS)
def test_close_to_float64(restore_order, order):
    _native.set_f16_order(order)
    for n in LENGTHS:
        x = rows(n)
        e = np.exp(x.astype(np.float64) - x.max())
        np.testing.assert_allclose(ours(x), e / e.sum(), rtol=3e-6, atol=1e-30, err_msg=f"n={n}")


def test_orders_differ(restore_order):
    out = {}
    for order in ORDERS:
        _native.set_f16_order(order)
        out[order] = all_rows()
    assert sum(not np.array_equal(a, b) for a, b in zip(out["avx2"], out["avx512"])) > 100


@pytest.mark.llama_cpp
@pytest.mark.skipif(ggml_soft_max() is None, reason="llama-cpp-python's libggml-cpu softmax not found")
def test_bit_identical_to_llama_cpp(restore_order):
    order = "avx512" if ggml_cpu().ggml_cpu_has_avx512() else "avx2"
    _native.set_f16_order(order)
    f = ggml_soft_max()
    for n in LENGTHS:
        x = rows(n)
        y = np.zeros_like(x)
        total = f(n, y.ctypes.data, x.ctypes.data, float(x.max()))
        ref = y * np.float32(1.0 / total)
        for name in _native.supported_isas():
            _native.set_isa(name)
            got = ours(x)
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (
                f"{name} {order} n={n}: {np.count_nonzero(got != ref)} cells differ"
            )
