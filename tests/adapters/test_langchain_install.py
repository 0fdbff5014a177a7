"""Installing the LangChain adapter: the ``[langchain]`` extra brings every LangChain
package docs/adapters/langchain.md uses (the test suite's, same versions); without it,
importing the adapter is an ImportError that says what to install (not a bare
ModuleNotFoundError from deep inside). The missing package is simulated in a fresh
interpreter (``sys.modules[name] = None`` makes its import fail as an uninstalled
package's does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fixtures import ROOT

PROBE = """
import sys
sys.modules[{name!r}] = None
try:
    import powerinfer_backend.adapters.langchain
except ImportError as e:
    print(type(e).__name__)
    print(e)
"""


@pytest.mark.parametrize("name", ["langchain_community", "langchain_core"])
def test_missing_langchain_names_the_extra(name):
    p = subprocess.run(
        [sys.executable, "-c", PROBE.format(name=name)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    kind, message = p.stdout.split("\n", 1)
    assert kind == "ImportError"  # exactly: not ModuleNotFoundError
    assert "pip install 'powerinfer_backend[langchain]'" in message and name in message, message


def test_langchain_extra_has_what_the_docs_use():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = [d.split(">")[0].split("<")[0] for d in extras["langchain"]]
    assert names == ["langchain-community", "langchain-core", "langchain-openai"]
    assert extras["langchain"] == [d for d in extras["test"] if d.startswith("langchain")]
