"""The C library's test hooks (native/testing/testing.h): stall a pool worker, count its
chunks, zero a placed device tensor, trace the device. Only tests call them, and only a build
made with ``POWERINFER_TESTING=1`` has them (README's test command builds so; a normal install
does not): without them every function here raises :class:`RuntimeError` saying so."""

from __future__ import annotations

from .._native import check, ffi, lib

__all__ = [
    "AVAILABLE",
    "MISSING",
    "TRACE_KINDS",
    "require",
    "stall",
    "chunk_counts",
    "zero_rows",
    "trace",
    "trace_read",
]

#: whether the loaded extension was built with the test hooks
AVAILABLE = hasattr(lib, "pi_test_pool_stall")
#: what to do without them
MISSING = (
    "the C library was built without its test hooks: rebuild it with POWERINFER_TESTING=1 set "
    '(README\'s test command: POWERINFER_TESTING=1 pip install -e ".[test]"; in place: '
    "POWERINFER_TESTING=1 python setup.py build_ext --inplace)"
)
#: a trace event's kind: the device's attention / hot FFN / output steps, and the CPU half of a split FFN
TRACE_KINDS = ("attn", "ffn", "output", "cold")


def require() -> None:
    """Raises:
    RuntimeError: the extension has no test hooks (it was built without ``POWERINFER_TESTING=1``)."""
    if not AVAILABLE:
        raise RuntimeError(MISSING)


def stall(ctx, worker: int, ms: int) -> None:
    """Thread ``worker`` of a :class:`~powerinfer_backend.engine.native.NativeContext`'s pool (0 =
    the calling thread) sleeps ``ms`` milliseconds inside the next chunk of work it takes (once).

    Raises:
        ValueError: worker outside [0, n_threads) or ms outside [0, 10000].
    """
    require()
    check(lib.pi_test_pool_stall(ctx._ptr, int(worker), int(ms)), "pi_test_pool_stall")


def chunk_counts(ctx) -> tuple[list[int], list[int] | None]:
    """Per thread of a context's pool, the chunks it has run since the context was made, and
    those it ran in the job the last :func:`stall` fired in (None while none has fired)."""
    require()
    n = ctx.n_threads
    total, stalled = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    lib.pi_test_pool_counts(ctx._ptr, total, stalled, n)
    return list(total), (None if stalled[0] < 0 else list(stalled))


def zero_rows(ctx, layer: int, slot: str, row0: int = 0, n_rows: int | None = None) -> None:
    """Zero rows [row0, row0 + n_rows) of a placed device tensor of ``layer`` of a context on a
    ggml device: an attention slot by name (``"attn_q"``, ...; all rows when n_rows is None), or
    ``"ffn_gate"`` / ``"ffn_up"`` (the hot rows in plan order), ``"ffn_down"`` (the down rows:
    Q8_0 or F16, ``placement.down_cols``).

    Raises:
        ValueError: not placed on a ggml device, slot not on the device, rows out of range.
    """
    from ..loader.arch import LAYER_SLOTS

    require()
    s = LAYER_SLOTS.index(slot)
    if n_rows is None:
        n_rows = ctx.model.gguf.layer_tensor(layer, slot).ne[1] - row0
    check(lib.pi_test_ggml_zero_rows(ctx._ptr, int(layer), s, int(row0), int(n_rows)), f"blk.{layer}.{slot}")


def trace(ctx, cap: int) -> None:
    """Record up to ``cap`` device-step and CPU-half events of ``ctx`` from now (0 stops)."""
    require()
    check(lib.pi_test_ggml_trace(ctx._ptr, int(cap)), "pi_test_ggml_trace")


def trace_read(ctx, cap: int = 4096) -> list[tuple[str, int, int, int]]:
    """The events since the last read as (kind, layer, t0_ns, t1_ns), CLOCK_MONOTONIC; kind in
    :data:`TRACE_KINDS`.

    Raises:
        ValueError: tracing is off (:func:`trace` first).
    """
    require()
    ev = ffi.new("pi_test_ggml_event[]", cap)
    n = lib.pi_test_ggml_trace_read(ctx._ptr, ev, cap)
    if n < 0:
        raise ValueError("pi_test_ggml_trace_read: tracing is off (trace first)")
    return [(TRACE_KINDS[ev[i].kind], int(ev[i].layer), int(ev[i].t0_ns), int(ev[i].t1_ns)) for i in range(n)]
