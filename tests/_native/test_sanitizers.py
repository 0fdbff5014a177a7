"""The sanitizer job can fail (docs/reliability.md "Sanitizers"): with the sanitizer build
loaded (.ci/sanitize: POWERINFER_NATIVE_EXT, libasan preloaded), the planted bugs of
native/sanitize/planted.c — an out-of-bounds heap write, a signed overflow — each called in
a child process, end it with AddressSanitizer's / UBSan's report. The normal build has no
such functions: skipped outside the sanitizer job."""

from __future__ import annotations

import subprocess
import sys

import pytest

from powerinfer_backend._native import lib
from tests.fixtures import ROOT

pytestmark = pytest.mark.skipif(
    not hasattr(lib, "pi_test_oob_write"), reason="needs the sanitizer build (.ci/sanitize)"
)


@pytest.mark.parametrize(
    "call, report",
    [
        ("pi_test_oob_write(0)", "ERROR: AddressSanitizer: heap-buffer-overflow"),
        ("pi_test_signed_overflow(1)", "runtime error: signed integer overflow"),
    ],
)
def test_planted_bug_fails_the_process(call, report):
    code = f"from powerinfer_backend._native import lib; lib.{call}; print('survived')"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode != 0 and "survived" not in p.stdout, (p.returncode, p.stdout, p.stderr[-2000:])
    assert report in p.stderr, p.stderr[-2000:]
    assert "planted.c" in p.stderr  # the report points at the planted line


def test_clean_call_survives():
    """The same entry points without the bug (a write inside the block; no overflow) pass:
    the failures above are the sanitizer's, not the child's."""
    code = "from powerinfer_backend._native import lib; lib.pi_test_oob_write(-1); lib.pi_test_signed_overflow(0)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
