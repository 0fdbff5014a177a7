"""The ggml version range is stated twice (engine/ggml.py checks it when binding,
pyproject.toml's [tool.powerinfer_backend] ggml documents it for packagers): they agree, and
the ggml llama-cpp-python ships here is inside it."""

from __future__ import annotations

import pytest

from powerinfer_backend.engine import ggml
from tests.fixtures import ROOT


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split("."))


def test_pyproject_range_is_the_binding_range():
    tomllib = pytest.importorskip("tomllib" if __import__("sys").version_info >= (3, 11) else "tomli")
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["powerinfer_backend"]["ggml"]
    assert tuple(p.strip() for p in spec.split(",")) == ggml.GGML_VERSION_RANGE
    lo, hi = (_v(p.lstrip(">=<")) for p in ggml.GGML_VERSION_RANGE)
    assert lo <= _v(ggml.bind()) < hi
