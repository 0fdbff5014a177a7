"""What a new user's fresh environment gets (issue 25): the README's test command works in a
fresh venv with only what pyproject.toml installs, and CI runs exactly that command."""

from __future__ import annotations

import os
import re
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from tests.fixtures import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_test_extra_brings_the_build_requirements():
    """tests/test_wheel.py builds without build isolation, so [build-system] requires must
    also come with the [test] extra (a fresh venv had setuptools 65.5 and no wheel)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    build = {_name(r) for r in meta["build-system"]["requires"]}
    test = {_name(r) for r in meta["project"]["optional-dependencies"]["test"]}
    assert build - test == set()


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # POWERINFER_TESTING=1: the build has the C test hooks, so the tests that call them run
    commands = re.findall(r"```bash\n(POWERINFER_TESTING=1 pip install -e \"\.\[test\]\"[^\n]*)\n```", readme)
    assert len(commands) == 1, "README.md has one test command block, building the test hooks"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[0] in ci.splitlines()
    assert "-m venv" in ci and "--system-site-packages" not in ci


IMPORT_OPENS = r"""
import sys
opened = []
sys.addaudithook(lambda event, args: event == "open" and opened.append(str(args[0])))
import powerinfer_backend.adapters.llamacpp, powerinfer_backend.adapters.text_generation_webui
print([f for f in opened if f.endswith((".toml", ".cfg"))])
"""


def test_importing_the_package_and_adapters_reads_no_project_file(tmp_path):
    """The adapters are a subpackage like any other: importing them from a checkout
    (PYTHONPATH, no install) opens no pyproject.toml / setup.cfg to find them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", IMPORT_OPENS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"
