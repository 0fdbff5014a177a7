"""The "cpu-device" test device (native/src/device/cpu_device.c,
powerinfer_backend/hybrid/devices/cpu.py): its reservation is exact and refuses more, the
per-layer FFN split (device: hot rows, CPU: cold neurons) equals bit for bit the same
split computed CPU-only, and matches the unsplit FFN within float tolerance; counters show
the device processed the hot rows."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib
from powerinfer_backend.hybrid.devices.cpu import FFN_FORMS, CpuDevice, ffn_bytes

E, FF = 64, 96


def _layer(seed=0, gtype=GT.Q8_0):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
    u = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
    d = (rng.standard_normal((FF, E)) / 8).astype(np.float16)
    if gtype == GT.F32:
        return g, u, d
    return quants.quantize(g, gtype), quants.quantize(u, gtype), d


def _sparse(pool, act, gtype, g, u, d, x, ids, threshold):
    """CPU-only pi_op_ffn_sparse over the neuron ids `ids` (None = all) for every token."""
    n_tok = x.shape[0]
    y = np.empty((n_tok, E), np.float32)
    if ids is None:
        act_ids, off = ffi.NULL, ffi.NULL
    else:
        flat = np.tile(np.asarray(ids, np.int32), n_tok)
        offs = (np.arange(n_tok + 1) * len(ids)).astype(np.int64)
        act_ids = ffi.from_buffer("int32_t[]", flat) if flat.size else ffi.new("int32_t[1]")
        off = ffi.from_buffer("int64_t[]", offs)
    _native.check(lib.pi_op_ffn_sparse(pool, FFN_FORMS[act], int(gtype), ffi.from_buffer(g), ffi.from_buffer(u), E,
                                       FF, int(GT.F16), ffi.from_buffer(d), ffi.from_buffer("float[]", x), n_tok,
                                       act_ids, off, threshold, ffi.from_buffer("float[]", y), ffi.NULL),
                  "pi_op_ffn_sparse")
    return y


def test_reservation_is_exact_and_refuses_more():
    with CpuDevice(1000) as dev:
        assert dev.stats()["reserved"] == 1000 and dev.stats()["used"] == 0
        dev.alloc(700)  # 768 with alignment
        with pytest.raises(MemoryError, match="exceed the device reservation: 768 of 1000 bytes in use"):
            dev.alloc(300)
        with pytest.raises(MemoryError):
            dev.alloc(232)  # 256 with alignment: 1024 > 1000
        s = dev.stats()
        assert (s["used"], s["high_water"], s["n_refused"]) == (768, 768, 2)
    with CpuDevice(1024) as dev:
        dev.alloc(700)
        dev.alloc(232)
        s = dev.stats()
        assert (s["used"], s["high_water"], s["n_refused"]) == (1024, 1024, 0)
    with pytest.raises(ValueError, match="reserve_bytes must be >= 0"):
        CpuDevice(-1)
    with pytest.raises(NotImplementedError, match="'cuda' is not built"):
        CpuDevice(0, kind="cuda")


def test_ffn_bytes_exact():
    # 10 hot Q8_0 rows of 64 (68 B): 680 -> 768 twice; down_t F16 1280; map 40 -> 256;
    # x and y of 4 tokens: 1024 each; plus the operator's scratch (aligned)
    scratch = ffn_bytes(int(GT.Q8_0), int(GT.F16), E, 10, 4) - (768 * 2 + 1280 + 256 + 2 * 1024)
    assert scratch > 0 and scratch % 256 == 0
    assert ffn_bytes(int(GT.Q8_0), int(GT.F16), E, 0, 4) == 0


# F32 gate/up: the F32 row dot is not invariant to where a row lies (the copy on the device
# vs the GGUF map; differences of ~1 ulp, also across ISA paths), so only tolerance there.
@pytest.mark.parametrize("act,gtype,threshold", [("swiglu", GT.Q8_0, 0.0), ("swiglu", GT.Q8_0, 0.05),
                                                 ("relu", GT.Q4_0, 0.0), ("drelu", GT.Q8_0, 0.0),
                                                 ("relu", GT.F32, 0.0)])
def test_split_equals_cpu_only_split(pool, act, gtype, threshold):
    g, u, d = _layer(1, gtype)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, E)).astype(np.float32)
    for hot in ([], [0, 5, 7, 40, 95], list(range(0, FF, 3)), list(range(FF)), list(range(40))):
        cold = sorted(set(range(FF)) - set(hot))
        need = ffn_bytes(int(gtype), int(GT.F16), E, len(hot), 3)
        with CpuDevice(need, n_threads=2) as dev:
            f = dev.upload_ffn(act, int(gtype), g, u, int(GT.F16), d, E, FF, hot, max_tok=3)
            y, y_dev = f.run(x, threshold, return_device_part=True)
            y2 = f.run(x[:1], threshold)
            s = dev.stats()
        y_hot = _sparse(pool, act, gtype, g, u, d, x, hot, threshold) if hot else np.zeros_like(x)
        y_cold = _sparse(pool, act, gtype, g, u, d, x, cold, threshold) if cold else np.zeros_like(x)
        full = _sparse(pool, act, gtype, g, u, d, x, None, threshold)
        if gtype == GT.F32:
            np.testing.assert_allclose(y_dev, y_hot, rtol=1e-5, atol=1e-6)
        else:
            assert np.array_equal(y_dev, y_hot)  # the device half, bit for bit
            if hot == list(range(len(hot))):  # lowest ids hot: the CPU's continuation is the id-order sum
                assert np.array_equal(y, full)
        np.testing.assert_allclose(y, y_hot + y_cold, rtol=1e-5, atol=1e-5)
        assert np.array_equal(y2, y[:1])
        np.testing.assert_allclose(y, full, rtol=1e-5, atol=1e-5)  # hot ids first, then cold: float tolerance
        # the pool held exactly the plan's bytes; the device ran every hot row of every token
        assert s["high_water"] == s["used"] == need <= s["reserved"] and s["n_refused"] == 0
        assert (s["n_jobs"], s["rows"]) == ((2, len(hot) * 4) if hot else (0, 0))


def test_upload_refused_past_the_reservation():
    g, u, d = _layer(3)
    need = ffn_bytes(int(GT.Q8_0), int(GT.F16), E, 8, 1)
    with CpuDevice(need - 1) as dev:
        with pytest.raises(MemoryError, match="exceed the device reservation"):
            dev.upload_ffn("swiglu", int(GT.Q8_0), g, u, int(GT.F16), d, E, FF, list(range(8)))
        s = dev.stats()
        assert s["used"] == 0 and s["n_refused"] == 1  # all or nothing
    with CpuDevice(need) as dev:
        with pytest.raises(ValueError, match="strictly increasing"):
            dev.upload_ffn("swiglu", int(GT.Q8_0), g, u, int(GT.F16), d, E, FF, [3, 2])
        f = dev.upload_ffn("swiglu", int(GT.Q8_0), g, u, int(GT.F16), d, E, FF, list(range(8)))
        with pytest.raises(ValueError, match=r"n_tok 2 outside \[1, 1\]"):
            f.run(np.zeros((2, E), np.float32))
