"""A placement plan run on the cpu-device, layer by layer: every layer's device half
equals bit for bit the same hot rows computed CPU-only, and the split matches the
unsplit FFN (the whole model under a plan: tests/hybrid/test_offload.py); the device pool
holds exactly the bytes of the uploaded rows and its counters show every hot row processed."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures.tiny_gguf import write_tiny_llama
from gguf import GGMLQuantizationType as GT

from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import CpuDevice, plan_ffn_bytes, upload_plan
from powerinfer_backend.engine.down_cache import transposed_down
from powerinfer_backend.loader import load_gguf
from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib
from powerinfer_backend.hybrid.devices.cpu import FFN_FORMS


def _cpu(pool, model, i, x, ids):
    hp = model.hparams
    t = model.layer_tensors(i)
    d = transposed_down(model, i, dtype="f16")
    y = np.empty((x.shape[0], hp.n_embd), np.float32)
    if ids is None:
        a, off = ffi.NULL, ffi.NULL
    else:
        flat = np.tile(np.asarray(ids, np.int32), x.shape[0])
        a = ffi.from_buffer("int32_t[]", flat) if flat.size else ffi.new("int32_t[1]")
        off = ffi.from_buffer("int64_t[]", (np.arange(x.shape[0] + 1) * len(ids)).astype(np.int64))
    _native.check(lib.pi_op_ffn_sparse(pool, FFN_FORMS["swiglu"], t[6].type, ffi.from_buffer(t[6].data),
                                       ffi.from_buffer(t[7].data), hp.n_embd, hp.n_ff, int(GT.F16),
                                       ffi.from_buffer(d), ffi.from_buffer("float[]", x), x.shape[0], a, off, 0.0,
                                       ffi.from_buffer("float[]", y), ffi.NULL), "pi_op_ffn_sparse")
    return y


@pytest.mark.parametrize("frac", [0.0, 0.1, 0.5, 1.0])
def test_plan_on_cpu_device(tmp_path, pool, frac):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    model = load_gguf(path, verbose=False)
    sizes = P.ModelSizes.from_gguf(model)
    freq = np.random.default_rng(0).random((2, 128))
    full = P.full_device_bytes(sizes, 64, 2)
    plan = P.plan_placement(sizes, freq, int(full * frac), n_ctx=64, n_batch=2)
    need = plan_ffn_bytes(model, plan, max_tok=2)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    with CpuDevice(need, n_threads=1) as dev:
        ffns = upload_plan(dev, model, plan, max_tok=2)
        for i, f in enumerate(ffns):
            hot = plan.layers[i].hot_ids.tolist()
            cold = sorted(set(range(128)) - set(hot))
            y, y_dev = f.run(x, return_device_part=True)
            y_hot = _cpu(pool, model, i, x, hot) if hot else 0
            y_cold = _cpu(pool, model, i, x, cold) if cold else 0
            assert np.array_equal(y_dev, np.float32(y_hot) + np.zeros_like(y))  # the device half, bit for bit
            np.testing.assert_allclose(y, np.float32(y_hot + y_cold), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y, _cpu(pool, model, i, x, None), rtol=1e-5, atol=1e-5)
        s = dev.stats()
    n_hot = sum(L.n_hot for L in plan.layers)
    assert s["high_water"] == s["used"] == need == s["reserved"] and s["n_refused"] == 0
    assert s["rows"] == 2 * n_hot and s["n_jobs"] == sum(L.n_hot > 0 for L in plan.layers)
    if frac == 1.0:
        assert n_hot == 256
    if frac == 0.0:
        assert need == 0 and n_hot == 0
    model.close()
