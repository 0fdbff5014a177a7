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
