"""The C library's layout (native/src), checked on its sources: no two C files call each
other's functions in a cycle (the forward pass reaches a device only through its function
table), per-ISA intrinsics live only under isa/, and no source file passes 600 lines."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures import ROOT
from tests.layering import sccs

SRC = ROOT / "native" / "src"
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
# a function definition starts at column 0 and its parameter list is followed by "{"
_DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(([^;{}]*)\)\s*\{", re.M)
_CALL = re.compile(r"\b(\w+)\s*\(")


def _code(path: Path) -> str:
    return _STRING.sub('""', _COMMENT.sub(" ", path.read_text()))


def call_graph(src: Path) -> dict[str, dict[str, str]]:
    """{file: {file it calls a function of: that function}} over the .c files under src."""
    files = sorted(src.rglob("*.c"))
    code = {f: _code(f) for f in files}
    owner = {m.group(1): f for f in files for m in _DEFINITION.finditer(code[f])}
    graph: dict[str, dict[str, str]] = {}
    for f in files:
        name = str(f.relative_to(src))
        graph[name] = {}
        for call in _CALL.findall(code[f]):
            g = owner.get(call)
            if g is not None and g != f:
                graph[name].setdefault(str(g.relative_to(src)), call)
    return graph


def test_call_graph_sees_real_calls():
    """The extractor finds calls it must find (else the cycle test would prove nothing)."""
    graph = call_graph(SRC)
    assert any(target.startswith("blocks/") for target in graph["forward.c"]), graph["forward.c"]
    assert any(target.startswith("ops/") for target in graph["blocks/ffn.c"]), graph["blocks/ffn.c"]


def test_no_call_cycle_between_c_files():
    graph = call_graph(SRC)
    cycles = [c for c in sccs(graph) if len(c) > 1]
    assert not cycles, "C files calling each other in a cycle: " + "; ".join(
        " -> ".join(c) + f" ({', '.join(graph[a][b] for a in c for b in c if b in graph[a])})" for c in cycles
    )


def test_forward_pass_reaches_devices_only_through_their_table():
    """forward.c calls no function defined under device/ and includes only device/device.h
    from there (pi_device_i, the table type): a device implementation stays swappable."""
    direct = {f: fn for f, fn in call_graph(SRC)["forward.c"].items() if f.startswith("device/")}
    assert not direct, f"forward.c calls device code directly: {direct}"
    includes = re.findall(r'#include\s+"(device/[^"]+)"', (SRC / "forward.c").read_text())
    assert includes == ["device/device.h"], includes


def test_intrinsics_only_under_isa():
    isa = re.compile(r"\b_mm\d*_\w+\s*\(|#pragma GCC target|<immintrin\.h>")
    offenders = [
        str(f.relative_to(SRC))
        for f in SRC.rglob("*.[ch]")
        if "isa" not in f.relative_to(SRC).parts and isa.search(_COMMENT.sub(" ", f.read_text()))
    ]
    assert not offenders, f"per-ISA code outside native/src/isa/: {offenders}"


def test_no_native_source_over_600_lines():
    long = {
        str(f.relative_to(ROOT)): n
        for f in (ROOT / "native").rglob("*.[ch]*")
        if (n := len(f.read_text().splitlines())) > 600
    }
    assert not long, long


def test_planted_call_cycle_is_reported(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "model.c").write_text("int pi_run(int x) {\n    return pi_placed_step(x) + 1; /* calls dev */\n}\n")
    (tmp_path / "dev" / "placed.c").write_text(
        "static int helper(int x) { return x; }\n"
        "int pi_placed_step(int x) {\n"
        "    return helper(x) ? pi_run(x - 1) : 0;\n}\n"
    )
    (tmp_path / "ops.c").write_text("int pi_op(void) {\n    return 0;\n}\n")
    graph = call_graph(tmp_path)
    assert graph == {"dev/placed.c": {"model.c": "pi_run"}, "model.c": {"dev/placed.c": "pi_placed_step"}, "ops.c": {}}
    assert [sorted(c) for c in sccs(graph) if len(c) > 1] == [["dev/placed.c", "model.c"]]
