"""Orchestration overhead of the ggml device half, measured with ggml's CPU backend as the
device (issue 14): decode and prefill tok/s of SmolLM2 on the CPU only (the same FFN
arithmetic a placed context uses, ``sparse="exact"``) and under plans on ``ggml-cpu`` at
several budgets, interleaved run by run so host load drifts hit every configuration alike.
With the device on the same cores the numbers say what the split costs (graph building,
copies, the handoff to the device thread), not what a GPU gains.

    python bench/ggml_overhead.py [--runs 3] [--threads 2] [--device-threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from powerinfer_backend import Llama
from powerinfer_backend.cli.bench import _engine_calls, _measure, _prompt_tokens
from powerinfer_backend.loader.models import default_model_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs; the best of each is compared")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device-threads", type=int, default=2)
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--n-prefill", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    path = a.model or default_model_path()
    n_ctx = a.n_prefill + a.n_decode + 32
    kw = dict(n_ctx=n_ctx, n_batch=a.n_prefill, n_threads=a.threads, verbose=False)
    engines = {"cpu (exact)": Llama(path, device="cpu", sparse="exact", **kw)}
    full = None
    for name, frac, placement in (
        ("ggml-cpu 100%", 1.0, "neurons"),
        ("ggml-cpu 50% neurons", 0.5, "neurons"),
        ("ggml-cpu 50% layers", 0.5, "layers"),
        ("ggml-cpu 25% neurons", 0.25, "neurons"),
    ):
        budget = "1GiB" if full is None else f"{int(full * frac)}B"
        llm = Llama(
            path, device="ggml-cpu", device_threads=a.device_threads, vram_budget=budget, placement=placement, **kw
        )
        if full is None:
            full = llm._backend.offload.plan.device_bytes  # 1 GiB holds everything: the full device bytes
        engines[name] = llm
    prompt = _prompt_tokens(lambda b: engines["cpu (exact)"].tokenize(b, add_bos=False), a.n_prefill)
    runs = {k: [] for k in engines}
    load = [os.getloadavg()[0]]
    for _ in range(a.runs):
        for name, llm in engines.items():
            t_pre, t_dec = _measure(*_engine_calls(llm.engine), prompt, prompt[:8], a.n_decode, 1)
            runs[name].append((a.n_prefill / t_pre, a.n_decode / t_dec))
        load.append(os.getloadavg()[0])
    out = {
        "model": path,
        "threads": a.threads,
        "device_threads": a.device_threads,
        "n_prefill": a.n_prefill,
        "n_decode": a.n_decode,
        "full_device_bytes": full,
        "loadavg_1min": load,
        "cpu_count": os.cpu_count(),
        "configs": {},
    }
    base = max(r[1] for r in runs["cpu (exact)"]), max(r[0] for r in runs["cpu (exact)"])
    for name, r in runs.items():
        st = engines[name].stats().get("device")
        dec, pre = max(x[1] for x in r), max(x[0] for x in r)
        out["configs"][name] = {
            "decode_tok_s": [round(x[1], 1) for x in r],
            "prefill_tok_s": [round(x[0], 1) for x in r],
            "best_decode_vs_cpu": round(dec / base[0], 3),
            "best_prefill_vs_cpu": round(pre / base[1], 3),
            "device_bytes": st["reserved"] if st else 0,
        }
    for llm in engines.values():
        llm.close()
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"{path}: {a.threads} threads + {a.device_threads} device threads, {os.cpu_count()} CPUs, "
            f"load average {', '.join(f'{x:.1f}' for x in load)}"
        )
        for name, c in out["configs"].items():
            print(
                f"{name:22s} decode {c['decode_tok_s']} tok/s ({c['best_decode_vs_cpu']:.2f}x cpu)  "
                f"prefill {c['prefill_tok_s']} tok/s ({c['best_prefill_vs_cpu']:.2f}x cpu)  "
                f"device bytes {c['device_bytes']}"
            )
    return 0


if __name__ == "__main__":
    t = time.time()
    rc = main()
    print(f"({time.time() - t:.0f} s)", file=sys.stderr)
    sys.exit(rc)
