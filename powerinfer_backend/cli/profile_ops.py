"""``bench --profile-ops``: where our engine's time goes, per op kind, from the engine's
per-op timer (``NativeContext.set_profile``): milliseconds per decoded token and per
prompt token, with the share of the wall time the timer accounts for."""

from __future__ import annotations

import json
import time

import numpy as np

from .bench import _prompt_tokens


def _per_token(prof: dict, n: int, wall_s: float) -> dict:
    ops = {op: {"ms_per_token": ms / n, "calls_per_token": calls / n} for op, (ms, calls) in prof.items() if calls}
    timed = sum(o["ms_per_token"] for o in ops.values())
    return {"tokens": n, "wall_ms_per_token": 1e3 * wall_s / n, "timed_ms_per_token": timed, "ops": ops}


def run_profile_ops(
    model_path: str, *, n_threads: int = 2, n_decode: int = 64, n_prefill: int = 256, sparse="off", repack: bool = True
) -> dict:
    """Time each op kind of our engine over one ``n_prefill``-token prompt and ``n_decode``
    greedy decode steps (after an 8-token prompt), ``n_threads`` threads, ``repack`` as
    ``Llama``'s (row groups, or the file's rows). Returns
    ``{"model", "threads", "mode", "decode": {...}, "prefill": {...}}``, each phase with
    ``tokens``, ``wall_ms_per_token``, ``timed_ms_per_token`` (the ops' sum) and ``ops``: op
    kind -> ``ms_per_token``, ``calls_per_token`` (ops that ran only).

    Raises:
        ValueError: as :class:`powerinfer_backend.Llama` for a bad model or option.
    """
    from ..llama import Llama

    llm = Llama(
        model_path,
        n_ctx=n_prefill + n_decode + 32,
        n_batch=max(n_prefill, 32),
        n_threads=n_threads,
        verbose=False,
        sparse=sparse,
        repack=repack,
    )
    try:
        be = llm.engine
        ctx = be.ctx
        prompt = _prompt_tokens(lambda b: llm.tokenize(b, add_bos=False), n_prefill)
        be.eval(prompt[:8])  # first-touch of the weights and buffers outside the timings
        be.truncate(0)
        ctx.set_profile(True)
        t = time.perf_counter()
        be.eval(prompt)
        prefill = _per_token(ctx.profile(reset=True), n_prefill, time.perf_counter() - t)
        be.truncate(0)
        logits = be.eval(prompt[:8])[-1]
        ctx.profile(reset=True)
        t = time.perf_counter()
        for _ in range(n_decode):
            logits = be.eval([int(np.argmax(logits))])[-1]
        decode = _per_token(ctx.profile(reset=True), n_decode, time.perf_counter() - t)
        ctx.set_profile(False)
        return {
            "model": model_path,
            "threads": n_threads,
            "mode": llm.stats().get("mode", "dense"),
            "decode": decode,
            "prefill": prefill,
        }
    finally:
        llm.close()


def format_profile(r: dict) -> str:
    """Human-readable table of :func:`run_profile_ops`'s result."""
    d, p = r["decode"], r["prefill"]
    lines = [
        f"model {r['model']}  threads {r['threads']}  {r['mode']}",
        f"{'op':<14} {'decode ms/tok':>14} {'share':>6} {'calls/tok':>9} {'prefill ms/tok':>15} {'share':>6}",
    ]
    for op in sorted(set(d["ops"]) | set(p["ops"]), key=lambda o: -d["ops"].get(o, {}).get("ms_per_token", 0.0)):
        do, po = d["ops"].get(op), p["ops"].get(op)
        lines.append(
            f"{op:<14} {do['ms_per_token'] if do else 0:>14.4f} "
            f"{100 * do['ms_per_token'] / d['wall_ms_per_token'] if do else 0:>5.1f}% "
            f"{do['calls_per_token'] if do else 0:>9.1f} {po['ms_per_token'] if po else 0:>15.4f} "
            f"{100 * po['ms_per_token'] / p['wall_ms_per_token'] if po else 0:>5.1f}%"
        )
    lines.append(
        f"{'timed / wall':<14} {d['timed_ms_per_token']:>7.3f} / {d['wall_ms_per_token']:.3f} ms"
        f"{'':>13} {p['timed_ms_per_token']:>8.3f} / {p['wall_ms_per_token']:.3f} ms"
    )
    return "\n".join(lines)


def profile_ops_command(args, model_path: str) -> int:
    """``bench --profile-ops``: run :func:`run_profile_ops` with the bench options and print
    its JSON (``--json``) or table; returns the exit status."""
    r = run_profile_ops(
        model_path,
        n_threads=args.threads,
        n_decode=args.n_decode,
        n_prefill=args.n_prefill,
        sparse=args.sparse,
        repack=args.repack,
    )
    print(json.dumps(r, indent=2) if args.json else format_profile(r))
    return 0
