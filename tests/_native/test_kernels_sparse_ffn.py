"""Sparse FFN operator (pi_op_ffn_sparse) and the down-matrix transpose
(pi_op_transpose_to), native/src/ops/sparse_ffn.c, on every instruction-set path
the CPU supports (the ``isa`` fixture in conftest.py).

References:
  * gate_j.x / up_j.x: the dense pi_op_matmul product (same activation
    quantization and dot kernel, so the same bits);
  * the down sum: float64 h @ down_t (tolerance of float32 accumulation) or,
    where h is exact in numpy (the ReLU forms), the operator's documented order
    reproduced in float32: y = ((0 + h_a*w_a) + h_b*w_b) + ..., which must match
    bit for bit;
  * determinism: identical bits for pools of 1, 2 and 3 threads, across reruns,
    and across ISA paths where the dot kernels agree bit for bit (Q4_0, Q8_0, F16).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib

from tests.fixtures.tiny_archs import gelu16

TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q8_1": 9, "BF16": 30}
GATE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")
DOWN_TYPES = ("F32", "F16", "Q8_0", "Q4_0")
SWIGLU, GEGLU, RELU, DRELU = lib.PI_FFN_SWIGLU, lib.PI_FFN_GEGLU, lib.PI_FFN_RELU, lib.PI_FFN_DRELU
RTOL = 3e-5  # of sum |h_j| |w_j|: float32 accumulation


# ---- helpers -----------------------------------------------------------------------


def make_pool(n: int):
    out = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(n, out), "pi_pool_create")
    return ffi.gc(out[0], lib.pi_pool_free)


def quantize(tname: str, w: np.ndarray) -> np.ndarray:
    """Weight bytes (rows of w) of type tname as a uint8 array."""
    if tname == "F32":
        return np.ascontiguousarray(w, np.float32).view(np.uint8)
    if tname == "F16":
        return np.ascontiguousarray(w.astype(np.float16)).view(np.uint8)
    return np.ascontiguousarray(quants.quantize(np.ascontiguousarray(w, np.float32), GT[tname]))


def dequantize(tname: str, b: np.ndarray, shape) -> np.ndarray:
    if tname == "F32":
        return b.view(np.float32).reshape(shape).copy()
    if tname == "F16":
        return b.view(np.float16).reshape(shape).astype(np.float32)
    return quants.dequantize(b.reshape(shape[0], -1), GT[tname]).astype(np.float32).reshape(shape)


def matmul(pool, tname, wb, n_rows, n_cols, x) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.full((x.shape[0], n_rows), np.nan, np.float32)
    _native.check(
        lib.pi_op_matmul(
            pool,
            TYPE_ID[tname],
            ffi.from_buffer(wb),
            n_rows,
            n_cols,
            ffi.from_buffer("float[]", x),
            x.shape[0],
            ffi.from_buffer("float[]", y),
        ),
        "pi_op_matmul",
    )
    return y


class FFN:
    """Random FFN weights: gate/up of gtype, down_t of dtype (n_ff rows of n_embd)."""

    def __init__(self, gtype, dtype, n_embd, n_ff, seed=0):
        rng = np.random.default_rng(seed)
        self.gtype, self.dtype, self.n_embd, self.n_ff = gtype, dtype, n_embd, n_ff
        self.gate = quantize(gtype, rng.standard_normal((n_ff, n_embd)).astype(np.float32) / np.sqrt(n_embd))
        self.up = quantize(gtype, rng.standard_normal((n_ff, n_embd)).astype(np.float32) / np.sqrt(n_embd))
        self.down_t = quantize(dtype, rng.standard_normal((n_ff, n_embd)).astype(np.float32) / np.sqrt(n_ff))
        self.down_f = dequantize(dtype, self.down_t, (n_ff, n_embd))

    def sparse(self, pool, act, x, active=None, threshold=0.0, *, gtype=None, dtype=None, n_ff=None):
        """pi_op_ffn_sparse; active: None (all) or a list of per-token id lists.
        Returns (y, n_used)."""
        x = np.ascontiguousarray(x, np.float32)
        n_tok = x.shape[0]
        y = np.full((n_tok, self.n_embd), np.nan, np.float32)
        n_used = np.full(n_tok, -1, np.int64)
        if active is None:
            ids, off = ffi.NULL, ffi.NULL
        else:
            flat = np.array([j for a in active for j in a], np.int32)
            offs = np.cumsum([0] + [len(a) for a in active]).astype(np.int64)
            ids = ffi.from_buffer("int32_t[]", flat) if flat.size else ffi.new("int32_t[1]")
            off = ffi.from_buffer("int64_t[]", offs)
        rc = lib.pi_op_ffn_sparse(
            pool,
            act,
            TYPE_ID[gtype or self.gtype],
            ffi.from_buffer(self.gate),
            ffi.from_buffer(self.up),
            self.n_embd,
            n_ff or self.n_ff,
            TYPE_ID[dtype or self.dtype],
            ffi.from_buffer(self.down_t),
            ffi.from_buffer("float[]", x),
            n_tok,
            ids,
            off,
            threshold,
            ffi.from_buffer("float[]", y),
            ffi.from_buffer("int64_t[]", n_used),
        )
        _native.check(rc, "pi_op_ffn_sparse")
        return y, n_used

    def gu(self, pool, x):
        """Dense gate and up products (n_tok x n_ff) via pi_op_matmul."""
        return (
            matmul(pool, self.gtype, self.gate, self.n_ff, self.n_embd, x),
            matmul(pool, self.gtype, self.up, self.n_ff, self.n_embd, x),
        )


def h_ref(act, g, u) -> np.ndarray:
    g, u = g.astype(np.float64), u.astype(np.float64)
    if act == SWIGLU:
        return g / (1 + np.exp(-g)) * u
    if act == GEGLU:  # GELU at half precision, as the dense FFN (pi_ffn_act_mul)
        return gelu16(g) * u
    if act == RELU:
        return np.maximum(g, 0) * u
    return np.maximum(g, 0) * np.maximum(u, 0)


def assert_down_close(y, h, down_f):
    """|y - h @ down| <= RTOL * |h| @ |down| per element."""
    ref = h @ down_f.astype(np.float64)
    scale = np.abs(h) @ np.abs(down_f).astype(np.float64)
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= RTOL * scale + 1e-30), float(np.max(err / (scale + 1e-30)))


def down_exact(h32: np.ndarray, down_f: np.ndarray) -> np.ndarray:
    """The operator's order in float32: y = ((0 + h_a*w_a) + h_b*w_b) + ..., over the
    neurons with h != 0 in increasing id order (one token)."""
    y = np.zeros(down_f.shape[1], np.float32)
    for j in np.nonzero(h32)[0]:
        y = y + np.float32(h32[j]) * down_f[j]
    return y


def rand_x(rng, n_tok, n_embd):
    return rng.standard_normal((n_tok, n_embd)).astype(np.float32)


# ---- (a) all neurons, threshold 0 == dense -------------------------------------------


@pytest.mark.parametrize("gtype", GATE_TYPES)
@pytest.mark.parametrize("dtype", DOWN_TYPES)
@pytest.mark.parametrize("act", [SWIGLU, GEGLU, RELU, DRELU])
def test_all_active_equals_dense(isa, pool, gtype, dtype, act):
    f = FFN(gtype, dtype, 128, 96, seed=1)
    x = rand_x(np.random.default_rng(2), 2, 128)
    g, u = f.gu(pool, x)
    h = h_ref(act, g, u)
    for active in (None, [list(range(96))] * 2):
        y, n_used = f.sparse(pool, act, x, active)
        assert_down_close(y, h, f.down_f)
        np.testing.assert_array_equal(n_used, np.count_nonzero(h, axis=1))


# ---- (b) ReLU forms: the active set {gate > 0} gives the dense result, bit for bit ----


@pytest.mark.parametrize("gtype", ["F32", "F16", "Q4_0", "Q8_0"])
@pytest.mark.parametrize("dtype", DOWN_TYPES)
@pytest.mark.parametrize("act", [RELU, DRELU])
def test_relu_active_set_exact(isa, pool, gtype, dtype, act):
    n_embd, n_ff = 256, 160
    f = FFN(gtype, dtype, n_embd, n_ff, seed=3)
    x = rand_x(np.random.default_rng(4), 3, n_embd)
    g, u = f.gu(pool, x)
    active = [list(np.nonzero(g[t] > 0)[0]) for t in range(3)]
    y_sparse, used_sparse = f.sparse(pool, act, x, active)
    y_dense, used_dense = f.sparse(pool, act, x, None)
    np.testing.assert_array_equal(y_sparse.view(np.uint32), y_dense.view(np.uint32))
    np.testing.assert_array_equal(used_sparse, used_dense)
    # exact float32 reproduction: h = g*u (relu(g) = g on the active set)
    for t in range(3):
        h32 = np.where(g[t] > 0, g[t] * (u[t] if act == RELU else np.maximum(u[t], 0)), 0).astype(np.float32)
        np.testing.assert_array_equal(y_sparse[t].view(np.uint32), down_exact(h32, f.down_f).view(np.uint32))
        assert used_sparse[t] == np.count_nonzero(h32)
    assert_down_close(y_sparse, h_ref(act, g, u), f.down_f)


# ---- (c) SwiGLU with a random active subset == dense with the rest masked --------------


@pytest.mark.parametrize("gtype", GATE_TYPES)
@pytest.mark.parametrize("dtype", ["F16", "F32", "Q8_0"])
def test_swiglu_random_subset(isa, pool, gtype, dtype):
    n_embd, n_ff, n_tok = 160, 200, 3
    f = FFN(gtype, dtype, n_embd, n_ff, seed=5)
    rng = np.random.default_rng(6)
    x = rand_x(rng, n_tok, n_embd)
    g, u = f.gu(pool, x)
    dens = [0.3, 0.05, 0.0]  # includes an empty list
    active = [sorted(rng.choice(n_ff, int(d * n_ff), replace=False).tolist()) for d in dens]
    mask = np.zeros((n_tok, n_ff), bool)
    for t, a in enumerate(active):
        mask[t, a] = True
    h = np.where(mask, h_ref(SWIGLU, g, u), 0)
    y, n_used = f.sparse(pool, SWIGLU, x, active)
    assert_down_close(y, h, f.down_f)
    np.testing.assert_array_equal(n_used, mask.sum(1))
    assert np.all(y[2] == 0)


# ---- threshold (CATS / TEAL "down-only" form) ---------------------------------------


@pytest.mark.parametrize("act", [SWIGLU, GEGLU])
def test_threshold_down_only(isa, pool, act):
    f = FFN("Q8_0", "F16", 128, 256, seed=7)
    x = rand_x(np.random.default_rng(8), 2, 128)
    g, u = f.gu(pool, x)
    h = h_ref(act, g, u)
    t = float(np.quantile(np.abs(h), 0.7))
    y, n_used = f.sparse(pool, act, x, None, threshold=t)
    # the C h and the float64 h may differ in the last bits: skip neurons at the edge
    margin = np.abs(np.abs(h) - t) < 1e-5 * t
    assert not margin.any()
    keep = np.abs(h) >= t
    assert_down_close(y, np.where(keep, h, 0), f.down_f)
    np.testing.assert_array_equal(n_used, keep.sum(1))
    # threshold with an explicit active set: intersection of both
    active = [list(range(0, 256, 2))] * 2
    y2, n2 = f.sparse(pool, act, x, active, threshold=t)
    keep2 = keep.copy()
    keep2[:, 1::2] = False
    assert_down_close(y2, np.where(keep2, h, 0), f.down_f)
    np.testing.assert_array_equal(n2, keep2.sum(1))


# ---- (d) determinism: thread counts, reruns, ISA paths ---------------------------------


@pytest.mark.parametrize(
    "gtype,dtype", [("Q4_0", "F16"), ("F16", "F32"), ("Q8_0", "Q8_0"), ("BF16", "Q4_0"), ("F32", "F16")]
)
@pytest.mark.parametrize("n_embd", [512, 96, 40])
def test_bits_independent_of_threads(isa, gtype, dtype, n_embd):
    if n_embd % 32 and (gtype not in ("F32", "F16", "BF16") or dtype not in ("F32", "F16")):
        pytest.skip("quantized types need n_embd % 32 == 0")
    f = FFN(gtype, dtype, n_embd, 300, seed=9)
    rng = np.random.default_rng(10)
    x = rand_x(rng, 2, n_embd)
    active = [sorted(rng.choice(300, 170, replace=False).tolist()), list(range(300))]
    outs = []  # alternately with and without a threshold
    for n in (1, 2, 3, 1, 3):
        p = make_pool(n)
        outs.append(f.sparse(p, SWIGLU, x, active, threshold=1e-3))
        outs.append(f.sparse(p, SWIGLU, x, active))
    for k in range(2, len(outs)):
        ref_y, ref_used = outs[k % 2]
        np.testing.assert_array_equal(outs[k][0].view(np.uint32), ref_y.view(np.uint32))
        np.testing.assert_array_equal(outs[k][1], ref_used)


@pytest.mark.parametrize("gtype", ["Q4_0", "Q8_0", "F16"])
@pytest.mark.parametrize("dtype", DOWN_TYPES)
def test_bits_identical_across_isas(pool, gtype, dtype):
    """The dot kernels of these types agree bit for bit on every ISA, and the down
    accumulation is specified to, so the whole operator must."""
    isas = _native.supported_isas()
    f = FFN(gtype, dtype, 224, 130, seed=11)
    rng = np.random.default_rng(12)
    x = rand_x(rng, 2, 224)
    active = [sorted(rng.choice(130, 61, replace=False).tolist()), list(range(130))]
    res = []
    try:
        for name in isas:
            _native.set_isa(name)
            res.append(f.sparse(pool, SWIGLU, x, active)[0])
    finally:
        _native.set_isa("auto")
    for r in res[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), res[0].view(np.uint32))


# ---- (e) validation ----------------------------------------------------------------


def test_validation_errors(pool):
    f = FFN("F16", "F16", 64, 40, seed=13)
    x = rand_x(np.random.default_rng(14), 1, 64)
    for bad in ([3, 2], [1, 1], [0, 40], [-1, 2]):
        with pytest.raises(ValueError, match="neuron id"):
            f.sparse(pool, SWIGLU, x, [bad])
    with pytest.raises(ValueError, match="activation"):
        f.sparse(pool, 4, x)
    with pytest.raises(ValueError, match="threshold"):
        f.sparse(pool, SWIGLU, x, threshold=-1.0)
    with pytest.raises(ValueError, match="threshold"):
        f.sparse(pool, SWIGLU, x, threshold=float("nan"))
    y = np.zeros((1, 64), np.float32)
    xb, yb = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)
    g = ffi.from_buffer(f.gate)

    def call(gt=1, dt=1, n_embd=64, n_ff=40, ids=ffi.NULL, off=ffi.NULL, pool_=pool, gate=g, xx=xb, yy=yb):
        return lib.pi_op_ffn_sparse(pool_, SWIGLU, gt, gate, g, n_embd, n_ff, dt, g, xx, 1, ids, off, 0.0, yy, ffi.NULL)

    for gt in (7, 99, -1):
        with pytest.raises(ValueError, match="unknown gate/up type"):
            _native.check(call(gt=gt), "ffn")
    with pytest.raises(ValueError, match="unknown down_t type"):
        _native.check(call(dt=5), "ffn")
    with pytest.raises(NotImplementedError, match="down_t type bf16"):
        _native.check(call(dt=30), "ffn")
    with pytest.raises(NotImplementedError, match="q8_1"):
        _native.check(call(gt=9), "ffn")
    with pytest.raises(ValueError, match="block size"):
        _native.check(call(gt=2, n_embd=48), "ffn")
    with pytest.raises(ValueError, match="NULL"):
        _native.check(call(pool_=ffi.NULL), "ffn")
    with pytest.raises(ValueError, match="NULL"):
        _native.check(call(gate=ffi.NULL), "ffn")
    with pytest.raises(ValueError, match="NULL"):
        _native.check(call(yy=ffi.NULL), "ffn")
    ids = ffi.new("int32_t[]", [1, 2])
    with pytest.raises(ValueError, match="active_off is NULL"):
        _native.check(call(ids=ids), "ffn")
    with pytest.raises(ValueError, match="active_off"):
        _native.check(call(ids=ids, off=ffi.new("int64_t[]", [1, 2])), "ffn")
    with pytest.raises(ValueError, match="active_off"):
        _native.check(call(ids=ids, off=ffi.new("int64_t[]", [0, -1])), "ffn")
    with pytest.raises(ValueError, match="sizes"):
        _native.check(call(n_ff=0), "ffn")
    _native.check(call(ids=ids, off=ffi.new("int64_t[]", [0, 2])), "ffn")  # the valid call


# ---- (f) odd sizes, 0 and 1 active neurons ----------------------------------------------


@pytest.mark.parametrize("gtype", GATE_TYPES)
@pytest.mark.parametrize("dtype", DOWN_TYPES)
def test_odd_sizes(isa, pool, gtype, dtype):
    n_embd, n_ff = 96, 100
    f = FFN(gtype, dtype, n_embd, n_ff, seed=15)
    x = rand_x(np.random.default_rng(16), 3, n_embd)
    g, u = f.gu(pool, x)
    h = h_ref(SWIGLU, g, u)
    y, n_used = f.sparse(pool, SWIGLU, x, [[], [99], [0]])
    assert np.all(y[0] == 0) and n_used[0] == 0
    for t, j in ((1, 99), (2, 0)):
        hm = np.zeros(n_ff)
        hm[j] = h[t, j]
        assert_down_close(y[t : t + 1], hm[None], f.down_f)
        assert n_used[t] == 1
    y, n_used = f.sparse(pool, SWIGLU, x[:1], [[]])
    assert np.all(y == 0) and n_used[0] == 0


def test_float_rows_not_multiple_of_32(isa, pool):
    """F32/F16 rows of 40: a partial last tile after the vector tiles."""
    for dtype in ("F16", "F32"):
        f = FFN("F16", dtype, 40, 70, seed=17)
        x = rand_x(np.random.default_rng(18), 2, 40)
        g, u = f.gu(pool, x)
        y, _ = f.sparse(pool, RELU, x)
        for t in range(2):
            h32 = np.where(g[t] > 0, g[t] * u[t], 0).astype(np.float32)
            np.testing.assert_array_equal(y[t].view(np.uint32), down_exact(h32, f.down_f).view(np.uint32))


# ---- transpose ------------------------------------------------------------------------


def transpose(type_out, src, src_type, n_rows, n_cols):
    nbytes = {"F32": 4 * n_rows, "F16": 2 * n_rows, "Q8_0": n_rows // 32 * 34, "Q4_0": n_rows // 32 * 18}
    dst = np.zeros(n_cols * nbytes[type_out], np.uint8)
    _native.check(
        lib.pi_op_transpose_to(
            TYPE_ID[type_out], ffi.from_buffer(src), TYPE_ID[src_type], n_rows, n_cols, ffi.from_buffer(dst)
        ),
        "pi_op_transpose_to",
    )
    return dst


@pytest.mark.parametrize("src_type", GATE_TYPES)
@pytest.mark.parametrize("type_out", DOWN_TYPES)
def test_transpose(src_type, type_out):
    n_rows, n_cols = 96, 160  # 160 = 2 full tiles of 64 + a partial one
    rng = np.random.default_rng(19)
    w = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    src = quantize(src_type, w)
    wf = dequantize(src_type, src, (n_rows, n_cols))
    dst = transpose(type_out, src, src_type, n_rows, n_cols)
    if type_out in ("F32", "F16"):
        np.testing.assert_array_equal(dst, quantize(type_out, np.ascontiguousarray(wf.T)).ravel())
    else:
        got = dequantize(type_out, dst, (n_cols, n_rows))
        # half a step (Q8_0: amax/127, plus the fp16 rounding of d); Q4_0: a full
        # step at the clamped end (q = 15 stands for up to 8 steps)
        tol = {"Q8_0": 0.6 / 127, "Q4_0": 1.05 / 8}[type_out]
        amax = np.abs(wf.T.reshape(n_cols, -1, 32)).max(-1, keepdims=True)
        err = np.abs(got - wf.T).reshape(n_cols, -1, 32)
        assert np.all(err <= tol * amax + 1e-6)
    if type_out == "Q4_0":  # same rule as the GGUF reference quantizer
        ref = quantize("Q4_0", np.ascontiguousarray(wf.T))
        assert np.mean(dst != ref.ravel()) < 1e-3


def test_transpose_errors():
    src = np.zeros(64 * 64, np.float32)
    dst = np.zeros(64 * 64 * 4, np.uint8)
    s, d = ffi.from_buffer(src), ffi.from_buffer(dst)
    with pytest.raises(NotImplementedError):
        _native.check(lib.pi_op_transpose_to(TYPE_ID["BF16"], s, 0, 64, 64, d), "t")
    with pytest.raises(ValueError):
        _native.check(lib.pi_op_transpose_to(77, s, 0, 64, 64, d), "t")
    with pytest.raises(ValueError):
        _native.check(lib.pi_op_transpose_to(TYPE_ID["Q8_0"], s, 0, 40, 64, d), "t")
    with pytest.raises(ValueError):
        _native.check(lib.pi_op_transpose_to(0, ffi.NULL, 0, 64, 64, d), "t")


def test_transposed_down_matches_dense_down(pool):
    """End to end with a GGUF-layout down ([n_ff, n_embd]: n_embd rows of n_ff):
    sparse FFN over all neurons with down_t = transpose(down) as F16 equals the dense
    gate/up/down with the F16-rounded down."""
    n_embd, n_ff = 64, 96
    rng = np.random.default_rng(20)
    down = quantize("Q4_0", rng.standard_normal((n_embd, n_ff)).astype(np.float32))
    f = FFN("F32", "F16", n_embd, n_ff, seed=21)
    f.down_t = transpose("F16", down, "Q4_0", n_embd, n_ff)
    f.down_f = dequantize("F16", f.down_t, (n_ff, n_embd))
    # Q4_0 values (q-8)*d need up to 15 significant bits: F16 rounds them (nearest even)
    np.testing.assert_array_equal(f.down_f, dequantize("Q4_0", down, (n_embd, n_ff)).T.astype(np.float16))
    x = rand_x(rng, 1, n_embd)
    g, u = f.gu(pool, x)
    y, _ = f.sparse(pool, SWIGLU, x)
    h = h_ref(SWIGLU, g, u)
    assert_down_close(y, h, f.down_f)


# ---- ungated ReLU form (OPT, ReluFalcon): h = relu(up x + b) ---------------------------


def sparse_ungated(pool, f, x, bias, active=None, threshold=0.0, act=lib.PI_FFN_RELU_UP):
    """pi_op_ffn_sparse_ungated over f.up (f.gate unused); returns (y, n_used)."""
    x = np.ascontiguousarray(x, np.float32)
    n_tok = x.shape[0]
    y = np.full((n_tok, f.n_embd), np.nan, np.float32)
    n_used = np.full(n_tok, -1, np.int64)
    if active is None:
        ids, off = ffi.NULL, ffi.NULL
    else:
        flat = np.array([j for a in active for j in a], np.int32)
        ids = ffi.from_buffer("int32_t[]", flat) if flat.size else ffi.new("int32_t[1]")
        off = ffi.from_buffer("int64_t[]", np.cumsum([0] + [len(a) for a in active]).astype(np.int64))
    b = ffi.NULL if bias is None else ffi.from_buffer("float[]", np.ascontiguousarray(bias, np.float32))
    _native.check(
        lib.pi_op_ffn_sparse_ungated(
            pool,
            act,
            TYPE_ID[f.gtype],
            ffi.from_buffer(f.up),
            b,
            f.n_embd,
            f.n_ff,
            TYPE_ID[f.dtype],
            ffi.from_buffer(f.down_t),
            ffi.from_buffer("float[]", x),
            n_tok,
            ids,
            off,
            threshold,
            ffi.from_buffer("float[]", y),
            ffi.from_buffer("int64_t[]", n_used),
        ),
        "pi_op_ffn_sparse_ungated",
    )
    return y, n_used


@pytest.mark.parametrize("gtype", ["F32", "F16", "Q4_0", "Q8_0"])
@pytest.mark.parametrize("dtype", DOWN_TYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_ungated_relu_active_set_exact(isa, pool, gtype, dtype, with_bias):
    """Threshold 0 over all neurons, and over exactly the active set {up x + b > 0},
    give the same bits, and those of the documented float32 order over h = relu(u + b)
    with u the dense matmul's row (so h equals the dense h exactly)."""
    n_embd, n_ff, n_tok = 256, 160, 3
    f = FFN(gtype, dtype, n_embd, n_ff, seed=11)
    rng = np.random.default_rng(12)
    x = rand_x(rng, n_tok, n_embd)
    bias = (0.3 * rng.standard_normal(n_ff)).astype(np.float32) if with_bias else None
    u = matmul(pool, gtype, f.up, n_ff, n_embd, x)
    pre = u + bias if with_bias else u  # float32 add, as the operator
    active = [list(np.nonzero(pre[t] > 0)[0]) for t in range(n_tok)]
    y_all, used_all = sparse_ungated(pool, f, x, bias)
    y_act, used_act = sparse_ungated(pool, f, x, bias, active)
    np.testing.assert_array_equal(y_all.view(np.uint32), y_act.view(np.uint32))
    np.testing.assert_array_equal(used_all, used_act)
    for t in range(n_tok):
        h32 = np.maximum(pre[t], 0).astype(np.float32)
        np.testing.assert_array_equal(y_all[t].view(np.uint32), down_exact(h32, f.down_f).view(np.uint32))
        assert used_all[t] == np.count_nonzero(h32) and 0 < used_all[t] < n_ff
    assert_down_close(y_all, np.maximum(pre.astype(np.float64), 0), f.down_f)


