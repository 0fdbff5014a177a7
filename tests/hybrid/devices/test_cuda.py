"""The CUDA device on a GPU (skipped without libpi_cuda.so, a driver and a device; build
with POWERINFER_CUDA=1): the reservation is exact and refuses more, an upload takes
exactly cuda_ffn_bytes, the GPU half of the split matches the CPU-only computation of
the same hot rows within float tolerance for every gate/up type and FFN form, the merged
result matches the unsplit FFN, and reruns give identical bits (no float atomics)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native

from powerinfer_backend.hybrid.devices import cuda as cuda_device
from powerinfer_backend._native import ffi, lib
from powerinfer_backend.hybrid.devices.cpu import FFN_FORMS

try:
    cuda_device.load()
    _why = None
except RuntimeError as e:
    _why = str(e)
pytestmark = pytest.mark.skipif(_why is not None, reason=f"CUDA device unavailable: {_why}")

FF = 384


def _layer(E, gtype, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
    u = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
    d = (rng.standard_normal((FF, E)) / 8).astype(dtype)
    if gtype == GT.F32:
        return g, u, d
    if gtype == GT.F16:
        return g.astype(np.float16), u.astype(np.float16), d
    return quants.quantize(g, gtype), quants.quantize(u, gtype), d


def _cpu(act, gtype, g, u, d, dtype_id, x, ids, threshold, E):
    """CPU-only pi_op_ffn_sparse over neuron ids (None = all) for every token, and the kept counts."""
    n_tok = x.shape[0]
    y = np.empty((n_tok, E), np.float32)
    used = np.empty(n_tok, np.int64)
    pool = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(2, pool), "pi_pool_create")
    try:
        if ids is None:
            act_ids, off = ffi.NULL, ffi.NULL
        else:
            flat = np.tile(np.asarray(ids, np.int32), n_tok)
            act_ids = ffi.from_buffer("int32_t[]", flat) if flat.size else ffi.new("int32_t[1]")
            off = ffi.from_buffer("int64_t[]", (np.arange(n_tok + 1) * len(ids)).astype(np.int64))
        _native.check(lib.pi_op_ffn_sparse(pool[0], FFN_FORMS[act], int(gtype), ffi.from_buffer(g), ffi.from_buffer(u),
                                           E, FF, dtype_id, ffi.from_buffer(d), ffi.from_buffer("float[]", x), n_tok,
                                           act_ids, off, threshold, ffi.from_buffer("float[]", y),
                                           ffi.from_buffer("int64_t[]", used)), "pi_op_ffn_sparse")
    finally:
        lib.pi_pool_free(pool[0])
    return y, used


def test_reservation_and_memory_measurement():
    with cuda_device.CudaDevice(1000) as dev:
        s = dev.stats()
        assert s["reserved"] == 1000 and s["used"] == 0
        assert s["total_bytes"] > s["free_bytes"] > 0 and s["context_bytes"] > 0 and s["workspace_bytes"] >= 0
        assert s["cc_major"] >= 7 and s["name"]
        dev.alloc(700)  # 768 with alignment
        with pytest.raises(MemoryError, match="exceed the device reservation: 768 of 1000 bytes in use"):
            dev.alloc(300)
        s = dev.stats()
        assert (s["used"], s["high_water"], s["n_refused"]) == (768, 768, 1)
    with pytest.raises(ValueError, match="reserve_bytes must be >= 0"):
        cuda_device.CudaDevice(-1)
    probe = cuda_device.CudaDevice.probe()
    assert probe["reserved"] == 0 and probe["free_bytes"] > 0


def test_upload_takes_exactly_its_bytes_or_nothing():
    E = 128
    g, u, d = _layer(E, GT.Q4_0)
    hot = np.arange(0, FF, 3, dtype=np.int32)
    need = cuda_device.cuda_ffn_bytes(int(GT.Q4_0), int(GT.F16), E, len(hot), 4)
    assert need % 256 == 0 and cuda_device.cuda_ffn_bytes(int(GT.Q4_0), int(GT.F16), E, 0, 4) == 0
    with cuda_device.CudaDevice(need - 1) as dev:
        with pytest.raises(MemoryError, match="exceed the device reservation"):
            dev.upload_ffn("swiglu", int(GT.Q4_0), g, u, int(GT.F16), d, E, FF, hot, 4)
        s = dev.stats()
        assert (s["used"], s["n_refused"]) == (0, 1)
    with cuda_device.CudaDevice(need) as dev:
        f = dev.upload_ffn("swiglu", int(GT.Q4_0), g, u, int(GT.F16), d, E, FF, hot, 4)
        assert f.n_hot == len(hot) and dev.stats()["used"] == need
        with pytest.raises(ValueError, match="n_tok 5 outside"):
            f.run(np.zeros((5, E), np.float32))
        with pytest.raises(ValueError, match="strictly increasing"):
            dev.upload_ffn("swiglu", int(GT.Q4_0), g, u, int(GT.F16), d, E, FF, hot[::-1], 4)


@pytest.mark.parametrize("gtype", [GT.Q4_0, GT.Q4_1, GT.Q8_0, GT.F16, GT.F32])
@pytest.mark.parametrize("act", ["swiglu", "geglu", "relu", "drelu"])
@pytest.mark.parametrize("E,max_tok,n_tok", [(64, 1, 1), (320, 4, 3), (320, 16, 16)])
def test_split_matches_cpu(gtype, act, E, max_tok, n_tok):
    dtype = np.float32 if gtype == GT.F32 else np.float16
    dtype_id = int(GT.F32) if dtype == np.float32 else int(GT.F16)
    g, u, d = _layer(E, gtype, dtype)
    rng = np.random.default_rng(1)
    hot = np.sort(rng.choice(FF, FF // 3, replace=False)).astype(np.int32)
    x = rng.standard_normal((n_tok, E)).astype(np.float32)
    with cuda_device.CudaDevice(cuda_device.cuda_ffn_bytes(int(gtype), dtype_id, E, len(hot), max_tok)) as dev:
        f = dev.upload_ffn(act, int(gtype), g, u, dtype_id, d, E, FF, hot, max_tok)
        y, yd = f.run(x, 0.0, return_device_part=True)
        y2, yd2 = f.run(x, 0.0, return_device_part=True)
        assert np.array_equal(yd, yd2) and np.array_equal(y, y2)  # deterministic
        ref_hot, used_hot = _cpu(act, gtype, g, u, d, dtype_id, x, hot, 0.0, E)
        ref_all, _ = _cpu(act, gtype, g, u, d, dtype_id, x, None, 0.0, E)
        scale = np.abs(ref_all).max()
        np.testing.assert_allclose(yd, ref_hot, rtol=1e-4, atol=1e-5 * scale)
        np.testing.assert_allclose(y, ref_all, rtol=1e-4, atol=1e-5 * scale)
        if act in ("relu", "drelu"):  # a sign decision may flip only for a product at ~0
            assert np.abs(f.last_n_used - used_hot).max() <= 1
        s = dev.stats()
        assert s["n_jobs"] == 2 and s["rows"] == 2 * len(hot) * n_tok


def test_threshold_and_counts():
    E = 256
    g, u, d = _layer(E, GT.Q8_0)
    hot = np.arange(FF // 2, dtype=np.int32)
    x = np.random.default_rng(2).standard_normal((2, E)).astype(np.float32)
    thr = 0.05
    with cuda_device.CudaDevice(cuda_device.cuda_ffn_bytes(int(GT.Q8_0), int(GT.F16), E, len(hot), 2)) as dev:
        f = dev.upload_ffn("swiglu", int(GT.Q8_0), g, u, int(GT.F16), d, E, FF, hot, 2)
        _, yd = f.run(x, thr, return_device_part=True)
        ref, used = _cpu("swiglu", GT.Q8_0, g, u, d, int(GT.F16), x, hot, thr, E)
        # only a neuron within rounding of the threshold may be decided differently
        assert np.abs(f.last_n_used - used).max() <= 1
        np.testing.assert_allclose(yd, ref, atol=2 * thr * np.abs(d.astype(np.float32)).max())
        assert (f.last_n_used < len(hot)).all()


def test_ungated_relu_all_on_device():
    E = 128
    _, u, d = _layer(E, GT.F32, np.float32)
    x = np.random.default_rng(3).standard_normal((1, E)).astype(np.float32)
    hot = np.arange(FF, dtype=np.int32)
    with cuda_device.CudaDevice(cuda_device.cuda_ffn_bytes(0, 0, E, FF, 1, has_gate=False)) as dev:
        f = dev.upload_ffn("relu_ungated", 0, None, u, 0, d, E, FF, hot, 1)
        y = f.run(x)
        h = np.maximum(u.astype(np.float64) @ x[0].astype(np.float64), 0)
        np.testing.assert_allclose(y[0], h @ d.astype(np.float64), rtol=1e-4, atol=1e-4)
    with cuda_device.CudaDevice(1 << 20) as dev:
        f = dev.upload_ffn("relu_ungated", 0, None, u, 0, d, E, FF, hot[:10], 1)
        with pytest.raises(NotImplementedError, match="no ungated FFN form"):
            f.run(x)
