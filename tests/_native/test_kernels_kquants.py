"""Q5_0 and K-quant (Q4_K, Q5_K, Q6_K) kernels: dequantization, the Q8_K activation
quantizer and the dot products, on every instruction-set path the CPU has.

References:
  * dequantization: gguf.quants.dequantize (the GGUF package's numpy decoder);
  * Q8_K: a numpy transcription of the format (the element of largest magnitude
    maps to -127, d = 1 / (-127 / vmax), q = round-half-even(x * -127 / vmax),
    bsums = sums of each 16 quants); bytes must match on every ISA;
  * dot products: the float64 product of the decoded weights and decoded
    activations (only float32 accumulation differs), and the unquantized float64
    product within a per-type bound; every ISA gives identical bits;
  * where llama-cpp-python's libggml-cpu is installed, our rows equal llama.cpp's
    own x86 kernels bit for bit on the same bytes, and our Q8_K bytes equal its
    quantizer's.

Weights are random blocks (every bit pattern of quants and scales) and, where
libggml-base is installed, real K-quantized Gaussian weights (llama.cpp's
quantizer through ggml_quantize_chunk).
"""

from __future__ import annotations

import ctypes
import zlib

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native

from tests.fixtures.tiny_gguf import random_quantized
from tests.fixtures.ggml import GGML_VEC_DOT, ggml_base, ggml_cpu

ffi, lib = _native.ffi, _native.lib

TYPES = ("Q5_0", "Q4_K", "Q5_K", "Q6_K")
ACT = {"Q5_0": GT.Q8_0, "Q4_K": GT.Q8_K, "Q5_K": GT.Q8_K, "Q6_K": GT.Q8_K}
QK_K = 256
# (n_rows, n_cols, n_tok): one super-block, several, prefill-sized token counts
SHAPES = [(1, 256, 1), (7, 512, 3), (33, 1024, 2), (4, 2816, 5)]
RTOL_EXACT = 1e-5
# |y - W x| <= tol * ||w|| * ||x|| for real (quantized Gaussian) weights
TOL_LOOSE = {"Q5_0": 0.015, "Q4_K": 0.025, "Q5_K": 0.015, "Q6_K": 0.01}  # measured 0.0043, 0.0072, 0.0046, 0.0025


# ---- helpers ---------------------------------------------------------------------------


def _f32p(a: np.ndarray):
    return ffi.cast("float *", ffi.from_buffer(a))


def row_bytes(t, n: int) -> int:
    block, size = GGML_QUANT_SIZES[t]
    return n // block * size


def native_quantize(t, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.zeros(row_bytes(t, x.size), np.uint8)
    _native.check(lib.pi_op_quantize(int(t), _f32p(x), x.size, ffi.from_buffer(y)), "pi_op_quantize")
    return y


def native_matmul(pool, t, wq: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], n_rows), np.nan, np.float32)
    wb = np.ascontiguousarray(wq)
    _native.check(
        lib.pi_op_matmul(pool, int(t), ffi.from_buffer(wb), n_rows, n_cols, _f32p(x), x.shape[0], _f32p(y)),
        "pi_op_matmul",
    )
    return y


def ref_q8_K(x: np.ndarray) -> np.ndarray:
    """Q8_K bytes of x (n a multiple of 256): float d, int8 qs[256], int16 bsums[16]."""
    blocks = x.astype(np.float32).reshape(-1, QK_K)
    out = np.zeros((blocks.shape[0], 292), np.uint8)
    for i, b in enumerate(blocks):
        a = np.abs(b)
        if a.max() == 0:
            continue  # all zero
        vmax = b[int(np.argmax(a))]  # first of the largest magnitude
        iscale = np.float32(-127.0) / vmax
        q = np.minimum(np.rint(iscale * b), 127).astype(np.int8)  # rint: half to even
        out[i, 0:4] = np.array([np.float32(1.0) / iscale], np.float32).view(np.uint8)
        out[i, 4:260] = q.view(np.uint8)
        out[i, 260:292] = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype("<i2").view(np.uint8)
    return out.reshape(-1)


def weights(tname: str, n_rows: int, n_cols: int, real: bool):
    """(float weights or None, quantized bytes (n_rows, row bytes))."""
    t = GT[tname]
    rng = np.random.default_rng(zlib.crc32(f"{tname}-{n_rows}-{n_cols}-{real}".encode()))
    if not real:
        return None, random_quantized(np.zeros((n_rows, n_cols), np.float32), t, rng)
    w = (rng.standard_normal((n_rows, n_cols)) * 0.05).astype(np.float32)
    if tname == "Q5_0":
        return w, quants.quantize(w, t)
    g = ggml_base()
    out = np.zeros((n_rows, row_bytes(t, n_cols)), np.uint8)
    g.ggml_quantize_chunk(int(t), w.ctypes.data, out.ctypes.data, 0, n_rows, n_cols, None)
    return w, out