def test_ungated_threshold_and_errors(pool):
    f = FFN("Q8_0", "F16", 128, 96, seed=13)
    x = rand_x(np.random.default_rng(14), 2, 128)
    u = matmul(pool, "Q8_0", f.up, 96, 128, x)
    h = np.maximum(u, 0).astype(np.float64)
    t = float(np.quantile(h[h > 0], 0.5))
    y, n_used = sparse_ungated(pool, f, x, None, threshold=t)
    kept = np.where(h >= t, h, 0)
    np.testing.assert_array_equal(n_used, np.count_nonzero(kept, axis=1))
    assert_down_close(y, kept, f.down_f)
    with pytest.raises(ValueError, match="threshold"):
        sparse_ungated(pool, f, x, None, threshold=-1.0)
    # the gated entry point refuses the ungated forms (it has no bias argument), and back
    with pytest.raises(ValueError, match="pi_op_ffn_sparse_ungated"):
        f.sparse(pool, lib.PI_FFN_RELU_UP, x)
    with pytest.raises(ValueError, match="not an ungated one"):
        sparse_ungated(pool, f, x, None, act=RELU)


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_ungated_gelu(isa, pool, dtype):
    """Falcon's form h = gelu16(up x + b): all neurons at threshold 0, and a threshold."""
    f = FFN("Q8_0", dtype, 128, 96, seed=15)
    rng = np.random.default_rng(16)
    x = rand_x(rng, 2, 128)
    bias = (0.3 * rng.standard_normal(96)).astype(np.float32)
    pre = (matmul(pool, "Q8_0", f.up, 96, 128, x) + bias).astype(np.float64)
    h = gelu16(pre)  # at half precision, as the dense FFN
    y, n_used = sparse_ungated(pool, f, x, bias, act=lib.PI_FFN_GELU_UP)
    assert_down_close(y, h, f.down_f)
    np.testing.assert_array_equal(n_used, np.count_nonzero(h, axis=1))
    t = float(np.quantile(np.abs(h), 0.6))
    y, n_used = sparse_ungated(pool, f, x, bias, threshold=t, act=lib.PI_FFN_GELU_UP)
    margin = np.abs(np.abs(h) - t) < 1e-5 * t
    assert not margin.any()
    kept = np.where(np.abs(h) >= t, h, 0)
    assert_down_close(y, kept, f.down_f)
    np.testing.assert_array_equal(n_used, np.count_nonzero(kept, axis=1))


