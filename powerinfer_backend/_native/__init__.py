"""The bottom layer, ``_native``: the raw binding. Owns the cffi build (``_build``),
loading the extension (``ffi``, ``lib``), C status codes turned into Python exceptions
(:func:`check`), the C header's enums as Python enums (``enums``), the kernel-path
choice (:func:`set_isa`) and the F16 dot
order (:func:`set_f16_order`). Only ``engine`` above it may touch ``lib`` / ``ffi``;
everything else goes through :func:`check` and ``enums``."""

from __future__ import annotations

import os


def _extension():
    """The cffi extension: the one built beside this file, or the file named by
    ``POWERINFER_NATIVE_EXT`` (another build of the same library, e.g. the sanitizer build
    in build/sanitize/, docs/reliability.md), loaded under the same module name."""
    path = os.environ.get("POWERINFER_NATIVE_EXT")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        try:
            from . import _pi_native
        except ImportError:  # e.g. a source checkout first on sys.path, its extension never built
            raise ImportError(
                f"the native library is not built in {here}: in a clone, `pip install -e .` (README) "
                "or `python setup.py build_ext --inplace` builds it beside the sources, which bench/ scripts "
                "and `python -c` from the clone's folder import first"
            ) from None

        return _pi_native
    import importlib.machinery
    import importlib.util
    import sys

    if not os.path.isfile(path):
        raise ImportError(
            f"POWERINFER_NATIVE_EXT={path}: no such file (build it with .ci/sanitize, docs/reliability.md)"
        )
    name = __name__ + "._pi_native"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    sys.modules[name] = module  # enums imports it by name
    loader.exec_module(module)
    return module


_ext = _extension()
ffi, lib = _ext.ffi, _ext.lib

from .enums import IsaBit, Status  # noqa: E402 - after the extension is loaded: enums imports it by name

__all__ = [
    "ffi",
    "lib",
    "check",
    "last_error",
    "set_isa",
    "isa_name",
    "supported_isas",
    "set_f16_order",
    "f16_order_name",
]


def last_error() -> str:
    """The native library's message for the last failure on this thread."""
    return ffi.string(lib.pi_last_error()).decode("utf-8", "replace")


def check(rc: int, what: str) -> None:
    """Raise for a non-zero status from the C API.

    Raises:
        ValueError: bad argument or context full (PI_ERR_INVALID, PI_ERR_CONTEXT_FULL).
        MemoryError: allocation failed (PI_ERR_NOMEM).
        NotImplementedError: unsupported type or instruction set (PI_ERR_UNSUPPORTED).
    """
    if rc == Status.OK:
        return
    msg = f"{what}: {last_error()}"
    if rc == Status.ERR_NOMEM:
        raise MemoryError(msg)
    if rc == Status.ERR_UNSUPPORTED:
        raise NotImplementedError(msg)
    raise ValueError(msg)


def supported_isas() -> list[str]:
    """Instruction-set paths this CPU can run, e.g. ``["scalar", "avx2", "avx512", "avx512vnni"]``."""
    mask = lib.pi_isa_supported()
    return [bit.name.lower() for bit in IsaBit if mask & bit]


def set_isa(name: str) -> None:
    """Force the kernel path: ``"auto"`` (the widest; also an empty name), ``"scalar"``,
    ``"avx2"``, ``"avx512"`` or ``"avx512vnni"`` (the AVX-512 kernels with vpdpbusd /
    vpdpwssd: the same results, faster). Case and surrounding spaces are ignored.

    Raises:
        TypeError: ``name`` is not a str. ValueError: unknown name. NotImplementedError: the
        CPU lacks that ISA.
    """
    _check_name("set_isa", name)
    check(lib.pi_isa_set(name.strip().lower().encode()), f"POWERINFER_ISA / set_isa({name!r})")


def _check_name(what: str, name) -> None:
    """A kernel path or order name reaches C as a NUL-terminated string: only a str without NUL."""
    if not isinstance(name, str):
        raise TypeError(f"{what}: the name must be a str, got {type(name).__name__}")
    if "\0" in name:
        raise ValueError(f"{what}: the name {name!r} contains a NUL character")


def isa_name() -> str:
    """The kernel path in use."""
    return ffi.string(lib.pi_isa_name()).decode()


def set_f16_order(name: str) -> None:
    """Force the F16 dot order on every path: ``"auto"`` (llama.cpp's on this CPU:
    ``"avx512"`` where it has AVX512F, else ``"avx2"``), ``"avx2"`` or ``"avx512"``.

    Raises:
        TypeError: ``name`` is not a str. ValueError: unknown name.
    """
    _check_name("set_f16_order", name)
    check(lib.pi_f16_order_set(name.strip().lower().encode()), f"POWERINFER_F16_ORDER / set_f16_order({name!r})")


def f16_order_name() -> str:
    """The F16 dot order in use: ``"avx2"`` or ``"avx512"``."""
    return ffi.string(lib.pi_f16_order_name()).decode()


# POWERINFER_ISA / POWERINFER_F16_ORDER choose at import; a bad value is an error, not a
# silent fallback.
set_isa(os.environ.get("POWERINFER_ISA", "auto") or "auto")
set_f16_order(os.environ.get("POWERINFER_F16_ORDER", "auto") or "auto")
