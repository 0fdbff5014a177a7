"""The host's roofs, measured through the engine's own worker pool: read bandwidth and
int8 multiply-add peak (native/src/roofline.c), for ``bench --roofline``."""

from __future__ import annotations

from .._native import check, ffi, lib
from .pool import NativePool

__all__ = ["read_bandwidth", "int8_peak", "microkernel_isa"]


def _positive(name: str, value: int) -> int:
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def read_bandwidth(n_threads: int, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Read bandwidth of ``n_threads`` threads (bytes/s, the fastest of ``repeats`` passes).

    A buffer of ``nbytes`` bytes (rounded down to 4 KiB pages) is written once and read
    ``repeats`` times, each pass split over a pool of ``n_threads`` as a matmul's rows
    are; each byte is loaded once per pass (256-bit loads on AVX2 CPUs). Use a buffer
    well above the last-level cache (the default 1 GiB) to measure DRAM.

    Raises:
        ValueError: ``nbytes`` < 1 MiB, ``repeats`` < 1, ``n_threads`` outside [1, 512].
        MemoryError: the buffer cannot be allocated.
    """
    _positive("repeats", repeats)
    if int(nbytes) < 1 << 20:
        raise ValueError(f"nbytes must be >= 1 MiB (1048576), got {int(nbytes)}")
    out = ffi.new("double *")
    with NativePool(n_threads) as pool:
        check(lib.pi_bench_read_bw(pool.ptr, int(nbytes), int(repeats), out), "pi_bench_read_bw")
    return float(out[0])


def int8_peak(n_threads: int, iters: int = 200_000, repeats: int = 3) -> float:
    """Int8 multiply-add peak of ``n_threads`` threads, in operations/s (a multiply-add
    is 2), the best of ``repeats`` runs: each of the pool's chunks runs ``iters`` rounds of
    256 multiply-adds in registers, in the instruction sequence of the AVX2 quantized dot
    products (vpmaddubsw, vpmaddwd, vpaddd; a scalar loop without AVX2).

    Raises:
        ValueError: ``iters`` or ``repeats`` < 1, ``n_threads`` outside [1, 512].
    """
    _positive("iters", iters)
    _positive("repeats", repeats)
    out = ffi.new("double *")
    with NativePool(n_threads) as pool:
        check(lib.pi_bench_int8_peak(pool.ptr, int(iters), int(repeats), out), "pi_bench_int8_peak")
    return float(out[0])


def microkernel_isa() -> str:
    """The path both microbenchmarks take on this CPU: ``"avx2"`` or ``"scalar"``."""
    return ffi.string(lib.pi_bench_isa()).decode()