# ---- (g) a batch: the batched down accumulation (Q8_0 / Q4_0 down_t) --------------------


def one_at_a_time(f, pool, x, active, threshold):
    """The operator on each token alone (the per-token path): (y rows, n_used)."""
    outs = [f.sparse(pool, SWIGLU, x[t : t + 1], active and [active[t]], threshold) for t in range(len(x))]
    return np.vstack([o[0] for o in outs]), np.concatenate([o[1] for o in outs])


@pytest.mark.parametrize("dtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("n_tok", [2, 3, 5, 64, 67])
@pytest.mark.parametrize("ragged", [False, True])
def test_batch_bits_equal_one_token_at_a_time(isa, pool, dtype, n_tok, ragged):
    """A token's output has the same bits in a batch as alone (batch invariance), with a
    threshold, NaN and inf h, an inf weight in a skipped row, and an all-zero h row."""
    n_embd, n_ff = 96, 301  # odd n_ff, more than one block of 256 neurons
    f = FFN("F32", dtype, n_embd, n_ff, seed=30 + n_tok)
    rng = np.random.default_rng(n_tok)
    x = rand_x(rng, n_tok, n_embd)
    g, u = f.gu(pool, x)
    threshold = float(np.quantile(np.abs(h_ref(SWIGLU, g, u)), 0.4))
    x[n_tok - 1, 5] = np.nan if n_tok > 2 else x[n_tok - 1, 5]  # a token of NaN h
    x[n_tok - 2] *= 1e30 if n_tok > 4 else 1  # a token of inf h (where gate x > 0; else +-0, skipped)
    # row 19 of down_t: its first block's d is inf (w inf or NaN); 0 * inf must not reach y
    f.down_t.reshape(n_ff, -1)[19, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    active = None
    if ragged:  # random lists of random lengths; token 1's is empty (an all-zero h row)
        active = [sorted(rng.choice(n_ff, rng.integers(1, n_ff + 1), replace=False).tolist()) for _ in x]
        active[1] = []
        active[0] = list(range(n_ff))
    else:
        x[1] = 0.0  # an all-zero h row
    ref_y, ref_used = one_at_a_time(f, pool, x, active, threshold)
    # dense enough for the masked form (MIN_DENSITY in sparse_down_batch.c, of every 8th token)
    assert ref_used[::8].sum() >= 0.2 * n_ff * len(ref_used[::8])
    assert np.isnan(ref_y[n_tok - 1]).all() == (n_tok > 2)
    assert np.isfinite(ref_y[:, :32]).any()  # tokens that skip row 19
    for n in (1, 2, 3):
        y, n_used = f.sparse(make_pool(n), SWIGLU, x, active, threshold)
        np.testing.assert_array_equal(n_used, ref_used)
        np.testing.assert_array_equal(y.view(np.uint32), ref_y.view(np.uint32))
