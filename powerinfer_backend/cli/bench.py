"""Speed benchmark: decode and prefill tokens/s for our engine and for llama.cpp
(llama-cpp-python) on the same GGUF and thread count, measured one after the other in
the same process, with the ratios. Engine time only (one eval per token, argmax in
Python for both); our full ``Llama`` loop is timed too, to report the per-token Python
overhead (cffi call, logits view, sampling, detokenizing)."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import numpy as np

_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair. "
)


def _prompt_tokens(tokenize, n: int) -> list:
    toks = tokenize(_TEXT.encode())
    while len(toks) < n:
        toks = toks + toks
    return toks[:n]


def _best(fn, repeats: int) -> float:
    return min(fn() for _ in range(max(1, repeats)))


def _measure(eval_tokens, reset, prompt, short, n_decode, repeats):
    """(prefill seconds, decode seconds) for an engine given as callables."""

    def prefill():
        reset()
        t = time.perf_counter()
        eval_tokens(prompt)
        return time.perf_counter() - t

    def decode():
        reset()
        logits = eval_tokens(short)
        t = time.perf_counter()
        for _ in range(n_decode):
            logits = eval_tokens([int(np.argmax(logits))])
        return time.perf_counter() - t

    return _best(prefill, repeats), _best(decode, repeats)


def _engine_calls(be) -> tuple[Callable, Callable]:
    """``_measure``'s (eval -> the last logits row, reset) for one of our engines."""
    return (lambda t: be.eval(t)[-1]), (lambda: be.truncate(0))


def _ours_sparse(llm, n_prefill: int, n_decode: int, repeats: int) -> dict:
    """The ``ours_sparse`` entry (or ``sparse_auto``'s reason for staying dense); closes ``llm``."""
    out: dict = {}
    try:
        if llm.stats().get("mode", "dense") != "dense":
            prompt = _prompt_tokens(lambda b: llm.tokenize(b, add_bos=False), n_prefill)
            t_pre, t_dec = _measure(*_engine_calls(llm.engine), prompt, prompt[:8], n_decode, repeats)
            st = llm.stats()
            out["ours_sparse"] = {
                "engine": f"powerinfer_backend sparse ({st['mode']})",
                "prefill_tok_s": n_prefill / t_pre,
                "decode_tok_s": n_decode / t_dec,
                "ffn_sparsity": st["ffn_sparsity"],
                "sidecar": st.get("sidecar"),
            }
        elif llm.stats().get("reason"):  # "auto" kept dense (calibration measured sparse slower): say so
            out["sparse_auto"] = llm.stats()["reason"]
    finally:
        llm.close()
    return out


def _ours_dense(llm, n_prefill: int, n_decode: int, repeats: int):
    """(the ``ours`` entry, prompt, short prompt, prefill s, decode s) of the dense engine; closes ``llm``."""
    from .._native import isa_name

    prompt = _prompt_tokens(lambda b: llm.tokenize(b, add_bos=False), n_prefill)
    short = prompt[:8]
    be = llm.engine
    repacked = int(getattr(be, "repacked", 0))
    t_pre, t_dec = _measure(*_engine_calls(be), prompt, short, n_decode, repeats)

    engine_time, evals = [0.0], [0]
    raw_eval = be.eval

    def timed_eval(tokens, logits_all=False):
        t = time.perf_counter()
        out = raw_eval(tokens, logits_all=logits_all)
        engine_time[0] += time.perf_counter() - t
        evals[0] += 1
        return out

    def full_loop():
        """(total, share outside the engine) of one create_completion, measured in the same run."""
        llm.reset()
        llm.eval(short)  # prompt outside the timed loop, as in _measure
        engine_time[0], evals[0] = 0.0, 0
        be.eval = timed_eval
        t = time.perf_counter()
        try:
            llm.create_completion(short, max_tokens=n_decode, temperature=0.0)
        finally:
            be.eval = raw_eval
        total = time.perf_counter() - t
        # per eval, as decode_tok_s: the first token comes from the prompt's logits (no eval)
        return total / max(1, evals[0]), (total - engine_time[0]) / total

    try:
        t_eval, overhead = min(full_loop() for _ in range(max(1, repeats)))
    finally:
        llm.close()
    ours = {
        "engine": f"powerinfer_backend ({isa_name()})",
        "prefill_tok_s": n_prefill / t_pre,
        "decode_tok_s": n_decode / t_dec,
        "llama_decode_tok_s": 1.0 / t_eval,
        "python_overhead_pct": 100.0 * overhead,
        "repacked_bytes": repacked,
    }
    return ours, prompt, short, t_pre, t_dec


