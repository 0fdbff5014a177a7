"""Decode speed of one model in several sparse modes, interleaved, best of --repeats.

    python bench/decode_modes.py [--model PATH] [--modes off,predictor] [--threads 1 --cpu-time]

Also prints each mode's measured FFN sparsity, predicted density and the predictor's
share of the sparse FFN time (predictor mode).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first; the imports below follow it (noqa: E402)

from relu_decode import decode_time  # noqa: E402

from powerinfer_backend import Llama  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default="off,predictor")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    model = args.model or default_model_path()
    llms = {m: Llama(model, n_ctx=512, n_threads=args.threads, verbose=False, sparse=m) for m in args.modes.split(",")}
    best = {m: float("inf") for m in llms}
    for _ in range(args.repeats):
        for m, llm in llms.items():
            llm.stats(reset=True)
            best[m] = min(best[m], decode_time(llm, args.tokens, clock))
    base = best[next(iter(llms))]
    print(
        f"{Path(model).name}, {args.threads} threads, {args.tokens} tokens, {'CPU time' if args.cpu_time else 'wall'}"
    )
    for m, llm in llms.items():
        st = llm.stats()
        extra = ""
        if st["mode"] == "predictor":
            extra = (
                f", predicted density {np.mean(st['predicted_density']):.3f}, predictor "
                f"{st['predictor_share_of_ffn']:.1%} of the sparse FFN time"
            )
        print(
            f"  {m:<10} {args.tokens / best[m]:7.1f} tok/s  {base / best[m]:.3f}x  "
            f"FFN sparsity {st['ffn_sparsity']:.3f}{extra}"
        )


if __name__ == "__main__":
    main()
