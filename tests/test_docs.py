"""The documentation's install lines work from a clone (issue 17): the project is not on
PyPI under its name yet, so `pip install 'powerinfer_backend[...]'` alone fails there."""

from __future__ import annotations

import re

from tests.fixtures import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_install_lines_work_from_a_clone():
    bad = []
    for path in DOCS:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            # an extra of this project by name: only beside the clone's form and marked as PyPI's
            if re.search(r"pip install[^`]*powerinfer_backend\[", line) and "PyPI" not in line:
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            if re.search(r"pip install[^`]*\s\.\[", line) and "-e" not in line and "'" not in line:
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()} (quote the extra: '.[x]')")
    assert bad == []