def run_bench(
    model_path: str,
    *,
    n_threads: int = 2,
    n_decode: int = 64,
    n_prefill: int = 256,
    repeats: int = 3,
    include_llama_cpp: bool = True,
    sparse="auto",
    repack: bool = True,
) -> dict:
    """Measure both engines; returns tokens/s, ratios (ours / llama.cpp) and our
    Python overhead as a percentage of decode time. Ours runs dense first; then,
    unless ``sparse`` resolves to dense (``Llama(sparse=...)``), sparse too, with
    its measured FFN sparsity and its ratios to our dense and to llama.cpp. ``repack``:
    ours in row groups (``Llama``'s default) or over the file's rows (``result["repack"]``);
    llama.cpp at its defaults either way.

    Raises:
        ValueError: n_threads not an integer >= 1 (for 0 or -1 each engine would fall back
            to its own default count, and the ratios would compare different thread counts).
    """
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be an integer >= 1, got {n_threads!r}")
    from ..llama import Llama

    n_ctx = n_prefill + n_decode + 32
    result: dict[str, Any] = {
        "model": model_path,
        "threads": n_threads,
        "n_decode": n_decode,
        "n_prefill": n_prefill,
        "repack": bool(repack),
    }

    def ours_llama(mode):
        return Llama(
            model_path,
            n_ctx=n_ctx,
            n_batch=max(n_prefill, 32),
            n_threads=n_threads,
            verbose=False,
            sparse=mode,
            repack=repack,
        )

    if sparse not in ("off", None, False):
        result.update(_ours_sparse(ours_llama(sparse), n_prefill, n_decode, repeats))
        gc.collect()  # the sparse engine's memory is free before the dense one loads

    ours, prompt, short, t_pre, t_dec = _ours_dense(ours_llama("off"), n_prefill, n_decode, repeats)
    result["ours"] = ours
    gc.collect()

    if include_llama_cpp:
        from ..plugins.reference import load_reference, reference_mode

        ref = load_reference(
            model_path, n_ctx=n_ctx, n_batch=max(n_prefill, 32), n_threads=n_threads, n_threads_batch=n_threads
        )

        import llama_cpp

        def ref_eval(tokens):
            ref.eval(tokens)
            # ref.scores is only written with logits_all=True (which would also make llama.cpp
            # compute every prompt row's logits): read the last output row from the context
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))

        r_pre, r_dec = _measure(ref_eval, ref.reset, prompt, short, n_decode, repeats)
        mode = reference_mode(ref)  # llama.cpp's defaults (extra buffer types on) unless its probe failed
        result["llama_cpp"] = {
            "engine": "llama-cpp-python",
            "prefill_tok_s": n_prefill / r_pre,
            "decode_tok_s": n_decode / r_dec,
            "extra_buffer_types": mode["extra_buffer_types"],
            "reference_mode": mode["reason"],
        }
        result["ratio"] = {"decode": r_dec / t_dec, "prefill": r_pre / t_pre}
        ref.close()
    if "ours_sparse" in result:
        sp, dn = result["ours_sparse"], result["ours"]
        result["ratio_sparse"] = {
            "decode_vs_dense": sp["decode_tok_s"] / dn["decode_tok_s"],
            "prefill_vs_dense": sp["prefill_tok_s"] / dn["prefill_tok_s"],
        }
        if "llama_cpp" in result:
            lc = result["llama_cpp"]
            result["ratio_sparse"].update(
                decode_vs_llama_cpp=sp["decode_tok_s"] / lc["decode_tok_s"],
                prefill_vs_llama_cpp=sp["prefill_tok_s"] / lc["prefill_tok_s"],
            )
    return result


