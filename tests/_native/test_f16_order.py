"""The two F16 dot orders (native/src/isa/select.c): llama.cpp's ggml_vec_dot_f16 as
its AVX-512 build runs it (GGML_F16_STEP 64, EPR 16) and as its AVX2 build does
(STEP 32, EPR 8). The default is the one llama.cpp runs on this CPU (avx512 iff the CPU
has AVX512F); POWERINFER_F16_ORDER / _native.set_f16_order override it.

  * every ISA path gives the same bits for a given order, on F16 dots of lengths
    1..300 (pi_op_matmul with F16 weights) and on a tiny F16 model's logits (F16
    matrices and F16 KV cache);
  * both orders equal a numpy emulation of ggml's loop and GGML_F32xN_REDUCE, and the
    order of the installed libggml-cpu's build equals its ggml_vec_dot_f16 bit for bit;
  * the default, the environment variable and the errors.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend import _native
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures import ROOT
from tests.fixtures.ggml import GGML_VEC_DOT, ggml_cpu
from tests.fixtures.tiny_gguf import write_tiny_llama

ffi, lib = _native.ffi, _native.lib
ORDERS = ("avx2", "avx512")
LENGTHS = range(1, 301)
F16 = 1  # PI_TYPE_F16


def cpu_has_avx512f() -> bool | None:
    """AVX512F from /proc/cpuinfo (None where there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return None if flags is None else "avx512f" in flags


def rows(n: int, n_rows: int = 4, n_tok: int = 2):
    """F16 weight rows and F16-exact float32 activations (so their F16 conversion is
    lossless and ggml sees the same bytes): zero-mean, with cancellation."""
    rng = np.random.default_rng(n)
    w = rng.standard_normal((n_rows, n)).astype(np.float16)
    x = (rng.standard_normal((n_tok, n)) * 3).astype(np.float16)
    return w, x


def dots(pool, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """pi_op_matmul of F16 rows w [r, n] with activations x [t, n] -> [t, r]."""
    wb = np.ascontiguousarray(w)
    xf = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _native.check(
        lib.pi_op_matmul(
            pool,
            F16,
            ffi.from_buffer(wb),
            w.shape[0],
            w.shape[1],
            ffi.from_buffer("float[]", xf),
            x.shape[0],
            ffi.from_buffer("float[]", y),
        ),
        "pi_op_matmul",
    )
    return y


def all_dots(pool) -> np.ndarray:
    """dots() for every length, concatenated."""
    return np.concatenate([dots(pool, *rows(n)).ravel() for n in LENGTHS])


def ggml_dots(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """libggml-cpu's ggml_vec_dot_f16 of every row of w with every row of x -> [t, r]."""
    tr = ggml_cpu().ggml_get_type_traits_cpu(F16).contents
    if tr.vec_dot_type != F16 or not tr.vec_dot:
        pytest.skip("unexpected ggml_type_traits_cpu layout")
    dot, r = GGML_VEC_DOT(tr.vec_dot), ctypes.c_float()
    w, x = np.ascontiguousarray(w), np.ascontiguousarray(x)
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for t in range(x.shape[0]):
        for i in range(w.shape[0]):
            dot(w.shape[1], ctypes.byref(r), 0, w[i].ctypes.data, 0, x[t].ctypes.data, 0, 1)
            out[t, i] = r.value
    return out


def emulate(w: np.ndarray, x: np.ndarray, order: str) -> np.ndarray:
    """ggml_vec_dot_f16 in numpy for one build: ARR = 4 accumulators of EPR lanes over
    STEP-element steps (fused multiply-add: the F16 product is exact in float and the
    sum of two floats in double rounds to float correctly), GGML_F32xN_REDUCE, then the
    n % STEP tail in double."""
    epr = 16 if order == "avx512" else 8
    step = 4 * epr
    n = w.shape[-1]
    np_ = n - n % step
    wf, xf = w.astype(np.float32)[None], x.astype(np.float32)[:, None]  # [1, r, n], [t, 1, n]
    acc = np.zeros((x.shape[0], w.shape[0], 4, epr), np.float32)
    for i in range(0, np_, step):
        p = (wf[..., i : i + step] * xf[..., i : i + step]).reshape(*acc.shape)
        acc = (acc.astype(np.float64) + p.astype(np.float64)).astype(np.float32)
    v = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])  # [t, r, epr]
    if order == "avx512":  # _mm512_reduce_add_ps: halves of 8, 4, 2, then the pair
        for h in (8, 4, 2, 1):
            v = v[..., :h] + v[..., h : 2 * h]
    else:  # low + high 128 bits, then two _mm_hadd_ps
        t0 = v[..., :4] + v[..., 4:]
        v = (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])
    s = np.where(np_ > 0, v.reshape(v.shape[:2]), np.float32(0)).astype(np.float64)
    tail = (wf[..., np_:] * xf[..., np_:]).astype(np.float64)  # float products, in double
    for k in range(tail.shape[-1]):
        s = s + tail[..., k]
    return s.astype(np.float32)


