"""Dot-product and activation-conversion kernels (native/src/isa/*.c), tested
through pi_op_matmul and pi_op_quantize on every instruction-set path the CPU has.

References:
  * weights are quantized with gguf.quants (the GGUF reference quantizers);
  * activations are quantized in numpy exactly as llama.cpp's x86 quantizers do
    (ref_q8_0 / ref_q8_1: d = amax/127, q = round-half-to-even(x * (127/amax)),
    Q8_1 adds s = fp16(d * sum(q))); the bytes must match on every ISA. They differ
    from gguf.quants' Q8_0 (llama.cpp's portable reference, which scales by 1/d
    and rounds half away from zero) by one step in a few values at most;
  * the "exact" reference evaluates the kernel's formula in float64 on the decoded
    blocks: sum over blocks of d_w * d_x * sum(q_w * q_x) (+ m_w * s_x for Q4_1),
    so the only allowed difference is float32 rounding (1e-5 of the row's
    absolute-sum scale);
  * the loose reference is the unquantized float64 product, with a bound per type
    of |y - W x| <= tol * ||w_row|| * ||x||;
  * Q4_0 / Q4_1 / Q8_0 / F16 rows give identical bits on every ISA, and where
    llama-cpp-python's libggml-cpu is installed they must equal llama.cpp's own
    x86 vec_dot kernels bit for bit on the same activation bytes (F16: against a
    ggml build of the F16 order in use, which follows the CPU; docs/parity.md).

The `isa` fixture (conftest.py) runs each test once per supported ISA and puts the
choice back to "auto" afterwards.
"""

from __future__ import annotations

import ctypes
import functools
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native

from tests.fixtures.ggml import GGML_VEC_DOT, ggml_cpu

ffi, lib = _native.ffi, _native.lib

QK = 32
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q8_0")
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES
ACT_TYPE = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q8_0": "Q8_0"}
TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q8_1": 9, "BF16": 30}

# (n_rows, n_cols, n_tok): cover single rows, odd row counts, one block, block
# counts that are not a multiple of the 2-block / 4-way SIMD tiles, and prefill.
QUANT_SHAPES = [(1, 32, 1), (7, 96, 3), (33, 576, 1), (5, 1056, 17), (33, 1056, 3), (4, 64, 2), (3, 160, 1)]
# float rows take any length: tails of 1..63 elements after the vector loops
FLOAT_SHAPES = QUANT_SHAPES + [(1, 1, 1), (3, 33, 2), (7, 577, 1), (2, 1000, 5), (5, 15, 3), (2, 127, 1)]

RTOL_EXACT = 1e-5  # of the absolute-sum scale: float32 accumulation only
# |y - W x| <= tol * ||w|| * ||x||: weight + activation rounding of each type
TOL_LOOSE = {"F32": 1e-5, "F16": 2e-3, "BF16": 1.5e-2, "Q8_0": 2e-2, "Q4_0": 0.15, "Q4_1": 0.15}


# ---- native calls ------------------------------------------------------------------


