# The C library is compiled by cffi's setuptools integration (see docs/building.md).
# GPU devices come from ggml in a GPU build of llama-cpp-python, not from this build.
import pathlib

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class build_py_fresh(build_py):
    """Drop the modules a previous build left in build/lib/powerinfer_backend before
    copying the current ones: setuptools never deletes files there, so modules that a
    checkout no longer has (the flat layout before the layer folders, an extension at its
    old path) would otherwise ship in the wheel and shadow their new homes. The current
    extension (_native/_pi_native*) is kept, so an unchanged build is not recompiled."""

    def run(self):
        old = pathlib.Path(self.build_lib) / "powerinfer_backend"
        keep = old / "_native"
        for f in old.rglob("*") if old.is_dir() else ():
            if f.is_file() and (f.suffix == ".py" or not (f.parent == keep and f.name.startswith("_pi_native"))):
                f.unlink()
        super().run()


# Every folder with an __init__.py under powerinfer_backend/ (the adapters included), so
# a new subpackage cannot be missed.
setup(
    packages=find_packages(include=["powerinfer_backend", "powerinfer_backend.*"]),
    cffi_modules=["powerinfer_backend/_native/_build.py:ffibuilder"],
    cmdclass={"build_py": build_py_fresh},
)