# ---- every ISA path, both orders -------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
def test_isa_paths_bit_identical(pool1, restore_order, order):
    _native.set_f16_order(order)
    ref = None
    for name in _native.supported_isas():
        _native.set_isa(name)
        assert _native.f16_order_name() == order  # the order survives a change of path
        y = all_dots(pool1)
        if ref is None:
            ref = y
        else:
            assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), f"{name} != scalar ({order} order)"


def test_orders_differ(pool1, restore_order):
    """Both orders agree below 32 elements (all in the double tail) and not beyond."""
    out = {}
    for order in ORDERS:
        _native.set_f16_order(order)
        out[order] = [dots(pool1, *rows(n)) for n in LENGTHS]
    for n, a, b in zip(LENGTHS, out["avx2"], out["avx512"]):
        if n < 32:
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), n
    assert sum(not np.array_equal(a, b) for a, b in zip(out["avx2"], out["avx512"])) > 100


@pytest.mark.parametrize("order", ORDERS)
def test_matches_emulation(pool1, restore_order, order):
    _native.set_f16_order(order)
    for name in _native.supported_isas():
        _native.set_isa(name)
        for n in LENGTHS:
            w, x = rows(n)
            y, ref = dots(pool1, w, x), emulate(w, x, order)
            assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), f"{name} {order} n={n}"


@pytest.mark.llama_cpp
@pytest.mark.skipif(ggml_cpu() is None, reason="llama-cpp-python's libggml-cpu not found")
def test_bit_identical_to_llama_cpp(pool1, restore_order):
    """The order of the installed libggml-cpu's build, on every path, equals its
    ggml_vec_dot_f16; and where that build is this CPU's, it is the default order."""
    built_avx512 = bool(ggml_cpu().ggml_cpu_has_avx512())
    order = "avx512" if built_avx512 else "avx2"
    if built_avx512 == cpu_has_avx512f():
        _native.set_f16_order("auto")
        assert _native.f16_order_name() == order
    _native.set_f16_order(order)
    for n in LENGTHS:
        w, x = rows(n)
        ref = ggml_dots(w, x)
        for name in _native.supported_isas():
            _native.set_isa(name)
            y = dots(pool1, w, x)
            assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (
                f"{name} {order} n={n}: max |diff| {np.abs(y - ref).max():.3g}"
            )


# ---- through a model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory):
    # head_dim 64 (q.k over one 64-step), n_ff 160 (a 32-element tail in the 64-step order)
    path = write_tiny_llama(
        tmp_path_factory.mktemp("f16") / "tiny-f16.gguf",
        n_embd=128,
        n_head=2,
        n_head_kv=1,
        n_ff=160,
        n_vocab=96,
        types={"matrix": T.F16},
        seed=7,
    )
    return NativeModel(load_gguf(path, verbose=False))


def model_logits(model) -> np.ndarray:
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 96, 48)]  # V rows over up to 48 positions
    ctx = NativeContext(model, n_ctx=64, n_batch=16, n_threads=2, kv_f16=True)
    return np.array(ctx.eval(tokens, logits_all=True))


def test_model_logits_bit_identical(f16_model, restore_order):
    out = {}
    for order in ORDERS:
        _native.set_f16_order(order)
        for name in _native.supported_isas():
            _native.set_isa(name)
            y = model_logits(f16_model)
            ref = out.setdefault(order, y)
            assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), f"{name} != scalar ({order} order)"
    assert not np.array_equal(out["avx2"], out["avx512"])  # the order reaches the model


# ---- default, override, errors --------------------------------------------------------------


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("POWERINFER_F16_ORDER", "POWERINFER_ISA")}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [e.get("PYTHONPATH")])])
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)


CODE = "from powerinfer_backend import _native as n; print(n.f16_order_name(), n.isa_name())"


@pytest.mark.fresh_process
def test_default_order_follows_avx512f(restore_order):
    has = cpu_has_avx512f()
    if has is None:
        pytest.skip("no /proc/cpuinfo")
    expected = "avx512" if has else "avx2"
    _native.set_f16_order("auto")
    assert _native.f16_order_name() == expected
    r = run_python(CODE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == expected
    r = run_python(CODE, POWERINFER_ISA="scalar")  # the order is the CPU's, not the path's
    assert r.stdout.split() == [expected, "scalar"], r.stderr


@pytest.mark.fresh_process
@pytest.mark.parametrize("order", ORDERS)
def test_environment_override(order):
    r = run_python(CODE, POWERINFER_F16_ORDER=f" {order.upper()} ")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == order


@pytest.mark.fresh_process
def test_bad_environment_value_raises():
    r = run_python(CODE, POWERINFER_F16_ORDER="sse")
    assert r.returncode != 0 and "ValueError" in r.stderr and "POWERINFER_F16_ORDER" in r.stderr


def test_set_f16_order_errors(restore_order):
    for order in ORDERS:
        _native.set_f16_order(order)
        for bad in ("avx", "scalar", "64", "avx512f"):
            with pytest.raises(ValueError, match="unknown F16 order"):
                _native.set_f16_order(bad)
            assert _native.f16_order_name() == order  # a failed set changes nothing
