"""plan --predict checked on the CPU: predicted vs measured CPU-only decode tok/s.

With nothing placed (budget 0) the predictor's two engines are CPU-only runs: ours reads
the model densely, llama.cpp too, at the host's bandwidth. This loads both engines on
one model (default: the embedded SmolLM2), then --rounds times, back to back: measures
the host bandwidth (numpy, --threads threads), decodes --n-decode tokens with ours and
with llama.cpp (--threads threads each), and prints per round the predicted and measured
tok/s and measured / predicted, then the medians. A shared host's load moves both the
bandwidth and the decode, so they are taken in the same moment.

    python bench/predict_cpu_check.py [--model M.gguf] [--rounds 5] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.hybrid.placement import ModelSizes, plan_placement  # noqa: E402
from powerinfer_backend.hybrid.placement import predict as pr  # noqa: E402


def decode_s(eval_last, n: int) -> float:
    logits = eval_last([1, 2, 3, 4, 5, 6, 7, 8])
    t = time.perf_counter()
    for _ in range(n):
        logits = eval_last([int(np.argmax(logits))])
    return time.perf_counter() - t


def main() -> None:
    import llama_cpp

    from powerinfer_backend import Llama
    from powerinfer_backend.loader import load_gguf
    from powerinfer_backend.loader.models import default_model_path
    from powerinfer_backend.plugins.reference import load_reference

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-decode", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    path = a.model or default_model_path()
    g = load_gguf(path, verbose=False)
    sizes = ModelSizes.from_gguf(g)
    g.close()
    n_ctx = 64 + a.n_decode
    plan = plan_placement(sizes, None, 0, n_ctx=n_ctx, n_batch=8)
    ours = Llama(path, n_ctx=n_ctx, n_batch=8, n_threads=a.threads, verbose=False, sparse="off")
    be = ours.engine
    ref = load_reference(path, n_ctx=n_ctx, n_batch=8, n_threads=a.threads, n_threads_batch=a.threads)

    def ours_eval(t):
        return be.eval(t)[-1]

    def ref_eval(t):
        ref.eval(t)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))

    rows = []
    n_past = 8 + a.n_decode // 2  # the mean KV length read over the decoded tokens
    for _ in range(a.rounds):
        bw = pr.measure_host_bandwidth(n_threads=a.threads)
        p_ours = pr.predict_ours(sizes, plan, None, device_gbps=bw, host_gbps=bw, mode="dense", n_past=n_past)
        p_ref = pr.predict_layer_split(sizes, 0, device_gbps=bw, host_gbps=bw, n_ctx=n_ctx, n_batch=8, n_past=n_past)
        be.truncate(0)
        m_ours = a.n_decode / decode_s(ours_eval, a.n_decode)
        ref.reset()
        m_ref = a.n_decode / decode_s(ref_eval, a.n_decode)
        rows.append(
            {
                "host_gbps": bw,
                "ours_predicted": p_ours.tok_s,
                "ours_measured": m_ours,
                "llama_cpp_predicted": p_ref.tok_s,
                "llama_cpp_measured": m_ref,
                "ours_ratio": m_ours / p_ours.tok_s,
                "llama_cpp_ratio": m_ref / p_ref.tok_s,
            }
        )
    ours.close()
    ref.close()
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    if a.json:
        print(json.dumps({"model": path, "threads": a.threads, "rounds": rows, "median": med}, indent=2))
        return
    print(
        f"{path}, {a.threads} threads, {a.n_decode} decoded tokens per round; bytes read per token: "
        f"{p_ours.host_bytes_read / 1e6:.1f} MB (ours), {p_ref.host_bytes_read / 1e6:.1f} MB (llama.cpp)"
    )
    print(
        f"{'round':>5s} {'host GB/s':>9s} {'ours pred':>9s} {'ours meas':>9s} {'meas/pred':>9s} "
        f"{'l.cpp pred':>10s} {'l.cpp meas':>10s} {'meas/pred':>9s}"
    )
    for i, r in enumerate(rows + [med]):
        print(
            f"{'median' if i == len(rows) else i:>5} {r['host_gbps']:9.2f} {r['ours_predicted']:9.1f} "
            f"{r['ours_measured']:9.1f} {r['ours_ratio']:9.2f} {r['llama_cpp_predicted']:10.1f} "
            f"{r['llama_cpp_measured']:10.1f} {r['llama_cpp_ratio']:9.2f}"
        )


if __name__ == "__main__":
    main()