def native_matmul(pool, tname: str, wbytes: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_tok = x.shape[0]
    wb = np.ascontiguousarray(wbytes)
    y = np.full((n_tok, n_rows), np.nan, dtype=np.float32)
    rc = lib.pi_op_matmul(
        pool,
        TYPE_ID[tname],
        ffi.from_buffer(wb),
        n_rows,
        n_cols,
        ffi.from_buffer("float[]", x),
        n_tok,
        ffi.from_buffer("float[]", y),
    )
    _native.check(rc, "pi_op_matmul")
    return y


def native_quantize(tname: str, x: np.ndarray) -> np.ndarray:
    """pi_op_quantize into a byte array of the type's row size."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    n = x.size
    nbytes = {"F32": 4 * n, "F16": 2 * n, "BF16": 2 * n, "Q8_0": n // QK * 34, "Q8_1": n // QK * 36}[tname]
    y = np.zeros(nbytes, dtype=np.uint8)
    _native.check(
        lib.pi_op_quantize(TYPE_ID[tname], ffi.from_buffer("float[]", x), n, ffi.from_buffer(y)), "pi_op_quantize"
    )
    return y


# ---- numpy references ---------------------------------------------------------------


def quantize_weights(tname: str, w: np.ndarray) -> np.ndarray:
    if tname == "F32":
        return w.astype(np.float32)
    if tname == "F16":
        return w.astype(np.float16)
    return quants.quantize(w, getattr(GT, tname))


def dequantize_weights(tname: str, wq: np.ndarray) -> np.ndarray:
    if tname in ("F32", "F16"):
        return wq.astype(np.float64)
    return quants.dequantize(wq, getattr(GT, tname)).astype(np.float64)


def ref_q8_blocks(x: np.ndarray):
    """llama.cpp's x86 Q8 activation quantizer in float32, per block of 32:
    d = amax / 127, id = 127 / amax (0 when amax = 0; not 1 / d), q = x * id rounded
    to nearest with ties to even (np.round). Returns (d float32 before its fp16
    rounding [..., b], q int8 [..., b, 32])."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(*x.shape[:-1], -1, QK)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.round(blocks * inv[..., None])
    assert q.dtype == np.float32 and d.dtype == np.float32
    return d, q.astype(np.int8)


def ref_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 activation rows (n/32 blocks of 34 bytes) from :func:`ref_q8_blocks`."""
    d, q = ref_q8_blocks(x)
    out = np.concatenate([d.astype(np.float16)[..., None].view(np.uint8), q.view(np.uint8)], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


def ref_q8_1(x: np.ndarray) -> np.ndarray:
    """Q8_1 activation rows: Q8_0's d and qs, plus s = fp16(sum(qs) * d) with the
    float32 d before its fp16 rounding. Rows of n/32 blocks of 36 bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    q8 = ref_q8_0(x).reshape(*x.shape[:-1], -1, 34)
    d32, q = ref_q8_blocks(x)
    qsum = q.astype(np.int32).sum(axis=-1)
    with np.errstate(over="ignore"):  # s may overflow fp16 to inf, as in C
        s = (qsum.astype(np.float32) * d32).astype(np.float16)
    out = np.concatenate([q8[..., :2], s[..., None].view(np.uint8), q8[..., 2:]], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


def f16_bits(a: np.ndarray) -> np.ndarray:
    """[..., 2] little-endian bytes -> [...] float64"""
    return np.ascontiguousarray(a).view(np.float16)[..., 0].astype(np.float64)


def decode_blocks(tname: str, data: np.ndarray):
    """Rows of blocks -> (d, m or s or None, signed quants), all float64 / int64."""
    if tname == "Q4_0":
        b = data.reshape(*data.shape[:-1], -1, 18)
        qs = b[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64) - 8
        return f16_bits(b[..., 0:2]), None, q
    if tname == "Q4_1":
        b = data.reshape(*data.shape[:-1], -1, 20)
        qs = b[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)
        return f16_bits(b[..., 0:2]), f16_bits(b[..., 2:4]), q
    if tname == "Q8_0":
        b = data.reshape(*data.shape[:-1], -1, 34)
        return f16_bits(b[..., 0:2]), None, b[..., 2:].copy().view(np.int8).astype(np.int64)
    if tname == "Q8_1":
        b = data.reshape(*data.shape[:-1], -1, 36)
        return (f16_bits(b[..., 0:2]), f16_bits(b[..., 2:4]), b[..., 4:].copy().view(np.int8).astype(np.int64))
    raise ValueError(tname)


def quantize_activations(tname: str, x: np.ndarray):
    """The activation row the kernel sees, as float64 values for float types and as
    raw blocks for quantized types."""
    act = ACT_TYPE[tname]
    if act == "F32":
        return x.astype(np.float64)
    if act == "F16":
        return x.astype(np.float16).astype(np.float64)
    if act == "BF16":
        return quants.dequantize(quants.quantize(x, GT.BF16), GT.BF16).astype(np.float64)
    if act == "Q8_0":
        return ref_q8_0(x)
    return ref_q8_1(x)


def exact_reference(tname: str, wq: np.ndarray, x: np.ndarray):
    """(y, scale): the kernel's formula in float64 and sum of |terms| per output."""
    xa = quantize_activations(tname, x)
    if tname in FLOAT_TYPES:
        w = dequantize_weights(tname, wq)
        return xa @ w.T, np.abs(xa) @ np.abs(w).T
    dw, mw, qw = decode_blocks(tname, wq)  # [r, b], [r, b, 32]
    dx, sx, qx = decode_blocks(ACT_TYPE[tname], xa)  # [t, b], [t, b, 32]
    isum = np.einsum("rbj,tbj->trb", qw, qx)
    iabs = np.einsum("rbj,tbj->trb", np.abs(qw), np.abs(qx))
    dd = dx[:, None, :] * dw[None, :, :]
    y = (isum * dd).sum(-1)
    scale = (iabs * np.abs(dd)).sum(-1)
    if mw is not None:
        ms = sx[:, None, :] * mw[None, :, :]
        y = y + ms.sum(-1)
        scale = scale + np.abs(ms).sum(-1)
    return y, scale


def make_inputs(seed: int, n_rows: int, n_cols: int, n_tok: int):
    rng = np.random.default_rng(seed)
    # rows and tokens of different magnitudes, some offset (exercises Q4_1's m)
    w = rng.standard_normal((n_rows, n_cols)) * rng.uniform(0.01, 2.0, (n_rows, 1))
    w += rng.uniform(-0.5, 0.5, (n_rows, 1)) * (rng.random((n_rows, 1)) < 0.5)
    x = rng.standard_normal((n_tok, n_cols)) * rng.uniform(0.1, 10.0, (n_tok, 1))
    if n_cols >= 2 * QK:  # an all-zero block: d = 0 on both sides
        w[:, QK : 2 * QK] = 0.0
        x[:, QK : 2 * QK] = 0.0
    return w.astype(np.float32), x.astype(np.float32)


@functools.lru_cache(maxsize=None)
def case(tname: str, n_rows: int, n_cols: int, n_tok: int):
    """Inputs and references, shared by the per-ISA runs of the same case."""
    w, x = make_inputs(zlib.crc32(f"{tname}-{n_rows}-{n_cols}-{n_tok}".encode()), n_rows, n_cols, n_tok)
    wq = quantize_weights(tname, w)
    y_exact, scale = exact_reference(tname, wq, x)
    return w, x, wq, y_exact, scale


def all_cases():
    for t in ALL_TYPES:
        for shape in FLOAT_SHAPES if t in FLOAT_TYPES else QUANT_SHAPES:
            yield pytest.param(t, *shape, id=f"{t}-{shape[0]}x{shape[1]}x{shape[2]}")


# ---- matmul --------------------------------------------------------------------------


@pytest.mark.parametrize("tname,n_rows,n_cols,n_tok", list(all_cases()))
def test_matmul_matches_reference(isa, pool1, tname, n_rows, n_cols, n_tok):
    w, x, wq, y_exact, scale = case(tname, n_rows, n_cols, n_tok)
    y = native_matmul(pool1, tname, wq, n_rows, n_cols, x)
    assert np.isfinite(y).all()
    err = np.abs(y - y_exact)
    assert (err <= RTOL_EXACT * scale + 1e-30).all(), (
        f"{isa} {tname}: max err/scale {np.max(err / (scale + 1e-30)):.3g}"
    )
    # against the unquantized product: quantization error only
    y_true = x.astype(np.float64) @ w.astype(np.float64).T
    bound = (
        TOL_LOOSE[tname]
        * np.linalg.norm(x.astype(np.float64), axis=1)[:, None]
        * np.linalg.norm(w.astype(np.float64), axis=1)[None, :]
    )
    assert (np.abs(y - y_true) <= bound + 1e-30).all()


@pytest.mark.parametrize("tname", ALL_TYPES)
def test_isa_paths_agree(pool1, tname):
    """Every SIMD path gives the scalar path's result up to float rounding."""
    isas = _native.supported_isas()
    n_rows, n_cols, n_tok = (9, 1056, 3) if tname in QUANT_TYPES else (9, 1057, 3)
    w, x, wq, _, scale = case(tname, n_rows, n_cols, n_tok)
    ys = {}
    try:
        for name in isas:
            _native.set_isa(name)
            ys[name] = native_matmul(pool1, tname, wq, n_rows, n_cols, x)
    finally:
        _native.set_isa("auto")
    for name in isas:
        assert (np.abs(ys[name] - ys["scalar"]) <= RTOL_EXACT * scale).all(), name


# F16 and quantized rows take the same float operations in the same order on every
# ISA (llama.cpp's x86 order, see native/src/isa/scalar.c): identical bits
BIT_IDENTICAL_SHAPES = [(9, 1056, 3), (33, 576, 2), (4, 32, 1), (3, 160, 1), (5, 4096, 1)]
BIT_IDENTICAL_F16_SHAPES = [(6, 1, 1), (6, 33, 1), (6, 63, 2), (6, 64, 1), (6, 100, 2), (6, 577, 1), (6, 1057, 3)]


@pytest.mark.parametrize("tname", ["Q4_0", "Q4_1", "Q8_0", "F16"])
def test_isa_paths_bit_identical(pool1, tname):
    """Q4_0 / Q4_1 / Q8_0 / F16 matmuls give identical bits on every ISA (the
    activation bytes are identical too, see test_quantize_isa_paths_bit_identical)."""
    isas = _native.supported_isas()
    shapes = BIT_IDENTICAL_SHAPES + (BIT_IDENTICAL_F16_SHAPES if tname == "F16" else [])
    try:
        for n_rows, n_cols, n_tok in shapes:
            _, x, wq, _, _ = case(tname, n_rows, n_cols, n_tok)
            ys = {}
            for name in isas:
                _native.set_isa(name)
                ys[name] = native_matmul(pool1, tname, wq, n_rows, n_cols, x)
            for name in isas:
                assert np.array_equal(ys[name].view(np.uint32), ys["scalar"].view(np.uint32)), (
                    f"{name} {tname} {n_rows}x{n_cols}x{n_tok}: max |diff| {np.abs(ys[name] - ys['scalar']).max():.3g}"
                )
    finally:
        _native.set_isa("auto")


def test_dequantize_layout_matches_gguf():
    """decode_blocks (used by the exact reference) agrees with gguf's dequantizer."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 128)).astype(np.float32)
    for t in QUANT_TYPES:
        wq = quants.quantize(w, getattr(GT, t))
        d, m, q = decode_blocks(t, wq)
        deq = d[..., None] * q + (m[..., None] if m is not None else 0.0)
        np.testing.assert_allclose(deq.reshape(3, 128), quants.dequantize(wq, getattr(GT, t)), rtol=1e-6, atol=1e-6)


def test_matmul_thread_count_does_not_change_results(isa, pool1, pool):
    """Rows are independent dot products: a 2-thread pool gives identical bits."""
    for tname in ("Q4_1", "F16"):
        n_rows, n_cols, n_tok = 33, 576, 3
        _, x, wq, _, _ = case(tname, n_rows, n_cols, n_tok)
        y1 = native_matmul(pool1, tname, wq, n_rows, n_cols, x)
        y2 = native_matmul(pool, tname, wq, n_rows, n_cols, x)
        assert np.array_equal(y1, y2)


def test_fp16_to_fp32_all_patterns(isa, pool1):
    """Every finite fp16 weight times 1.0 (an F16 matmul with 1 column) decodes
    exactly as numpy's float16 does; inf stays inf, NaN stays NaN."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    y = native_matmul(pool1, "F16", bits.view(np.float16), 65536, 1, np.ones((1, 1), np.float32))[0]
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(y[~nan], ref[~nan])  # (-0.0 == 0.0: the sum may drop the sign of zero)
    assert np.isnan(y[nan]).all()


# ---- bit parity with llama.cpp's kernels ----------------------------------------------


def ggml_rows(tname: str, wq: np.ndarray, xa: np.ndarray, n_cols: int) -> np.ndarray:
    """llama.cpp's vec_dot of every weight row with every activation row (raw bytes)."""
    g = ggml_cpu()
    tr = g.ggml_get_type_traits_cpu(TYPE_ID[tname]).contents
    if tr.vec_dot_type != TYPE_ID[ACT_TYPE[tname]] or not tr.vec_dot:
        pytest.skip("unexpected ggml_type_traits_cpu layout")
    dot = GGML_VEC_DOT(tr.vec_dot)
    w = np.ascontiguousarray(wq).view(np.uint8).reshape(wq.shape[0], -1)
    x = np.ascontiguousarray(xa).view(np.uint8).reshape(xa.shape[0], -1)
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    r = ctypes.c_float()
    for t in range(x.shape[0]):
        for i in range(w.shape[0]):
            dot(n_cols, ctypes.byref(r), 0, w[i].ctypes.data, 0, x[t].ctypes.data, 0, 1)
            out[t, i] = r.value
    return out


@pytest.mark.llama_cpp
@pytest.mark.skipif(ggml_cpu() is None, reason="llama-cpp-python's libggml-cpu not found")
@pytest.mark.parametrize("tname", ["Q4_0", "Q4_1", "Q8_0", "F16"])
def test_rows_bit_identical_to_llama_cpp(pool1, tname):
    isas = _native.supported_isas()  # the scalar path takes the same float operations
    if tname == "F16":  # every ISA path takes the F16 order of one ggml build: compare with a build of that order
        isas = isas if bool(ggml_cpu().ggml_cpu_has_avx512()) == (_native.f16_order_name() == "avx512") else []
    if not isas:
        pytest.skip("no path to compare")
    shapes = [(24, 576, 1), (8, 1536, 2), (8, 96, 1), (4, 32, 1)]
    if tname == "F16":
        shapes += [(6, 1, 1), (6, 33, 1), (6, 64, 1), (6, 100, 2), (6, 577, 1)]
    try:
        for n_rows, n_cols, n_tok in shapes:
            _, x, wq, _, _ = case(tname, n_rows, n_cols, n_tok)
            xa = np.stack([native_quantize(ACT_TYPE[tname], x[t]) for t in range(n_tok)])
            ref = ggml_rows(tname, wq, xa, n_cols)
            for name in isas:
                _native.set_isa(name)
                y = native_matmul(pool1, tname, wq, n_rows, n_cols, x)
                assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (
                    f"{name} {tname} {n_rows}x{n_cols}: max |diff| {np.abs(y - ref).max():.3g}"
                )
    finally:
        _native.set_isa("auto")


# ---- activation conversion -------------------------------------------------------------


def q8_test_rows(rng, n_blocks: int) -> np.ndarray:
    x = rng.standard_normal(n_blocks * QK).astype(np.float32) * np.float32(3.0)
    b = x.reshape(-1, QK)
    b[0] = 0.0  # d = 0
    b[1] = np.arange(-16, 16, dtype=np.float32) + 0.5  # amax 15.5: ties after scaling
    b[2] = 0.0
    b[2, 5] = 127.0  # d = 1: x * id = x exactly
    b[2, 6:20] = np.arange(-7, 7, dtype=np.float32) + 0.5  # exact .5 ties, both signs
    b[3] = -b[3]
    b[4] *= np.float32(1e-30)  # tiny (denormal products)
    b[5] *= np.float32(1e4)  # large
    b[6, :] = 1.0  # constant block
    return x


@pytest.mark.parametrize("n_blocks", [8, 33])
def test_quantize_q8_0_matches_reference(isa, n_blocks):
    x = q8_test_rows(np.random.default_rng(n_blocks), n_blocks)
    got = native_quantize("Q8_0", x)
    # bit-exact: d = amax/127, id = 127/amax, round half to even
    assert np.array_equal(got, ref_q8_0(x))
    # block 2 has d = 1 (x * id = x) and exact .5 ties of both signs: to even
    q2 = got.reshape(-1, 34)[2, 2:].view(np.int8)
    assert np.array_equal(q2[6:20], [-6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6])


def test_quantize_q8_0_vs_gguf_reference(isa):
    """gguf.quants' Q8_0 is llama.cpp's portable reference quantizer (id = 1/d, round
    half away from zero); the engine, like llama.cpp's x86 build, uses id = 127/amax
    and rounds half to even. The scales are the same; a quant can differ only where
    x * id lands on (or within an ulp of) a .5 tie, and then by exactly one step."""
    rng = np.random.default_rng(11)
    n_blocks = 1 << 15
    x = (rng.standard_normal(n_blocks * QK) * np.repeat(10.0 ** rng.uniform(-3, 3, n_blocks), QK)).astype(np.float32)
    got = native_quantize("Q8_0", x).reshape(-1, 34)
    ref = quants.quantize(x, GT.Q8_0).reshape(-1, 34)
    assert np.array_equal(got[:, :2], ref[:, :2])  # d
    diff = got[:, 2:].view(np.int8).astype(np.int32) - ref[:, 2:].view(np.int8).astype(np.int32)
    n_diff = np.count_nonzero(diff)
    assert n_diff < 1e-4 * x.size, n_diff
    assert (np.abs(diff[diff != 0]) == 1).all()
    # exact ties (d = 1 here) are where the two rules always part: -2.5 -> -2 vs -3
    t = np.zeros(QK, np.float32)
    t[0], t[1:8] = 127.0, [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.25]
    got_t = native_quantize("Q8_0", t)[2:].view(np.int8)
    ref_t = quants.quantize(t, GT.Q8_0)[2:].view(np.int8)
    assert np.array_equal(got_t[1:8], [-2, -2, 0, 0, 2, 2, 3])
    assert np.array_equal(ref_t[1:8], [-3, -2, -1, 1, 2, 3, 3])


@pytest.mark.parametrize("n_blocks", [8, 33])
def test_quantize_q8_1_matches_reference(isa, n_blocks):
    x = q8_test_rows(np.random.default_rng(100 + n_blocks), n_blocks)
    got = native_quantize("Q8_1", x)
    assert np.array_equal(got, ref_q8_1(x).ravel())


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 33, 1000, 4099])
def test_quantize_f16_matches_numpy(isa, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 6, n)).astype(np.float32)
    special = np.array(
        [
            0.0,
            -0.0,
            65504.0,
            65519.996,
            65520.0,
            -1e6,
            np.inf,
            -np.inf,
            5.96e-8,
            2.9802322e-8,
            2.9802326e-8,
            1e-8,
            6.097e-5,
            6.1035156e-05,
            -3.0e-6,
            1.00048828125,
            1.000732421875,
            2049.0,
            2051.0,
        ],
        np.float32,
    )  # fp16 ties
    m = min(n, special.size)
    x[:m] = special[:m]
    got = native_quantize("F16", x).view(np.uint16)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 33, 1000, 4099])
