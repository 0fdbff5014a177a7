"""The native non-matmul kernels (pi_op_*) against float64 numpy references, on
every instruction-set path this CPU supports (the ``isa`` fixture in conftest.py).

Covered: RMSNorm, the FFN activations, softmax, RoPE (NORM and NEOX layouts),
causal GQA attention over an F32 or F16 KV cache, the activation / KV-cache
converters (pi_op_quantize), and the error paths of each entry point.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib

F32, F16, BF16 = lib.PI_TYPE_F32, lib.PI_TYPE_F16, lib.PI_TYPE_BF16
Q4_0, Q8_0, Q8_1 = lib.PI_TYPE_Q4_0, lib.PI_TYPE_Q8_0, lib.PI_TYPE_Q8_1
NORM, NEOX = lib.PI_ROPE_NORM, lib.PI_ROPE_NEOX
EPS32 = 2.0**-24  # unit roundoff of float32


def fbuf(a: np.ndarray):
    """float* over a C-contiguous float32 array (no copy)."""
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return ffi.from_buffer("float[]", a)


def ibuf(a: np.ndarray):
    assert a.dtype == np.int32 and a.flags.c_contiguous
    return ffi.from_buffer("int32_t[]", a)


# ---- RMSNorm --------------------------------------------------------------------


def rmsnorm_ref(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


@pytest.mark.parametrize("n", [1, 7, 576, 1000])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.25])
def test_rmsnorm(isa, n, with_weight, eps):
    rng = np.random.default_rng(n)
    n_rows = 3
    x = (rng.standard_normal((n_rows, n)) * [[0.01], [1.0], [100.0]]).astype(np.float32)
    w = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32) if with_weight else None
    y = np.full_like(x, np.nan)
    _native.check(
        lib.pi_op_rmsnorm(fbuf(x), fbuf(w) if w is not None else ffi.NULL, n, n_rows, eps, fbuf(y)), "rmsnorm"
    )
    np.testing.assert_allclose(y, rmsnorm_ref(x, w, eps), rtol=2e-6, atol=1e-7)


def test_rmsnorm_zero_row_and_zero_rows(isa):
    x = np.zeros((2, 8), np.float32)
    y = np.full_like(x, np.nan)
    _native.check(lib.pi_op_rmsnorm(fbuf(x), ffi.NULL, 8, 2, 1e-5, fbuf(y)), "rmsnorm")
    assert np.array_equal(y, x)  # eps > 0 keeps an all-zero row finite
    # n_rows = 0 is a no-op, not an error
    _native.check(lib.pi_op_rmsnorm(fbuf(x), ffi.NULL, 8, 0, 1e-5, fbuf(y)), "rmsnorm")


# ---- LayerNorm (Falcon, OPT) ----------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 576])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm(isa, n, affine):
    rng = np.random.default_rng(n + 1)
    n_rows = 3
    x = (rng.standard_normal((n_rows, n)) * [[0.01], [1.0], [100.0]] + [[5.0], [-1.0], [300.0]]).astype(np.float32)
    w = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32) if affine else None
    b = (0.5 * rng.standard_normal(n)).astype(np.float32) if affine else None
    y = np.full_like(x, np.nan)

    def nul(a):
        return fbuf(a) if a is not None else ffi.NULL

    _native.check(lib.pi_op_layernorm(fbuf(x), nul(w), nul(b), n, n_rows, 1e-5, fbuf(y)), "layernorm")
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    if affine:
        ref = ref * w + b
    # the float32 mean's rounding (2^-24 of |mean|) carries into x - mean, scaled by 1/std
    std = np.sqrt(((x64 - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6 + 2e-7 * float((np.abs(mu) / std).max()))
    with pytest.raises(ValueError, match="bad sizes"):
        _native.check(lib.pi_op_layernorm(fbuf(x), ffi.NULL, ffi.NULL, 0, 1, 1e-5, fbuf(y)), "layernorm")


# ---- activations --------------------------------------------------------------------


def act_ref(name: str, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":  # tanh approximation (Hendrycks & Gimpel), as ggml
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return np.maximum(x, 0.0)


ACT_IDS = {"silu": lib.PI_ACT_SILU, "gelu": lib.PI_ACT_GELU, "relu": lib.PI_ACT_RELU}


@pytest.mark.parametrize("name", list(ACT_IDS))
def test_act(isa, name):
    x = np.concatenate(
        [
            np.linspace(-12.0, 12.0, 1001),
            [-100.0, -50.0, -1e-30, 0.0, 1e-30, 50.0, 100.0],
            np.random.default_rng(1).standard_normal(37) * 4,
        ]
    ).astype(np.float32)
    y = np.full_like(x, np.nan)
    _native.check(lib.pi_op_act(ACT_IDS[name], fbuf(x), fbuf(y), x.size), "act")
    with np.errstate(over="ignore"):
        ref = act_ref(name, x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    if name == "relu":
        assert np.array_equal(y, np.maximum(x, 0))


@pytest.mark.parametrize("order", ["avx2", "avx512"])
def test_silu_same_bits_on_every_path(restore_order, order):
    """SiLU (isa/ffn_act.h): per F16 order (llama.cpp's 256-bit or AVX-512 exp), every ISA path
    this CPU runs gives the same bits, the vector loops (pi_op_act over the whole array,
    tails of 1-15) and one element at a time (a sparse FFN's single neuron) alike; inputs
    include |x| > 87.3 (2^n beyond 2^126: the 256-bit exp's slow path) and > 133 (exp(-x)
    is 0 or inf), and the results stay within 4e-7 relative of x / (1 + exp(-x))."""
    rng = np.random.default_rng(7)
    special = [-200.0, -133.5, -100.0, -89.0, -88.0, -87.5, -0.0, 0.0, 1e-30, 87.5, 88.0, 89.0, 100.0, 133.5, 200.0]
    x = np.concatenate([special, np.linspace(-30, 30, 2001), rng.standard_normal(45) * 6]).astype(np.float32)
    ref = x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))
    _native.set_f16_order(order)
    outs = {}
    for name in _native.supported_isas():
        _native.set_isa(name)
        for n in (x.size, 17, 15, 1):  # the vector loop with tails, then alone
            y = np.full(n, np.nan, np.float32)
            _native.check(lib.pi_op_act(ACT_IDS["silu"], fbuf(x[:n]), fbuf(y), n), "act")
            outs[name, n] = y
        one = np.array([outs[name, 1][0]])
        for i in range(1, 40):  # single elements, from the special ones on
            y = np.full(1, np.nan, np.float32)
            _native.check(lib.pi_op_act(ACT_IDS["silu"], fbuf(x[i : i + 1]), fbuf(y), 1), "act")
            one = np.append(one, y)
        outs[name, "one"] = one
    first = outs["scalar", x.size]
    for key, y in outs.items():
        want = first[:40] if key[1] == "one" else first[: key[1]]
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (order, key)
    np.testing.assert_allclose(first, ref, rtol=4e-7, atol=1e-30)


# ---- softmax ---------------------------------------------------------------------


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


SOFTMAX_CASES = {
    "random": np.random.default_rng(2).standard_normal(37) * 3,
    "long": np.random.default_rng(3).standard_normal(1000) * 10,
    "large": np.array([1e4, 1e4 - 1.0, 1e4 - 30.0, -1e4, 3e38]),
    "large_equal": np.array([8e37, 8e37, 8e37]),
    "neg_inf": np.array([0.5, -np.inf, 1.0, -np.inf, -3.0]),
    "one": np.array([123.0]),
    "one_neg": np.array([-1e30]),
}


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax(isa, case):
    x = SOFTMAX_CASES[case].astype(np.float32)
    ref = softmax_ref(x)
    y = x.copy()
    _native.check(lib.pi_op_softmax(fbuf(y), y.size), "softmax")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)
    assert abs(float(y.astype(np.float64).sum()) - 1.0) < 1e-5
    assert np.all(y[np.isneginf(x)] == 0.0)


# ---- RoPE ----------------------------------------------------------------------------


def rope_ref(x, pos, n_head, head_dim, n_rot, base, scale, freq_factors, mode):
    """Rotary embedding in float64. Pair i (i < n_rot/2) of each head turns by
    theta_i = pos * scale * base^(-2i/n_rot) / freq_factors[i]; NORM pairs
    (2i, 2i+1), NEOX pairs (i, i + n_rot/2); dims >= n_rot are left alone.
    Returns (rotated x, theta [n_tok, n_rot/2])."""
    half = n_rot // 2
    i = np.arange(half)
    ff = np.ones(half) if freq_factors is None else freq_factors.astype(np.float64)
    theta = pos.astype(np.float64)[:, None] * scale * base ** (-2.0 * i / n_rot) / ff
    v = x.astype(np.float64).reshape(len(pos), n_head, head_dim).copy()
    a, b = (2 * i, 2 * i + 1) if mode == NORM else (i, i + half)
    x0, x1 = v[:, :, a].copy(), v[:, :, b].copy()
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    v[:, :, a] = x0 * c - x1 * s
    v[:, :, b] = x0 * s + x1 * c
    return v.reshape(x.shape), theta


ROPE_CASES = [
    # n_head, head_dim, n_rot, base, freq_scale, freq_factors?, mode
    (3, 64, 32, 10000.0, 0.25, True, NORM),
    (3, 64, 32, 10000.0, 0.25, True, NEOX),
    (2, 48, 48, 10000.0, 1.0, False, NORM),
    (2, 48, 48, 10000.0, 1.0, False, NEOX),
    (4, 16, 8, 500000.0, 0.5, False, NORM),
    (1, 128, 128, 500000.0, 1.0, True, NEOX),
    (2, 10, 2, 10000.0, 2.0, True, NORM),
]


@pytest.mark.parametrize(
    "case", ROPE_CASES, ids=lambda c: f"h{c[0]}d{c[1]}r{c[2]}s{c[4]}{'ff' if c[5] else ''}-{'neox' if c[6] else 'norm'}"
)
def test_rope(isa, case):
    n_head, head_dim, n_rot, base, scale, use_ff, mode = case
    pos = np.array([0, 1, 2, 7, 100, 1023, 5000], np.int32)
    rng = np.random.default_rng(head_dim * 1000 + n_rot)
    x = rng.standard_normal((pos.size, n_head * head_dim)).astype(np.float32)
    ff = np.linspace(1.0, 8.0, n_rot // 2).astype(np.float32) if use_ff else None
    y = x.copy()
    _native.check(
        lib.pi_op_rope(
            fbuf(y),
            pos.size,
            n_head,
            head_dim,
            n_rot,
            ibuf(pos),
            base,
            scale,
            fbuf(ff) if ff is not None else ffi.NULL,
            mode,
        ),
        "rope",
    )
    ref, theta = rope_ref(x, pos, n_head, head_dim, n_rot, base, scale, ff, mode)

    # Dimensions past n_rot are copied through untouched, bit for bit.
    y3, x3 = y.reshape(pos.size, n_head, head_dim), x.reshape(pos.size, n_head, head_dim)
    assert np.array_equal(y3[:, :, n_rot:], x3[:, :, n_rot:])
    # Position 0 is the identity.
    assert np.array_equal(y[0], x[0])

    # Error bound. The kernel computes theta_i in float32 as ggml does:
    # pos * theta_scale^i by repeated multiplication, theta_scale = powf(base,
    # -2/n_rot) (<= 1 ulp off), then * scale / freq_factor. Each step adds at most
    # ~1 ulp of relative error, so |angle error| <= theta_i * (4 i + 4) * 2^-24;
    # a rotation by a wrong angle moves the pair by (radius * angle error), and the
    # rotation itself adds a few float32 roundings of the radius.
    half = n_rot // 2
    i = np.arange(half)
    angle_err = theta * (4 * i + 4) * EPS32  # [n_tok, half]
    a, b = (2 * i, 2 * i + 1) if mode == NORM else (i, i + half)
    radius = np.hypot(x3[:, :, a].astype(np.float64), x3[:, :, b].astype(np.float64))
    tol_pair = radius * (angle_err[:, None, :] + 8 * EPS32) + 1e-7
    tol = np.zeros(x3.shape)
    tol[:, :, a] = tol_pair
    tol[:, :, b] = tol_pair
    err = np.abs(y3 - ref.reshape(x3.shape))
    assert np.all(err <= tol), f"max err {err.max():.3g}, worst excess {(err - tol).max():.3g}"


# ---- attention ---------------------------------------------------------------------


def attention_ref(q, k, v_t, n_head, n_head_kv, hd, pos, f16_cache):
    """softmax(q . k / sqrt(hd)) . v per query token and head, in float64.

    q: [n_tok, n_head*hd]; k: [n_kv, n_head_kv*hd]; v_t: [n_head_kv*hd, v_ld]
    (V transposed). Query head h reads KV head h // (n_head / n_head_kv); token t
    sees positions 0..pos[t]. With an F16 cache the kernel rounds q and the softmax
    weights to F16 before the dot products (as llama.cpp); so does this reference.
    """
    group = n_head // n_head_kv
    out = np.zeros((len(pos), n_head * hd))
    k64, v64 = k.astype(np.float64), v_t.astype(np.float64)
    for t, p in enumerate(pos):
        for h in range(n_head):
            g = h // group
            qh = q[t, h * hd : (h + 1) * hd]
            if f16_cache:
                qh = qh.astype(np.float16)
            scores = k64[: p + 1, g * hd : (g + 1) * hd] @ qh.astype(np.float64) / math.sqrt(hd)
            w = softmax_ref(scores)
            if f16_cache:
                w = w.astype(np.float16).astype(np.float64)
            out[t, h * hd : (h + 1) * hd] = v64[g * hd : (g + 1) * hd, : p + 1] @ w
    return out


def run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, kv_type, n_kv, pos):
    out = np.full((q.shape[0], n_head * hd), np.nan, np.float32)
    rc = lib.pi_op_attention(
        pool,
        fbuf(q),
        q.shape[0],
        n_head,
        n_head_kv,
        hd,
        ffi.from_buffer(k),
        ffi.from_buffer(v_t),
        v_t.shape[1],
        kv_type,
        n_kv,
        ibuf(pos),
        fbuf(out),
    )
    _native.check(rc, "attention")
    return out


@pytest.mark.parametrize("kv_type", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=["gqa6x2", "mha4"])
@pytest.mark.parametrize("n_tok", [1, 5])
@pytest.mark.parametrize("hd", [64, 48])
def test_attention(isa, pool, kv_type, heads, n_tok, hd):
    n_head, n_head_kv = heads
    n_kv, v_ld = 11, 16
    # n_tok = 1: the query sits at the last cached position. n_tok = 5: queries at
    # positions 4..8 (as a prompt batch after 4 cached tokens); positions 9 and 10
    # are filled with NaN and must never be read (causality).
    pos = np.array([n_kv - 1] if n_tok == 1 else [4, 5, 6, 7, 8], np.int32)
    rng = np.random.default_rng(hd * 100 + n_head * 10 + n_tok)
    dt = np.float16 if kv_type == F16 else np.float32
    q = (rng.standard_normal((n_tok, n_head * hd)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_head_kv * hd)) * 0.5).astype(dt)
    v_t = np.full((n_head_kv * hd, v_ld), np.nan, dt)  # columns >= n_kv: padding, never read
    v_t[:, :n_kv] = rng.standard_normal((n_head_kv * hd, n_kv)).astype(dt)
    k[pos.max() + 1 :] = np.nan
    v_t[:, pos.max() + 1 :] = np.nan

    out = run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, kv_type, n_kv, pos)
    ref = attention_ref(q, k, v_t, n_head, n_head_kv, hd, pos, kv_type == F16)
    assert np.all(np.isfinite(out))
    # F32: float32 accumulation only. F16: the reference rounds q and the weights
    # to F16 too; left are float32 sums and an occasional 1-ulp difference in a
    # rounded F16 weight (2^-11 relative, times |v| <= ~4).
    atol = 2e-5 if kv_type == F32 else 2e-3
    np.testing.assert_allclose(out, ref, rtol=0, atol=atol)
    # Against exact float64 math (no F16 rounding of q or the weights) an F16
    # cache is still close: q rounding is 2^-11 relative per element.
    exact = attention_ref(q, k, v_t, n_head, n_head_kv, hd, pos, False)
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-5 if kv_type == F32 else 1e-2)


@pytest.mark.parametrize("order", ["avx2", "avx512"])
@pytest.mark.parametrize("hd", [64, 48, 80])
def test_attention_f16_same_bits_on_every_path(restore_order, pool, hd, order):
    """An F16 cache: q and the weights rounded to F16 once, then held as floats for every K
    and V row (isa dot_f16_f32): per F16 order, every ISA path gives the same bits; head
    sizes with whole dot steps, a tail only (48 < 64) and steps plus a tail (80)."""
    n_head, n_head_kv, n_kv = 6, 2, 150
    rng = np.random.default_rng(hd)
    q = (rng.standard_normal((3, n_head * hd)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_head_kv * hd)) * 0.5).astype(np.float16)
    v_t = rng.standard_normal((n_head_kv * hd, 192)).astype(np.float16)
    pos = np.array([40, 100, 149], np.int32)
    _native.set_f16_order(order)
    outs = {}
    for name in _native.supported_isas():
        _native.set_isa(name)
        outs[name] = run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, F16, n_kv, pos)
    for name, o in outs.items():
        assert np.array_equal(o.view(np.uint32), outs["scalar"].view(np.uint32)), (order, name)


def test_attention_gqa_heads_share_kv(isa, pool):
    """Query heads of one group whose q rows are equal give equal outputs; the
    group of head h is h // (n_head / n_head_kv), not h % n_head_kv."""
    n_head, n_head_kv, hd, n_kv = 6, 2, 64, 7
    rng = np.random.default_rng(5)
    q1 = rng.standard_normal(hd).astype(np.float32)
    q = np.tile(q1, (1, n_head))
    k = rng.standard_normal((n_kv, n_head_kv * hd)).astype(np.float32)
    v_t = rng.standard_normal((n_head_kv * hd, n_kv)).astype(np.float32)
    pos = np.array([n_kv - 1], np.int32)
    out = run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, F32, n_kv, pos).reshape(n_head, hd)
    for h in range(n_head):
        assert np.array_equal(out[h], out[(h // 3) * 3])
    assert not np.allclose(out[0], out[3])


# ---- activation / KV-cache conversion (pi_op_quantize) -----------------------------

Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", 32)])  # 34 bytes
Q8_1_BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])  # 36 bytes


def q8_ref(x: np.ndarray):
    """ggml's x86 Q8_0 activation quantizer, in float32 arithmetic: per block of 32,
    d = amax / 127, id = 127 / amax (0 when amax = 0; not 1 / d),
    q = round-half-to-even(x * id) (np.round); d stored as F16.
    Returns (d float32 before F16 rounding, q int8 [n_blocks, 32])."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.round(xb * inv[:, None])
    return d, q.astype(np.int8)


def bf16_ref(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (no NaN in the inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def quantize_input(n_blocks: int = 8) -> np.ndarray:
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n_blocks * 32).astype(np.float32) * 3
    x[32:64] = 0.0  # all-zero block: d = 0, q = 0
    x[64:96] = np.arange(-16, 16) + 0.5  # ties after scaling by 1 (amax 127 below)
    x[64] = -127.0
    x[96:128] *= 1e4  # large
    x[128:160] *= 1e-6  # tiny
    return x


@pytest.mark.parametrize("qtype", [Q8_0, Q8_1, F16, BF16, F32], ids=["q8_0", "q8_1", "f16", "bf16", "f32"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_quantize_matches_reference_bit_for_bit(isa, qtype):
    x = quantize_input()
    n = x.size
    nbytes = {Q8_0: n // 32 * 34, Q8_1: n // 32 * 36, F16: 2 * n, BF16: 2 * n, F32: 4 * n}[qtype]
    y = np.zeros(nbytes, np.uint8)
    _native.check(lib.pi_op_quantize(qtype, fbuf(x), n, ffi.from_buffer(y, require_writable=True)), "quantize")
    if qtype in (Q8_0, Q8_1):
        blocks = y.view(Q8_0_BLOCK if qtype == Q8_0 else Q8_1_BLOCK)
        d, q = q8_ref(x)
        assert np.array_equal(blocks["qs"], q)
        assert np.array_equal(blocks["d"].view(np.uint16), d.astype(np.float16).view(np.uint16))
        # block 2 is -127, -14.5, ..., -0.5, 0.5, ..., 15.5 with d = 1: halves round to even
        halves = np.arange(-15, 16) + 0.5
        assert np.array_equal(q[2], np.concatenate([[-127], 2 * np.floor((halves + 0.5) / 2)]))
        if qtype == Q8_1:  # s = d * sum(q), d before F16 rounding
            s = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float16)
            assert np.array_equal(blocks["s"].view(np.uint16), s.view(np.uint16))
    elif qtype == F16:
        assert np.array_equal(y.view(np.uint16), x.astype(np.float16).view(np.uint16))
    elif qtype == BF16:
        assert np.array_equal(y.view(np.uint16), bf16_ref(x))
    else:
        assert np.array_equal(y.view(np.float32), x)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_quantize_f16_special_values(isa):
    x = np.array(
        [65504.0, 65520.0, 1e5, -1e5, np.inf, -np.inf, 6e-8, 3e-8, 1e-9, -0.0, 5.96e-8, 6.1e-5, 2049.0, 2051.0],
        np.float32,
    )
    y = np.zeros(x.size, np.uint16)
    _native.check(lib.pi_op_quantize(F16, fbuf(x), x.size, ffi.from_buffer(y, require_writable=True)), "quantize")
    assert np.array_equal(y, x.astype(np.float16).view(np.uint16))


# ---- error paths -------------------------------------------------------------------


def test_errors_rope(isa):
    x = np.zeros((1, 16), np.float32)
    pos = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="n_rot 7"):
        _native.check(lib.pi_op_rope(fbuf(x), 1, 1, 16, 7, ibuf(pos), 1e4, 1.0, ffi.NULL, NORM), "rope")
    with pytest.raises(ValueError, match="n_rot 18"):
        _native.check(lib.pi_op_rope(fbuf(x), 1, 1, 16, 18, ibuf(pos), 1e4, 1.0, ffi.NULL, NORM), "rope")
    with pytest.raises(ValueError, match="rope type 1"):
        _native.check(lib.pi_op_rope(fbuf(x), 1, 1, 16, 16, ibuf(pos), 1e4, 1.0, ffi.NULL, 1), "rope")
    with pytest.raises(ValueError, match="freq_base"):
        _native.check(lib.pi_op_rope(fbuf(x), 1, 1, 16, 16, ibuf(pos), 0.0, 1.0, ffi.NULL, NORM), "rope")


def test_errors_attention(isa, pool):
    hd, n_kv = 8, 4
    q = np.zeros((1, 6 * hd), np.float32)
    k = np.zeros((n_kv, 2 * hd), np.float32)
    v_t = np.zeros((2 * hd, n_kv), np.float32)
    out = np.zeros_like(q)

    def call(n_head=6, n_head_kv=2, kv_type=F32, pos=(n_kv - 1,), v_ld=n_kv, n_kv_=n_kv):
        p = np.array(pos, np.int32)
        return lib.pi_op_attention(
            pool,
            fbuf(q),
            1,
            n_head,
            n_head_kv,
            hd,
            ffi.from_buffer(k),
            ffi.from_buffer(v_t),
            v_ld,
            kv_type,
            n_kv_,
            ibuf(p),
            fbuf(out),
        )

    _native.check(call(), "attention")  # the baseline is valid
    with pytest.raises(ValueError, match=r"pos\[0\] = 4 outside \[0, 4\)"):
        _native.check(call(pos=(n_kv,)), "attention")
    with pytest.raises(ValueError, match=r"pos\[0\] = -1"):
        _native.check(call(pos=(-1,)), "attention")
    with pytest.raises(ValueError, match="bad sizes"):
        _native.check(call(n_head=6, n_head_kv=4), "attention")  # 6 % 4 != 0
    with pytest.raises(ValueError, match="bad sizes"):
        _native.check(call(v_ld=n_kv - 1), "attention")
    with pytest.raises(NotImplementedError, match="F16 or F32"):
        _native.check(call(kv_type=Q8_0), "attention")
    with pytest.raises(ValueError, match="NULL"):
        _native.check(
            lib.pi_op_attention(
                ffi.NULL,
                fbuf(q),
                1,
                6,
                2,
                hd,
                ffi.from_buffer(k),
                ffi.from_buffer(v_t),
                n_kv,
                F32,
                n_kv,
                ibuf(np.zeros(1, np.int32)),
                fbuf(out),
            ),
            "attention",
        )


def test_errors_act_softmax_rmsnorm_quantize(isa):
    x = np.zeros(64, np.float32)
    y = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="unknown activation 7"):
        _native.check(lib.pi_op_act(7, fbuf(x), fbuf(y), 64), "act")
    with pytest.raises(ValueError, match="softmax"):
        _native.check(lib.pi_op_softmax(fbuf(x), 0), "softmax")
    with pytest.raises(ValueError, match="rmsnorm"):
        _native.check(lib.pi_op_rmsnorm(fbuf(x), ffi.NULL, 0, 1, 1e-5, fbuf(y)), "rmsnorm")
    with pytest.raises(NotImplementedError, match="not an activation type"):
        _native.check(lib.pi_op_quantize(Q4_0, fbuf(x), 64, ffi.from_buffer(y)), "quantize")
    with pytest.raises(NotImplementedError):
        _native.check(lib.pi_op_quantize(99, fbuf(x), 64, ffi.from_buffer(y)), "quantize")
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.check(lib.pi_op_quantize(Q8_0, fbuf(x), 33, ffi.from_buffer(y)), "quantize")


def test_set_isa_errors():
    before = _native.isa_name()
    with pytest.raises(ValueError, match="unknown ISA 'foo'"):
        _native.set_isa("foo")
    with pytest.raises(ValueError, match="NUL"):
        _native.set_isa("avx2\0junk")  # C would read "avx2"
    with pytest.raises(TypeError, match="must be a str, got bytes"):
        _native.set_isa(b"avx2")
    with pytest.raises(TypeError, match="set_f16_order: the name must be a str, got NoneType"):
        _native.set_f16_order(None)
    assert _native.isa_name() == before  # a failed set changes nothing
    try:
        for name in ("scalar", "avx2", "avx512", "avx512vnni"):
            if name in _native.supported_isas():
                _native.set_isa(name)
                assert _native.isa_name() == name
            else:
                with pytest.raises(NotImplementedError):
                    _native.set_isa(name)
    finally:
        _native.set_isa("auto")
    assert _native.isa_name() == _native.supported_isas()[-1]  # auto = the widest path


@pytest.mark.parametrize("kv_type", [F32, F16], ids=["f32", "f16"])
def test_attention_reads_padded_v_with_zero_weight(isa, pool, kv_type):
    """V dot products run over whole 64-cell blocks (as llama.cpp's padded KV view):
    finite garbage in cells past the causal range must not change the result."""
    n_head, n_head_kv, hd, n_kv, v_ld = 4, 2, 64, 11, 64
    rng = np.random.default_rng(7)
    dt = np.float16 if kv_type == F16 else np.float32
    q = (rng.standard_normal((1, n_head * hd)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_head_kv * hd)) * 0.5).astype(dt)
    v_t = np.zeros((n_head_kv * hd, v_ld), dt)
    v_t[:, :n_kv] = rng.standard_normal((n_head_kv * hd, n_kv)).astype(dt)
    pos = np.array([n_kv - 1], np.int32)
    clean = run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, kv_type, n_kv, pos)
    v_t[:, n_kv:] = 1000.0
    dirty = run_attention(pool, q, k, v_t, n_head, n_head_kv, hd, kv_type, n_kv, pos)
    assert np.array_equal(clean, dirty)
    ref = attention_ref(q, k, v_t, n_head, n_head_kv, hd, pos, kv_type == F16)
    np.testing.assert_allclose(dirty, ref, rtol=0, atol=2e-5 if kv_type == F32 else 2e-3)