def ggml_rows(tname: str, wq: np.ndarray, xa: np.ndarray, n_cols: int) -> np.ndarray:
    tr = ggml_cpu().ggml_get_type_traits_cpu(int(GT[tname])).contents
    if tr.vec_dot_type != int(ACT[tname]) or not tr.vec_dot:
        pytest.skip("unexpected ggml_type_traits_cpu layout")
    dot = GGML_VEC_DOT(tr.vec_dot)
    out = np.zeros((xa.shape[0], wq.shape[0]), np.float32)
    r = ctypes.c_float()
    for t in range(xa.shape[0]):
        for i in range(wq.shape[0]):
            dot(n_cols, ctypes.byref(r), 0, wq[i].ctypes.data, 0, xa[t].ctypes.data, 0, 1)
            out[t, i] = r.value
    return out


def activations(n_tok: int, n_cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    x[:, ::37] *= 8  # outliers, as real activations have
    return x


# ---- dequantization --------------------------------------------------------------------


@pytest.mark.parametrize("tname", TYPES)
def test_dequantize_matches_gguf(tname):
    t = GT[tname]
    _, wq = weights(tname, 6, 512, real=False)
    ref = quants.dequantize(wq, t).astype(np.float64)
    flat = np.ascontiguousarray(wq).reshape(-1)
    y = np.full(6 * 512, np.nan, np.float32)
    _native.check(lib.pi_op_dequantize(int(t), ffi.from_buffer(flat), y.size, _f32p(y)), "pi_op_dequantize")
    np.testing.assert_allclose(y.reshape(6, 512), ref, rtol=2e-7, atol=1e-30)


def test_dequantize_rejects_bad_input():
    y = np.zeros(256, np.float32)
    buf = np.zeros(1024, np.uint8)
    with pytest.raises(ValueError, match="multiple of 256"):
        _native.check(lib.pi_op_dequantize(int(GT.Q4_K), ffi.from_buffer(buf), 128, _f32p(y)), "x")
    with pytest.raises(NotImplementedError, match="not a weight type"):
        _native.check(lib.pi_op_dequantize(int(GT.Q8_K), ffi.from_buffer(buf), 256, _f32p(y)), "x")


# ---- Q8_K activations --------------------------------------------------------------------


def q8k_rows(rng) -> np.ndarray:
    x = rng.standard_normal(8 * QK_K).astype(np.float32) * np.float32(3.0)
    b = x.reshape(-1, QK_K)
    b[0] = 0.0  # all zero: d = 0
    b[1, 10] = -50.0  # largest magnitude negative
    b[2] = np.linspace(-127, 127, QK_K).astype(np.float32)  # ties after scaling
    b[3, :] = 1.0  # constant
    b[4] *= np.float32(1e-30)  # tiny
    b[5, 3] = b[5, 7] = 9.0  # repeated maximum
    return x


def test_quantize_q8_K_matches_reference(isa):
    x = q8k_rows(np.random.default_rng(5))
    got = native_quantize(GT.Q8_K, x)
    np.testing.assert_array_equal(got, ref_q8_K(x))


def test_quantize_q8_K_same_bytes_every_isa():
    """The x86 quantizer is a twin of the scalar one: same bytes, NaN and inf included."""
    x = q8k_rows(np.random.default_rng(7))
    b = x.reshape(-1, QK_K)
    b[6, 5] = np.nan  # a NaN never becomes the maximum
    b[6, 9] = -np.inf  # the maximum: iscale -0, inf * -0 is NaN
    b[7, ::3] = np.nan
    b[7, 200] = -0.0
    ref = None
    for name in _native.supported_isas():
        _native.set_isa(name)
        try:
            got = native_quantize(GT.Q8_K, x)
        finally:
            _native.set_isa("auto")
        if ref is None:
            ref = got
        np.testing.assert_array_equal(got, ref, err_msg=name)


@pytest.mark.llama_cpp
@pytest.mark.skipif(ggml_cpu() is None, reason="llama-cpp-python's libggml-cpu not found")
def test_quantize_q8_K_bit_identical_to_llama_cpp(isa):
    x = q8k_rows(np.random.default_rng(6))
    tr = ggml_cpu().ggml_get_type_traits_cpu(int(GT.Q8_K)).contents
    ref = np.zeros(row_bytes(GT.Q8_K, x.size), np.uint8)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(tr.from_float)(
        x.ctypes.data, ref.ctypes.data, x.size
    )
    np.testing.assert_array_equal(native_quantize(GT.Q8_K, x), ref)


# ---- dot products -------------------------------------------------------------------------


@pytest.mark.parametrize("tname", TYPES)
@pytest.mark.parametrize("n_rows,n_cols,n_tok", SHAPES)
def test_matmul_matches_reference(pool, tname, n_rows, n_cols, n_tok):
    t = GT[tname]
    _, wq = weights(tname, n_rows, n_cols, real=False)
    x = activations(n_tok, n_cols, n_rows * n_cols + n_tok)
    wd = quants.dequantize(wq, t).astype(np.float64)
    xa = np.stack([native_quantize(ACT[tname], x[i]) for i in range(n_tok)])
    xd = (
        quants.dequantize(xa, ACT[tname]).astype(np.float64)
        if ACT[tname] == GT.Q8_0
        else np.stack([_decode_q8_K(xa[i]) for i in range(n_tok)])
    )
    exact = xd @ wd.T
    scale = np.abs(xd) @ np.abs(wd).T
    first = None
    for name in _native.supported_isas():
        _native.set_isa(name)
        try:
            y = native_matmul(pool, t, wq, n_rows, n_cols, x)
        finally:
            _native.set_isa("auto")
        err = np.abs(y - exact)
        assert (err <= RTOL_EXACT * scale).all(), f"{name}: max err/scale {np.max(err / scale):.3g}"
        if first is None:
            first = y
        else:  # every ISA path takes the same float operations
            assert np.array_equal(y.view(np.uint32), first.view(np.uint32)), name


def _decode_q8_K(b: np.ndarray) -> np.ndarray:
    blocks = b.reshape(-1, 292)
    d = blocks[:, 0:4].copy().view(np.float32).astype(np.float64)
    q = blocks[:, 4:260].view(np.int8).astype(np.float64)
    return (q * d).reshape(-1)


@pytest.mark.real
@pytest.mark.skipif(ggml_base() is None, reason="llama-cpp-python's libggml-base not found")
@pytest.mark.parametrize("tname", TYPES)
def test_matmul_real_weights_close_to_float(pool, tname):
    n_rows, n_cols, n_tok = 64, 1024, 3
    w, wq = weights(tname, n_rows, n_cols, real=True)
    x = activations(n_tok, n_cols, 11)
    y = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
    y_true = x.astype(np.float64) @ w.astype(np.float64).T
    bound = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(w, axis=1)[None, :]
    rel = np.abs(y - y_true) / bound
    assert rel.max() <= TOL_LOOSE[tname], f"{tname}: max |y - Wx| / (|w||x|) = {rel.max():.3g}"


@pytest.mark.llama_cpp
@pytest.mark.skipif(ggml_cpu() is None, reason="llama-cpp-python's libggml-cpu not found")
@pytest.mark.parametrize("tname", TYPES)
def test_rows_bit_identical_to_llama_cpp(pool, tname):
    for real in (False, True):
        if real and ggml_base() is None:
            continue
        for n_rows, n_cols, n_tok in [(16, 512, 2), (8, 2816, 1)]:
            _, wq = weights(tname, n_rows, n_cols, real=real)
            x = activations(n_tok, n_cols, 3)
            xa = np.stack([native_quantize(ACT[tname], x[i]) for i in range(n_tok)])
            ref = ggml_rows(tname, np.ascontiguousarray(wq), xa, n_cols)
            for name in _native.supported_isas():
                _native.set_isa(name)
                try:
                    y = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
                finally:
                    _native.set_isa("auto")
                assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (
                    f"{name} {tname} real={real} {n_rows}x{n_cols}: max |diff| {np.abs(y - ref).max():.3g}"
                )


def test_matmul_rejects_partial_super_block(pool):
    wq = np.zeros(144, np.uint8)
    x = np.zeros((1, 128), np.float32)
    y = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="not a multiple of 256 for q4_K"):
        _native.check(
            lib.pi_op_matmul(pool, int(GT.Q4_K), ffi.from_buffer(wq), 1, 128, _f32p(x), 1, _f32p(y)), "pi_op_matmul"
        )
    with pytest.raises(NotImplementedError, match="unsupported weight type 15"):
        _native.check(
            lib.pi_op_matmul(pool, int(GT.Q8_K), ffi.from_buffer(wq), 1, 256, _f32p(x), 1, _f32p(y)), "pi_op_matmul"
        )


@pytest.mark.parametrize("tname", ["Q4_K", "Q6_K"])
def test_transpose_kquant_source(tname):
    t = GT[tname]
    _, wq = weights(tname, 64, 512, real=False)
    ref = quants.dequantize(wq, t).T
    out = np.full((512, 64), np.nan, np.float32)
    _native.check(
        lib.pi_op_transpose_to(0, ffi.from_buffer(np.ascontiguousarray(wq)), int(t), 64, 512, ffi.from_buffer(out)),
        "pi_op_transpose_to",
    )
    np.testing.assert_array_equal(out, ref.astype(np.float32))
