"""The wheel ships what the source tree has: every package folder of powerinfer_backend/
and of the top-level adapters/ (as powerinfer_backend.adapters), the compiled cffi
extension at powerinfer_backend/_native/, and no top-level ``adapters`` package.

Builds the wheel for real (``pip wheel . --no-deps --no-build-isolation``, so setuptools,
wheel and cffi must be installed); the C library compiles, which takes a while."""

from __future__ import annotations

import importlib.util
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
def wheel_names(tmp_path_factory) -> list[str]:
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed")
    out = tmp_path_factory.mktemp("wheel")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                        "-w", str(out)], cwd=ROOT, capture_output=True, text=True)
    print(f"pip wheel took {time.monotonic() - start:.1f} s")
    assert r.returncode == 0, f"pip wheel failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
    wheels = sorted(out.glob(f"{P}-*.whl"))
    assert len(wheels) == 1, f"expected one {P} wheel, got {[w.name for w in wheels]}"
    with zipfile.ZipFile(wheels[0]) as z:
        return z.namelist()


def test_wheel_has_every_source_package(wheel_names):
    expected = _package_files(ROOT / P, P) | _package_files(ROOT / "adapters", f"{P}/adapters")
    missing = sorted(expected - set(wheel_names))
    assert not missing, "source modules missing from the wheel:\n" + "\n".join(missing)


def test_wheel_has_no_module_the_source_lacks(wheel_names):
    # bdist_wheel packs all of build/lib, so a module deleted or moved since an earlier
    # build in this checkout would ship too; `rm -rf build` clears it
    expected = _package_files(ROOT / P, P) | _package_files(ROOT / "adapters", f"{P}/adapters")
    stale = sorted(n for n in wheel_names if n.endswith(".py") and n not in expected)
    assert not stale, "modules in the wheel but not in the source tree (stale build/?):\n" + "\n".join(stale)


def test_wheel_has_the_extension_in_native(wheel_names):
    found = [n for n in wheel_names if EXTENSION.fullmatch(n)]
    elsewhere = [n for n in wheel_names if "_pi_native" in n and n not in found]
    assert len(found) == 1, (f"expected one {EXTENSION.pattern} in the wheel, found {found}; "
                             f"_pi_native elsewhere: {elsewhere}")
    assert not elsewhere, f"a second copy of the extension: {elsewhere}"


def test_wheel_has_no_top_level_adapters(wheel_names):
    top = sorted({n.split("/")[0] for n in wheel_names if not n.split("/")[0].endswith((".dist-info", ".data"))})
    assert top == [P], f"top-level entries other than {P}/: {top}"
