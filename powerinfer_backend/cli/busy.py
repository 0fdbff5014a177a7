"""``bench --busy N``: decode speed, ours and llama.cpp's (llama-cpp-python), while N busy
processes (pure-CPU spin loops) compete for the cores, as on a desktop where other programs
run. Both engines are measured at their constructor defaults and at an equal thread count,
in the same run, with the ratios; the busy processes are killed afterwards, also on errors
and Ctrl-C, and each one exits by itself should this process die first."""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from .bench import _prompt_tokens

# Spins in a tight loop; every ~10^6 iterations checks that its parent is still the one
# that started it, so that a killed benchmark cannot leave it running.
_SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1000000):\n        pass\n"


@contextlib.contextmanager
def busy_processes(n: int):
    """Run ``n`` busy processes for the duration of the ``with`` block; yields their pids.

    Raises:
        ValueError: n < 0.
    """
    if n < 0:
        raise ValueError(f"the number of busy processes must be >= 0, got {n}")
    procs = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _SPIN],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _decode_tok_s(eval_last, reset, short, n_decode: int, repeats: int) -> float:
    """Median decode tokens/s over ``repeats`` runs of n_decode greedy tokens after ``short``."""
    rates = []
    for _ in range(max(1, repeats)):
        reset()
        logits = eval_last(short)
        t = time.perf_counter()
        for _ in range(n_decode):
            logits = eval_last([int(np.argmax(logits))])
        rates.append(n_decode / (time.perf_counter() - t))
    return statistics.median(rates)


def _ours(model_path: str, n_ctx: int, n_threads, short_of, n_decode: int, repeats: int) -> dict:
    from ..llama import Llama

    kw = {} if n_threads is None else {"n_threads": n_threads}
    llm = Llama(model_path, n_ctx=n_ctx, verbose=False, **kw)
    try:
        be = llm.engine
        short = short_of(lambda b: llm.tokenize(b, add_bos=False))
        rate = _decode_tok_s(lambda t: be.eval(t)[-1], lambda: be.truncate(0), short, n_decode, repeats)
        return {"threads": llm.n_threads, "mode": llm.stats().get("mode", "dense"), "decode_tok_s": rate}
    finally:
        llm.close()
        gc.collect()


def _llama_cpp(model_path: str, n_ctx: int, n_threads, short_of, n_decode: int, repeats: int) -> dict:
    import llama_cpp

    from ..plugins.reference import load_reference, reference_mode

    kw = {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
    ref = load_reference(model_path, n_ctx=n_ctx, **kw)
    try:
        short = short_of(lambda b: ref.tokenize(b, add_bos=False))

        def eval_last(tokens):
            ref.eval(tokens)
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))

        rate = _decode_tok_s(eval_last, ref.reset, short, n_decode, repeats)
        return {
            "threads": int(ref.n_threads),
            "decode_tok_s": rate,
            "extra_buffer_types": reference_mode(ref)["extra_buffer_types"],
        }
    finally:
        ref.close()
        gc.collect()


def run_busy_bench(model_path: str, *, n_busy: int, n_threads: int = 2, n_decode: int = 64, repeats: int = 3) -> dict:
    """Decode tokens/s of both engines beside ``n_busy`` busy processes.

    Two configurations, each measured ours then llama.cpp: ``defaults`` (both
    constructors without ``n_threads``) and ``equal`` (both at ``n_threads``). Rates are
    medians of ``repeats`` runs of ``n_decode`` greedy tokens; ``ratio`` is ours /
    llama.cpp. The 1-minute load average is recorded before and after; ``busy_pids``
    are the processes started (all killed when this returns or raises).

    Raises:
        ValueError: n_busy < 0 or n_threads < 1.
    """
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    n_ctx = n_decode + 64

    def short_of(tokenize):
        return _prompt_tokens(tokenize, 8)

    result = {
        "model": model_path,
        "n_busy": n_busy,
        "n_decode": n_decode,
        "repeats": repeats,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    with busy_processes(n_busy) as pids:
        result["busy_pids"] = pids
        time.sleep(0.2 if n_busy else 0.0)  # let the spinners reach the run queue
        result["loadavg_before"] = os.getloadavg()[0]
        for name, nt in (("defaults", None), ("equal", n_threads)):
            ours = _ours(model_path, n_ctx, nt, short_of, n_decode, repeats)
            ref = _llama_cpp(model_path, n_ctx, nt, short_of, n_decode, repeats)
            result[name] = {"ours": ours, "llama_cpp": ref, "ratio": ours["decode_tok_s"] / ref["decode_tok_s"]}
        result["loadavg_after"] = os.getloadavg()[0]
    return result


def format_busy(r: dict) -> str:
    """Human-readable table of a run_busy_bench result."""
    lines = [
        f"model {r['model']}  {r['n_busy']} busy process(es) on {r['cpus']} CPUs  "
        f"load average {r['loadavg_before']:.1f} -> {r['loadavg_after']:.1f}",
        f"{'config':<10} {'ours thr':>8} {'ours tok/s':>11} {'llama thr':>9} {'llama tok/s':>12} {'ratio':>6}",
    ]
    for name in ("defaults", "equal"):
        c = r[name]
        lines.append(
            f"{name:<10} {c['ours']['threads']:>8} {c['ours']['decode_tok_s']:>11.1f} "
            f"{c['llama_cpp']['threads']:>9} {c['llama_cpp']['decode_tok_s']:>12.1f} {c['ratio']:>6.2f}"
        )
    on = r["equal"]["llama_cpp"].get("extra_buffer_types")
    lines.append(f"llama.cpp extra buffer types (repacked weights): {'on' if on else 'off'}")
    return "\n".join(lines)
