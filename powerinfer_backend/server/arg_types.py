"""argparse types for the command line's counts and sizes (threads, context, batch,
token counts, byte offsets, rates), shared by ``serve`` and the ``cli`` commands (which
may import this layer): each gives a usage error (exit 2) naming the flag and its limits.

Thread counts: 1 to the number of CPUs this process may run on (``os.sched_getaffinity``,
else ``os.cpu_count()``). A thread beyond that has no CPU of its own: it waits behind the
others at every barrier of the forward pass, so more threads only slow decoding down (and
``bench`` would compare two engines that fell back to different counts)."""

from __future__ import annotations

import argparse
import math
import os


def available_cpus() -> int:
    """The logical CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def int_in(name: str, lo: int | None = None, hi: int | None = None):
    """argparse type: an integer in [lo, hi] (a None bound: no limit on that side)."""

    def parse(value):
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {value!r}") from None
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"{name} must be {_range(lo, hi)}, got {n}")
        return n

    return parse


def positive(name: str):
    """argparse type: an integer >= 1."""
    return int_in(name, 1)


def non_negative(name: str):
    """argparse type: an integer >= 0."""
    return int_in(name, 0)


def threads(name: str = "--threads"):
    """argparse type: a thread count in [1, :func:`available_cpus`] (the limit is read
    when the flag is parsed)."""

    def parse(value):
        n = int_in(name)(value)
        hi = available_cpus()
        if not 1 <= n <= hi:
            raise argparse.ArgumentTypeError(
                f"{name} must be in [1, {hi}], got {n} ({hi} CPUs available to this process)"
            )
        return n

    return parse


def _float(name: str, value) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be a number, got {value!r}") from None


def number(name: str, lo: float = 0.0, *, above: bool = False):
    """argparse type: a finite float >= lo (> lo with ``above``)."""

    def parse(value):
        x = _float(name, value)
        if not math.isfinite(x) or x < lo or (above and x == lo):
            raise argparse.ArgumentTypeError(
                f"{name} must be a finite number {'>' if above else '>='} {lo:g}, got {value}"
            )
        return x

    return parse


def _range(lo: int | None, hi: int | None) -> str:
    if lo is None or hi is None:
        return f">= {lo}" if hi is None else f"<= {hi}"
    return f"in [{lo}, {hi}]"


#: llama.cpp's LLAMA_DEFAULT_SEED, "pick a random seed"
RANDOM_SEED = 0xFFFFFFFF


def resolve_seed(seed: int | None) -> int:
    """``--seed`` as given, else (None, -1 or :data:`RANDOM_SEED`) a random one in
    [0, RANDOM_SEED). llama-cpp-python's completion code derives each completion's seed
    from the model's with a fixed generator, so passing its "random" default on would give
    the same text on every run of a fresh process."""
    if seed is not None and seed not in (-1, RANDOM_SEED):
        return seed
    import random

    return random.SystemRandom().randrange(RANDOM_SEED)


def between(name: str, lo: float, hi: float):
    """argparse type: a float strictly between lo and hi."""

    def parse(value):
        x = _float(name, value)
        if not lo < x < hi:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{name} must be in ({lo:g}, {hi:g}), got {value}")
        return x

    return parse
