"""nvcc build of the CUDA device, ``libpi_cuda.so`` (native/cuda/; docs/building.md).

Opt-in: ``setup.py`` calls :func:`build_shared` only when ``POWERINFER_CUDA=1``; the
default build never looks for nvcc. The CI compile check (tests/hybrid/devices/test_cuda_build.py) runs
the same :func:`compile_objects` / :func:`link` commands, so what CI checks is what an
install builds.

This file is imported by path from ``setup.py`` (before the package's extension exists),
so it must not import the package. Run it directly to build by hand::

    python3 powerinfer_backend/_build_cuda.py [--out powerinfer_backend/libpi_cuda.so] [--archs 80;90]

Environment: ``NVCC`` (the compiler; else ``nvcc`` on PATH, else /usr/local/cuda/bin/nvcc),
``POWERINFER_CUDA_ARCHS`` (``;``- or ``,``-separated compute capabilities, e.g. ``80;90``,
or ``native`` for the GPUs of the build machine; default :data:`DEFAULT_ARCHS`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "native" / "cuda"
LIB_NAME = "libpi_cuda.so"
#: A100 (sm_80) and H100/H200 (sm_90), plus compute_90 PTX so newer GPUs JIT it
DEFAULT_ARCHS = ("80", "90")
NVCC_FLAGS = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall", "-I", str(CUDA_DIR)]


class CudaBuildError(RuntimeError):
    """nvcc missing or failing; the message holds the command and its output."""


def find_nvcc() -> str | None:
    """Path of nvcc (``NVCC``, PATH, /usr/local/cuda/bin), or None."""
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def sources() -> list[pathlib.Path]:
    """The .cu files of native/cuda/, sorted."""
    return sorted(CUDA_DIR.glob("*.cu"))


def parse_archs(raw: str | None) -> list[str]:
    """``"80;90"`` split on ``;``/``,`` (``"8.0"`` and ``"sm_80"`` read as ``"80"``); empty or
    None gives :data:`DEFAULT_ARCHS`."""
    raw = (raw or "").replace(",", ";")
    out = [a.strip().lower().removeprefix("sm_").replace(".", "") for a in raw.split(";") if a.strip()]
    return out or list(DEFAULT_ARCHS)


def archs_from_env() -> list[str]:
    """:func:`parse_archs` of ``POWERINFER_CUDA_ARCHS``."""
    return parse_archs(os.environ.get("POWERINFER_CUDA_ARCHS"))


def gencode_flags(archs: list[str]) -> list[str]:
    """SASS for each arch and PTX for the highest (``native``: the build machine's GPUs).

    Raises:
        CudaBuildError: an arch that is not ``native`` or a number like ``90``/``90a``.
    """
    if archs == ["native"]:
        return ["-arch=native"]
    flags = []
    for a in archs:
        if not (a[:-1] if a.endswith("a") else a).isdigit():
            raise CudaBuildError(f"bad CUDA arch {a!r} (POWERINFER_CUDA_ARCHS: e.g. 80;90, or native)")
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    top = max(archs, key=lambda a: int(a.rstrip("a")))
    flags += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    return flags


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise CudaBuildError(f"{' '.join(cmd)}\n{p.stdout}")


def compile_objects(out_dir: str | os.PathLike, archs: list[str] | None = None, *, nvcc: str | None = None,
                    jobs: int = 2, werror: bool = False) -> list[pathlib.Path]:
    """``nvcc -c`` every source into ``out_dir`` (``jobs`` at a time); returns the objects.
    ``werror``: warnings (nvcc's and the host compiler's) are errors (the CI check).

    Raises:
        CudaBuildError: no nvcc, or a compile error (with nvcc's output).
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CudaBuildError("nvcc not found (set NVCC or put the CUDA toolkit's bin/ on PATH)")
    gen = gencode_flags(list(archs or archs_from_env()))
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    objs = [out_dir / (s.stem + ".o") for s in sources()]
    strict = ["-Werror", "all-warnings", "-Xcompiler", "-Werror"] if werror else []
    cmds = [[nvcc, "-c", *NVCC_FLAGS, *strict, *gen, "-o", str(o), str(s)] for s, o in zip(sources(), objs)]
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for f in [ex.submit(_run, c) for c in cmds]:
            f.result()
    return objs


def _lib_dirs(nvcc: str) -> list[pathlib.Path]:
    """The library folders nvcc links from (from ``nvcc --dryrun``: nvcc may be a wrapper
    script outside its toolkit), then the usual folders beside it."""
    import re
    import shlex

    p = subprocess.run([nvcc, "--dryrun", "-shared", "-cudart", "static", "-o", os.devnull, "probe.o"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dirs = [pathlib.Path(m.group(1)) for line in p.stdout.splitlines() if "LIBRARIES=" in line
            for m in map(lambda a: re.match(r"-L(.+)", a), shlex.split(line.split("LIBRARIES=", 1)[1])) if m]
    root = pathlib.Path(os.path.realpath(nvcc)).parent.parent
    return dirs + [root / d for d in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")]


def cudart_static(nvcc: str) -> pathlib.Path | None:
    """libcudart_static.a of nvcc's toolkit, or None."""
    return next((d / "libcudart_static.a" for d in _lib_dirs(nvcc) if (d / "libcudart_static.a").is_file()), None)


def cudart_mode(nvcc: str) -> str | None:
    """How :func:`link` links the CUDA runtime: "static" (preferred: the library then needs
    only the driver), "shared" (libcudart.so only: it must be on the loader path at run
    time), or None (neither: no link possible)."""
    if cudart_static(nvcc) is not None:
        return "static"
    if any((d / "libcudart.so").exists() for d in _lib_dirs(nvcc)):
        return "shared"
    return None


def link(objs: list[pathlib.Path], out: str | os.PathLike, *, nvcc: str | None = None) -> pathlib.Path:
    """Link the objects into a shared object. The CUDA runtime is linked statically where
    the toolkit has it, so the .so needs only the driver (libcuda.so.1, which the runtime
    dlopens at first use): it loads on machines without a driver and reports "no driver"
    from its first call. Else it links libcudart.so (see :func:`cudart_mode`).

    Raises:
        CudaBuildError: no nvcc, no CUDA runtime library in its toolkit, or a link error.
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CudaBuildError("nvcc not found (set NVCC or put the CUDA toolkit's bin/ on PATH)")
    mode = cudart_mode(nvcc)
    if mode is None:
        raise CudaBuildError(f"neither libcudart_static.a nor libcudart.so found in the toolkit of {nvcc}")
    out = pathlib.Path(out)
    tmp = out.with_name(out.name + ".tmp")
    _run([nvcc, "-shared", "-cudart", mode, "-o", str(tmp), *map(str, objs)])
    os.replace(tmp, out)  # a failed link never leaves a half-written library behind
    return out


def build_shared(out: str | os.PathLike, archs: list[str] | None = None, *, build_dir: str | os.PathLike | None = None,
                 jobs: int | None = None) -> pathlib.Path:
    """Compile and link ``libpi_cuda.so`` at ``out``.

    Raises:
        CudaBuildError: see :func:`compile_objects` and :func:`link`.
    """
    import tempfile

    jobs = jobs or max(1, min(len(sources()), os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        return link(compile_objects(tmp, archs, jobs=jobs), out)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "powerinfer_backend" / "_native" / LIB_NAME))
    ap.add_argument("--archs", default=None, help="e.g. 80;90 or native (default: POWERINFER_CUDA_ARCHS or 80;90)")
    a = ap.parse_args()
    print(build_shared(a.out, parse_archs(a.archs) if a.archs else None))
