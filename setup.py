# The C library is compiled by cffi's setuptools integration (see docs/building.md).
from setuptools import setup

setup(cffi_modules=["powerinfer_backend/_build.py:ffibuilder"])
