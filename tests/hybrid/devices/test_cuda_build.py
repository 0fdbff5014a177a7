"""The CUDA device without a GPU: native/cuda/ compiles (nvcc -c for sm_80 and sm_90,
warnings as errors) and links into libpi_cuda.so with the static runtime, whose symbols
match the cffi declarations; importing the package and the CPU paths never need CUDA;
asking for the "cuda" device says clearly what is missing. Compile steps are skipped
where nvcc is absent. What runs on a GPU is in tests/hybrid/devices/test_cuda.py."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import time

import pytest

from powerinfer_backend._native import _build_cuda

from powerinfer_backend.hybrid.devices import cuda as cuda_device
from powerinfer_backend._native._build import _cdef_text
from powerinfer_backend.hybrid.devices import open_device

from tests.fixtures import ROOT

NVCC = _build_cuda.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_cdef_matches_header():
    header = open(os.path.join(ROOT, "native", "cuda", "pi_cuda.h")).read()
    assert _norm(_cdef_text(header)) == _norm(cuda_device.CDEF)


def test_import_and_cpu_paths_need_no_cuda():
    # a fresh interpreter with the CUDA library pointed nowhere: the package, the device
    # module and a cpu-device work, and the CUDA module is never imported
    code = ("import sys, powerinfer_backend\n"
            "from powerinfer_backend.hybrid.devices import open_device\n"
            "with open_device('cpu-device', 4096) as d: assert d.stats()['reserved'] == 4096\n"
            "assert 'powerinfer_backend.hybrid.devices.cuda' not in sys.modules\n")
    env = dict(os.environ, POWERINFER_CUDA_LIB="/nonexistent/libpi_cuda.so", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.fixture
def fresh_loader(monkeypatch):
    """cuda_device with nothing loaded yet (restored afterwards)."""
    monkeypatch.setattr(cuda_device, "_loaded", None)
    return monkeypatch


def test_not_built_says_how_to_build(fresh_loader, tmp_path):
    fresh_loader.setenv("POWERINFER_CUDA_LIB", str(tmp_path / "libpi_cuda.so"))
    with pytest.raises(RuntimeError, match=r"not built: .*POWERINFER_CUDA=1 python3 setup.py build_ext --inplace"):
        cuda_device.CudaDevice(1 << 20)
    with pytest.raises(RuntimeError, match="not built"):
        open_device("cuda", 1 << 20)
    with pytest.raises(RuntimeError, match="not built"):
        cuda_device.cuda_ffn_bytes(8, 1, 64, 10)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        open_device("tpu", 0)


def test_no_driver_names_libcuda(fresh_loader, tmp_path):
    lib = tmp_path / "libpi_cuda.so"
    lib.write_bytes(b"")  # present; the driver check comes before loading it
    fresh_loader.setenv("POWERINFER_CUDA_LIB", str(lib))
    fresh_loader.setattr(cuda_device, "_driver_present", lambda: False)
    with pytest.raises(RuntimeError, match=r"no CUDA driver: libcuda\.so\.1 not found"):
        open_device("cuda", 1 << 20)


@needs_nvcc
def test_compile_and_link(tmp_path, fresh_loader):
    """The CI compile check: the build's own commands, two architectures, -Werror."""
    t0 = time.perf_counter()
    objs = _build_cuda.compile_objects(tmp_path, ["80", "90"], werror=True, jobs=2)
    t_compile = time.perf_counter() - t0
    assert [o.name for o in objs] == [s.stem + ".o" for s in _build_cuda.sources()]
    assert t_compile < 60, f"nvcc took {t_compile:.1f} s"
    mode = _build_cuda.cudart_mode(NVCC)
    if mode is None:
        pytest.skip("no CUDA runtime library in the toolkit: link step skipped")
    so = _build_cuda.link(objs, tmp_path / "libpi_cuda.so")
    if mode == "shared":
        return  # linked against libcudart.so, which need not be on the loader path here
    # the static runtime: loading needs no libcudart.so and no driver
    handle = ctypes.CDLL(str(so))
    for name in re.findall(r"\b(pi_cuda_\w+)\s*\(", cuda_device.CDEF):
        assert hasattr(handle, name), name
    # only the API is exported (hidden visibility for everything else of ours)
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True)
    if nm.returncode == 0:
        ours = {ln.split()[-1] for ln in nm.stdout.splitlines() if " T " in ln and "pi_" in ln}
        assert ours == set(re.findall(r"\b(pi_cuda_\w+)\s*\(", cuda_device.CDEF))
    fresh_loader.setenv("POWERINFER_CUDA_LIB", str(so))
    if cuda_device._driver_present():
        return  # a real driver: tests/hybrid/devices/test_cuda.py exercises the library
    # the library itself reports the missing driver from its first call
    fresh_loader.setattr(cuda_device, "_driver_present", lambda: True)
    with pytest.raises(RuntimeError, match="no usable CUDA device: pi_cuda_device_count: cudaGetDeviceCount"):
        cuda_device.CudaDevice(1 << 20)


@needs_nvcc
def test_archs_and_flags():
    assert _build_cuda.parse_archs("8.0; sm_90,") == ["80", "90"]
    assert _build_cuda.parse_archs("") == list(_build_cuda.DEFAULT_ARCHS)
    assert _build_cuda.gencode_flags(["80", "90a"])[-1] == "arch=compute_90a,code=compute_90a"
    assert _build_cuda.gencode_flags(["native"]) == ["-arch=native"]
    with pytest.raises(_build_cuda.CudaBuildError, match="bad CUDA arch"):
        _build_cuda.gencode_flags(["ampere"])