def format_table(r: dict) -> str:
    """Human-readable table of a run_bench result (with its roofline section when present)."""
    lines = [
        f"model {r['model']}  threads {r['threads']}" + ("" if r.get("repack", True) else "  ours: the file's rows"),
        f"{'engine':<40} {'prefill tok/s':>14} {'decode tok/s':>13}",
    ]
    for key in ("ours", "ours_sparse", "llama_cpp"):
        if key in r:
            e = r[key]
            lines.append(f"{e['engine']:<40} {e['prefill_tok_s']:>14.1f} {e['decode_tok_s']:>13.1f}")
    if "llama_cpp" in r:
        on = r["llama_cpp"].get("extra_buffer_types")
        lines.append(
            f"llama.cpp extra buffer types (repacked weights): {'on' if on else 'off'}"
            f" ({r['llama_cpp'].get('reference_mode')})"
        )
    if "ratio" in r:
        lines.append(f"{'ratio ours / llama.cpp':<40} {r['ratio']['prefill']:>14.2f} {r['ratio']['decode']:>13.2f}")
    if "ratio_sparse" in r:
        rs = r["ratio_sparse"]
        lines.append(f"{'ratio sparse / our dense':<40} {rs['prefill_vs_dense']:>14.2f} {rs['decode_vs_dense']:>13.2f}")
        if "decode_vs_llama_cpp" in rs:
            lines.append(
                f"{'ratio sparse / llama.cpp':<40} {rs['prefill_vs_llama_cpp']:>14.2f} "
                f"{rs['decode_vs_llama_cpp']:>13.2f}"
            )
        lines.append(f"measured FFN sparsity (sparse run): {r['ours_sparse']['ffn_sparsity']:.1%}")
    if "sparse_auto" in r:
        lines.append(f"sparse='auto' runs dense: {r['sparse_auto']}")
    lines.append(
        f"Python overhead in our Llama decode loop: {r['ours']['python_overhead_pct']:.1f}%"
        f" ({r['ours']['llama_decode_tok_s']:.1f} tok/s through create_completion)"
    )
    if "roofline" in r:  # bench --roofline
        from .roofline import format_roofline

        lines.append(format_roofline(r["roofline"]))
    return "\n".join(lines)


def _dig(r: dict, path: str):
    """r["a"]["b"] for path "a.b", or None where a key is missing."""
    for key in path.split("."):
        if not isinstance(r, dict) or key not in r:
            return None
        r = r[key]
    return r


#: the numbers of a run that `summarize_runs` takes the median of (those present)
SUMMARY_KEYS = (
    "ours.decode_tok_s",
    "ours.prefill_tok_s",
    "llama_cpp.decode_tok_s",
    "llama_cpp.prefill_tok_s",
    "ratio.decode",
    "ratio.prefill",
    "roofline.ours.decode_pct_of_roof",
    "roofline.llama_cpp.decode_pct_of_roof",
    "roofline.ours.prefill_pct_of_roof",
    "roofline.llama_cpp.prefill_pct_of_roof",
)


def summarize_runs(runs: list[dict]) -> dict:
    """Medians (and min, max) over whole ``bench`` runs of each number in SUMMARY_KEYS that
    every run has: {key: {"median", "min", "max"}}, plus "loadavg_before" (each run's
    1-minute load average when it started, the host's background) and "runs". A ratio's
    median is the median of the per-run ratios (each measured with both engines in the same
    minute), not the ratio of medians."""
    out: dict[str, Any] = {"runs": len(runs), "loadavg_before": [r.get("loadavg_before") for r in runs]}
    for key in SUMMARY_KEYS:
        vals = [_dig(r, key) for r in runs]
        if vals and all(v is not None for v in vals):
            out[key] = {"median": float(np.median(vals)), "min": float(min(vals)), "max": float(max(vals))}
    return out


def format_summary(s: dict) -> str:
    """Text of a summarize_runs result: one line per number."""
    loads = ", ".join(f"{v:.2f}" for v in s["loadavg_before"] if v is not None)
    lines = [f"medians of {s['runs']} runs (load average before each: {loads})"]
    for key in SUMMARY_KEYS:
        if key in s:
            v = s[key]
            lines.append(f"  {key:<40} {v['median']:>9.2f}  ({v['min']:.2f}-{v['max']:.2f})")
    return "\n".join(lines)
