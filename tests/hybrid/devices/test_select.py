"""Device names over the devices ggml reports (hybrid/devices/select.py), and the byte rule
of an open device (DeviceSizer) against the pure-Python default (placement.CPU_BUFT)."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend.engine import ggml
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device

F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 8, 12, 13, 14, 30


def _has_gpu() -> bool:
    return any(d.type == "gpu" for d in ggml.list_devices())


@pytest.mark.parametrize("name", ["ggml-cpu", "GGML-CPU", "CPU", "Cpu"])
def test_cpu_backend_names(name):
    c = resolve_device(name)
    assert (c.ggml_name, c.type, c.message) == ("CPU", "cpu", "")
    assert c.requested == (name.lower() if name.lower() == "ggml-cpu" else name)


def test_cpu_is_no_device():
    c = resolve_device("cpu")
    assert c.ggml_name is None and c.message == ""
    with pytest.raises(ValueError, match="CPU only: no device to open"):
        open_device(c)


def test_auto_without_a_gpu_is_cpu_only_with_one_message():
    if _has_gpu():
        pytest.skip("this machine has a discrete GPU")
    for arg in ("auto", None, "AUTO"):
        c = resolve_device(arg)
        assert c.ggml_name is None and c.requested == "auto"
        assert c.message == "device='auto': ggml found no discrete GPU (devices: CPU (cpu))"


@pytest.mark.parametrize(
    "name, what",
    [
        ("cuda", "no cuda device"),
        ("metal", "no metal device"),
        ("vulkan", "no vulkan device"),
        ("hip", "no hip device"),
        ("CUDA0", "no device named 'CUDA0'"),
        ("Vulkan1", "no device named 'Vulkan1'"),
        ("cpu-device", "no device named 'cpu-device'"),
    ],
)  # 0.1.0's alias, removed
def test_missing_device_names_it_the_devices_and_the_folder(name, what):
    have = {d.name for d in ggml.list_devices()}
    if name in have or (name in ("cuda", "metal", "vulkan", "hip") and _has_gpu()):
        pytest.skip(f"{name} exists here")
    with pytest.raises(ValueError) as e:
        resolve_device(name)
    msg = str(e.value)
    assert f"device={name!r}: ggml reports {what}" in msg
    assert "devices found: CPU (cpu)" in msg and f"backends loaded from {ggml.lib_dir()}" in msg


@pytest.mark.parametrize("bad", ["", "  ", 3, ["cuda"]])
def test_bad_device_argument(bad):
    with pytest.raises(ValueError, match="device must be a name"):
        resolve_device(bad)


class _Ctx:  # what DeviceSizer needs of a NativeContext, for checking its arithmetic alone
    n_ctx, n_batch = 64, 4

    def ggml_compute_bytes(self, dev):
        return 12345


def test_cpu_device_counts_as_the_cpu_buffer_rule():
    """ggml's CPU buffer type: tensor bytes = ggml_nbytes (no row padding), alignment 32 —
    the pure-Python default sizer's rule, type by type, shape by shape."""
    with open_device(resolve_device("ggml-cpu")) as dev:
        z = DeviceSizer(dev, _Ctx())
        assert (z.name, z.alignment, z.exact) == ("CPU", P.CPU_ALIGN, True) == ("CPU", P.CPU_BUFT.alignment, True)
        rng = np.random.default_rng(0)
        for t in (F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16):
            block = 256 if t in (Q4_K, Q5_K, Q6_K) else (32 if t not in (F32, F16, BF16) else 1)
            for _ in range(5):
                ne0, ne1 = block * int(rng.integers(1, 20)), int(rng.integers(1, 300))
                assert (
                    z.tensor_bytes(t, ne0, ne1) == P.CPU_BUFT.tensor_bytes(t, ne0, ne1) == P.row_bytes(t, ne0) * ne1
                ), (t, ne0, ne1)
        assert z.compute_bytes(None, 64, 4) == 12345
        with pytest.raises(ValueError, match="measured for the context's n_ctx 64, n_batch 4"):
            z.compute_bytes(None, 128, 4)
