# The C library is compiled by cffi's setuptools integration (see docs/building.md).
# POWERINFER_CUDA=1 also builds the CUDA device, libpi_cuda.so, next to the extension
# (powerinfer_backend/_native/_build_cuda.py); never by default.
import importlib.util
import os
import pathlib

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext


class build_ext_cuda(build_ext):
    def run(self):
        super().run()
        if os.environ.get("POWERINFER_CUDA") != "1":
            return
        here = pathlib.Path(__file__).resolve().parent
        spec = importlib.util.spec_from_file_location("_build_cuda", here / "powerinfer_backend" / "_native" / "_build_cuda.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # by path: importing the package would need the extension built
        out = pathlib.Path(self.get_ext_fullpath("powerinfer_backend._native._pi_native")).parent / mod.LIB_NAME
        print(f"building {out} with {mod.find_nvcc()} for archs {mod.archs_from_env()}")
        mod.build_shared(out, build_dir=self.build_temp if os.path.isdir(self.build_temp) else None)


def _packages() -> list[str]:
    """Every folder with an __init__.py: powerinfer_backend's subpackages, and adapters/
    (repository top level) as powerinfer_backend.adapters, so that it cannot clash with the
    unrelated "adapters" distribution on PyPI."""
    return (find_packages(include=["powerinfer_backend", "powerinfer_backend.*"])
            + ["powerinfer_backend.adapters"]
            + ["powerinfer_backend.adapters." + p for p in find_packages("adapters")])


setup(packages=_packages(),
      package_dir={"powerinfer_backend.adapters": "adapters"},
      cffi_modules=["powerinfer_backend/_native/_build.py:ffibuilder"], cmdclass={"build_ext": build_ext_cuda})
