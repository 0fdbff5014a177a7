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


#: how the project's own process shows through (who ran what, in which session, on which
#: machine's paths): a user can neither see nor rerun it
PROCESS = re.compile(
    r"\bthe lead\b|\blead's\b|\bhelpers? (ran|on)\b|\bthis session\b|\bsessions'|fresh-eyes|"
    r"\bworkplace\b|\.\./shared|shared/README|/work/|\bissues? \d+\b|\bthe brief\b",
    re.I,
)


def test_docs_speak_to_users():
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:80]}"
        for path in DOCS
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in [PROCESS.search(line)]
        if m
    ]
    assert bad == []
