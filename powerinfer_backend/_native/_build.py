"""cffi build script: compiles native/ into the extension ``powerinfer_backend._native._pi_native``.

The cdef is read from ``native/include/powerinfer.h`` (the whole C API) with the
preprocessor lines dropped, so the header stays the single source of truth.
Per-ISA kernels select their instruction set with ``#pragma GCC target`` inside
their own files, so the library is portable and picks a path at run time.
Set ``POWERINFER_NATIVE=1`` to also compile everything with ``-march=native``;
``POWERINFER_TESTING=1`` adds the test hooks of ``native/testing/`` (entry points only tests
call: stall a pool worker, zero a placed device tensor, trace the device; README's test command
builds so). ``POWERINFER_SANITIZE=address,undefined`` (any ``-fsanitize=`` list) builds the
sanitizer variant, with the test hooks and the planted bugs of ``native/sanitize/``
(docs/reliability.md). A normal build has neither: ``powerinfer.h`` is the whole public API.
"""

import os
import pathlib
import re

from cffi import FFI

ROOT = pathlib.Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
HEADER = NATIVE / "include" / "powerinfer.h"


def _cdef_text(header: str) -> str:
    lines = []
    for line in header.splitlines():
        s = line.strip()
        if s.startswith("#") or s.startswith('extern "C"') or s == "}":
            continue
        lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return text


if not HEADER.is_file():  # imported from an install (the wheel ships this script): nothing to build
    raise ImportError(f"{__name__} is the build script of a source checkout; {HEADER} is not here")

ffibuilder = FFI()
ffibuilder.cdef(_cdef_text(HEADER.read_text()))

_sources = sorted(str(p.relative_to(ROOT)) for p in (NATIVE / "src").rglob("*.c"))
_headers = sorted(str(p.relative_to(ROOT)) for p in NATIVE.rglob("*.h"))  # rebuild when a header changes
_cflags = ["-std=c11", "-O3", "-fno-math-errno", "-pthread", "-Wall", "-Wno-unused-function"]
_ldflags = ["-pthread", "-lm", "-ldl"]
_preamble = '#include "powerinfer.h"'
_include = [str(NATIVE / "include"), str(NATIVE / "src")]
if os.environ.get("POWERINFER_NATIVE") == "1":
    _cflags.append("-march=native")
_SANITIZE = os.environ.get("POWERINFER_SANITIZE", "").strip()
if _SANITIZE:  # e.g. "address,undefined": the sanitizer build (docs/reliability.md, .ci/sanitize)
    _san = [f"-fsanitize={_SANITIZE}", "-fno-omit-frame-pointer"]
    if "undefined" in _SANITIZE.split(","):
        # a UBSan report aborts, as ASan's do; and signed overflow is checked although
        # CPython's CFLAGS (which distutils puts first) say -fwrapv: the C code must not rely on it
        _san += ["-fno-sanitize-recover=undefined", "-fno-wrapv"]
    _cflags = [f for f in _cflags if f != "-O3"] + ["-O1", "-g"] + _san
    _ldflags += _san


def _add_test_only(folder: pathlib.Path, header: str) -> None:
    """Compile ``folder``'s C files too and bind the functions its ``header`` declares."""
    global _preamble
    _sources.extend(sorted(str(p.relative_to(ROOT)) for p in folder.glob("*.c")))
    ffibuilder.cdef(_cdef_text((folder / header).read_text()))
    _preamble += f'\n#include "{header}"'
    _include.append(str(folder))


if os.environ.get("POWERINFER_TESTING") == "1" or _SANITIZE:  # the test hooks (engine/testing.py)
    _add_test_only(NATIVE / "testing", "testing.h")
if _SANITIZE:  # the planted bugs (tests/_native/test_sanitizers.py)
    _add_test_only(NATIVE / "sanitize", "planted.h")

ffibuilder.set_source(
    "powerinfer_backend._native._pi_native",
    _preamble,
    sources=_sources,
    include_dirs=_include,
    extra_compile_args=_cflags,
    extra_link_args=_ldflags,
    depends=_headers,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
