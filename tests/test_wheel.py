"""The wheel ships what the source tree has: every package folder of powerinfer_backend/
(the adapters included), the compiled cffi extension at powerinfer_backend/_native/
(without the test hooks of native/testing/), and no other top-level package (an
``adapters`` one would clash with the unrelated distribution of that name on PyPI).

Builds the wheel for real (``pip wheel . --no-deps --no-build-isolation``, so setuptools,
wheel and cffi must be installed); the C library compiles, which takes a while."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.fixtures import ROOT

P = "powerinfer_backend"
EXTENSION = re.compile(rf"{P}/_native/_pi_native[^/]*\.so")


def _package_files(folder: Path, prefix: str) -> set[str]:
    """Wheel paths (``prefix/...``) of every .py in every package folder (one with an
    __init__.py) under ``folder``, found by walking the source tree."""
    out = set()
    for init in folder.rglob("__init__.py"):
        if "__pycache__" in init.parts:
            continue
        for f in init.parent.glob("*.py"):
            out.add("/".join([prefix, *f.relative_to(folder).parts]))
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel a user's ``pip install .`` builds (no build flags set)."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed")
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("POWERINFER_TESTING", "POWERINFER_SANITIZE")}
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    print(f"pip wheel took {time.monotonic() - start:.1f} s")
    assert r.returncode == 0, f"pip wheel failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
    wheels = sorted(out.glob(f"{P}-*.whl"))
    assert len(wheels) == 1, f"expected one {P} wheel, got {[w.name for w in wheels]}"
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_wheel_has_every_source_package(wheel_names):
    expected = _package_files(ROOT / P, P)
    missing = sorted(expected - set(wheel_names))
    assert not missing, "source modules missing from the wheel:\n" + "\n".join(missing)


def test_wheel_has_no_module_the_source_lacks(wheel_names):
    # bdist_wheel packs all of build/lib, so a module deleted or moved since an earlier
    # build in this checkout would ship too; `rm -rf build` clears it
    expected = _package_files(ROOT / P, P)
    stale = sorted(n for n in wheel_names if n.endswith(".py") and n not in expected)
    assert not stale, "modules in the wheel but not in the source tree (stale build/?):\n" + "\n".join(stale)


def test_wheel_has_the_extension_in_native(wheel_names):
    found = [n for n in wheel_names if EXTENSION.fullmatch(n)]
    elsewhere = [n for n in wheel_names if "_pi_native" in n and n not in found]
    assert len(found) == 1, (
        f"expected one {EXTENSION.pattern} in the wheel, found {found}; _pi_native elsewhere: {elsewhere}"
    )
    assert not elsewhere, f"a second copy of the extension: {elsewhere}"


def test_wheel_has_no_top_level_adapters(wheel_names):
    top = sorted({n.split("/")[0] for n in wheel_names if not n.split("/")[0].endswith((".dist-info", ".data"))})
    assert top == [P], f"top-level entries other than {P}/: {top}"


def test_wheel_extension_has_the_api_and_no_test_hooks(wheel, wheel_names, tmp_path):
    """The C test hooks (native/testing/, POWERINFER_TESTING=1) stay out of a normal build."""
    with zipfile.ZipFile(wheel) as z:
        ext = z.extract(next(n for n in wheel_names if EXTENSION.fullmatch(n)), tmp_path)
    code = (
        "import json; from powerinfer_backend._native import lib; "
        "print(json.dumps([n for n in dir(lib) if n.startswith('pi_')]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "POWERINFER_NATIVE_EXT": ext, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    names = json.loads(r.stdout)
    assert "pi_model_create" in names and "pi_eval" in names
    assert [n for n in names if n.startswith("pi_test_")] == []
