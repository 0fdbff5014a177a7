"""The native worker pool: :class:`NativePool` owns one ``pi_pool``."""

from __future__ import annotations

from .._native import check, ffi, lib
from .closing import Closing

__all__ = ["NativePool"]


class NativePool(Closing):
    """A ``pi_pool`` of ``n_threads`` (the calling thread and n_threads - 1 workers)
    for the C operators; freed by :meth:`close` (idempotent) or on garbage collection.

    Raises:
        ValueError: n_threads outside [1, 512].
        MemoryError: the workers cannot be started.
    """

    def __init__(self, n_threads: int):
        out = ffi.new("pi_pool **")
        check(lib.pi_pool_create(int(n_threads), out), "pi_pool_create")
        self._ptr = out[0]
        self.n_threads = int(n_threads)

    @property
    def ptr(self):
        """The ``pi_pool *`` (for the engine's calls; None once closed)."""
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            lib.pi_pool_free(self._ptr)
            self._ptr = None


def testing_stall(ctx, worker: int, ms: int) -> None:
    """Test only: thread ``worker`` of a :class:`NativeContext`'s pool (0 = the calling
    thread) sleeps ``ms`` milliseconds inside the next chunk of work it takes (once).

    Raises:
        ValueError: worker outside [0, n_threads) or ms outside [0, 10000].
    """
    check(lib.pi_test_pool_stall(ctx._ptr, int(worker), int(ms)), "pi_test_pool_stall")


def testing_chunk_counts(ctx) -> tuple[list[int], list[int] | None]:
    """Test only: per thread of a context's pool, the chunks it has run since the context
    was made, and those it ran in the job the last :func:`testing_stall` fired in (None
    while none has fired)."""
    n = ctx.n_threads
    total, stalled = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    lib.pi_test_pool_counts(ctx._ptr, total, stalled, n)
    return list(total), (None if stalled[0] < 0 else list(stalled))
