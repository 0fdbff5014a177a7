"""The ggml binding (engine/ggml.py, native/src/device/ggml/api.c, backend.c): llama_cpp's own
ggml libraries, bound once; its devices; per-tensor byte counts from the device's buffer type;
clear errors for a missing folder, a version outside the range and an unknown device."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from powerinfer_backend.engine import ggml
from tests.fixtures import ROOT


def test_bind_twice_returns_the_version():
    v = ggml.bind()
    assert v == ggml.bind()
    assert v.split(".")[:2] == ggml.GGML_VERSION_RANGE[0][2:].split(".")[:2], v


@pytest.mark.fresh_process
def test_only_llama_cpps_libraries_are_mapped_once():
    """In a fresh process: after binding and opening the CPU device, every mapped ggml file is
    one of llama_cpp's lib/*.so.0 sonames, each mapped from one path."""
    code = textwrap.dedent("""
        from powerinfer_backend.engine import ggml
        ggml.bind(); ggml.GgmlDevice("CPU").close()
        paths = {l.split()[-1] for l in open("/proc/self/maps") if "libggml" in l}
        print(ggml.lib_dir()); print("\\n".join(sorted(paths)))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folder, *paths = out.split()
    names = [os.path.basename(p) for p in paths]
    assert sorted(names) == sorted(ggml.GGML_LIBS), paths
    assert all(os.path.dirname(os.path.realpath(p)) == os.path.realpath(folder) for p in paths), paths


def test_list_devices_has_the_cpu():
    devs = ggml.list_devices()
    cpu = [d for d in devs if d.name == "CPU"]
    assert cpu and cpu[0].type == "cpu" and cpu[0].total_bytes > 0 and 0 < cpu[0].free_bytes <= cpu[0].total_bytes
    assert [d.index for d in devs] == list(range(len(devs)))


def _ggml_row_size():
    base = ctypes.CDLL(str(ggml.lib_dir() / "libggml-base.so.0"), mode=os.RTLD_NOLOAD)  # the mapped copy
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return base.ggml_row_size


@pytest.mark.parametrize(
    "qtype,ne0,ne1", [(2, 4096, 11), (2, 64, 1), (12, 256, 3), (12, 2048, 5), (1, 576, 49152), (0, 576, 1), (0, 33, 7)]
)
def test_tensor_bytes_equal_ggml_nbytes_on_the_cpu(qtype, ne0, ne1):
    row = _ggml_row_size()
    with ggml.GgmlDevice("CPU") as d:
        assert d.tensor_bytes(qtype, ne0, ne1) == row(qtype, ne0) * ne1  # the plain CPU buffer type pads nothing
        assert d.alignment >= 16 and d.alignment & (d.alignment - 1) == 0


def test_tensor_bytes_refuses_bad_shapes():
    with ggml.GgmlDevice("CPU") as d:
        with pytest.raises(ValueError, match="Q4_K|q4_K"):
            d.tensor_bytes(12, 100, 1)  # not whole 256-blocks
        with pytest.raises(ValueError, match="type 4 "):
            d.tensor_bytes(4, 64, 1)  # a removed type


def test_wrong_version_range_names_both_versions():
    with pytest.raises(
        RuntimeError, match=r"ggml 0\.\d+\.\d+ in .*lib is outside the supported range \[9\.0\.0, 10\.0\.0\)"
    ):
        ggml.bind(version_range=(">=9.0.0", "<10.0.0"))


def test_missing_lib_folder_names_files_and_folder(tmp_path):
    with pytest.raises(
        RuntimeError, match=f"libggml-base.so.0 not found .*libggml.so.0, libggml-cpu.so.0 in {tmp_path}"
    ):
        ggml.bind(folder=tmp_path)


def test_unknown_device_lists_the_available_ones():
    with pytest.raises(ValueError, match=r'no ggml device named "NoSuchGPU7"; ggml has: .*CPU'):
        ggml.GgmlDevice("NoSuchGPU7")
