"""cffi build script: compiles native/ into the extension ``powerinfer_backend._native._pi_native``.

The cdef is read from ``native/include/powerinfer.h`` (the whole C API) with the
preprocessor lines dropped, so the header stays the single source of truth.
Per-ISA kernels select their instruction set with ``#pragma GCC target`` inside
their own files, so the library is portable and picks a path at run time.
Set ``POWERINFER_NATIVE=1`` to also compile everything with ``-march=native``.
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
if os.environ.get("POWERINFER_NATIVE") == "1":
    _cflags.append("-march=native")

ffibuilder.set_source(
    "powerinfer_backend._native._pi_native",
    '#include "powerinfer.h"',
    sources=_sources,
    include_dirs=[str(NATIVE / "include"), str(NATIVE / "src")],
    extra_compile_args=_cflags,
    extra_link_args=["-pthread", "-lm", "-ldl"],
    depends=_headers,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