def test_quantize_bf16_matches_gguf(isa, n):
    rng = np.random.default_rng(n + 1)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()  # every exponent, NaN payloads, ties
    special = np.array(
        [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF800000, 0x7FC00001, 0x7F800001, 0x00008000, 0x80018000], np.uint32
    ).view(np.float32)
    m = min(n, special.size)
    x[:m] = special[:m]
    got = native_quantize("BF16", x).view(np.uint16)
    ref = quants.quantize(x, GT.BF16).view(np.uint16)
    assert np.array_equal(got, ref)  # round to nearest even, NaN made quiet


def test_quantize_f32_is_a_copy(isa):
    x = np.random.default_rng(0).standard_normal(45).astype(np.float32)
    assert np.array_equal(native_quantize("F32", x).view(np.float32), x)


@pytest.mark.parametrize("act", ["Q8_0", "Q8_1", "F16", "BF16"])
def test_quantize_isa_paths_bit_identical(act):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(32 * 37) * 10.0 ** rng.integers(-3, 4, 32 * 37)).astype(np.float32)
    outs = {}
    try:
        for name in _native.supported_isas():
            _native.set_isa(name)
            outs[name] = native_quantize(act, x)
    finally:
        _native.set_isa("auto")
    for name, out in outs.items():
        assert np.array_equal(out, outs["scalar"]), name
