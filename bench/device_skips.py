"""The device half skipping the hot neurons a predictor leaves out (issue 24 item 3), measured
with ggml's CPU backend as the device: decode tok/s of a synthetic 7B-shaped ReLU llama (Q4_0,
--layers of them; bench/relu_decode.py's file) with random rank-256 Q8_0 predictors thresholded
to --density of their scores (bench/predictor_decode.py), placed by the neuron plan at several
fractions of the full device bytes, the device computing every hot neuron or only the selected
ones (``device_skips``), interleaved run by run. The device shares the host's cores and memory
here, so the numbers say what reading fewer hot rows saves on the same memory, not what a GPU gains
(docs/placement.md predicts that).

    python bench/device_skips.py [--layers 4] [--density 0.1] [--fractions 0.25 0.5 0.75]
                                 [--threads 1] [--device-threads 1] [--tokens 16] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first (noqa: E402 below)

from predictor_decode import predictor_context, relu_model  # noqa: E402

from powerinfer_backend.hybrid import placement as P  # noqa: E402
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device  # noqa: E402
from powerinfer_backend.hybrid.offload import place_plan  # noqa: E402


def placed_contexts(m, g, dev, fractions, *, density: float, threads: int, n_ctx: int) -> dict:
    """{(fraction, device_skips): (context, plan)}: predictor contexts of ``m`` (random rank-256
    Q8_0 predictors at ``density``, predictor_decode.predictor_context) placed on ``dev`` by the
    neuron plan at each fraction of the full device bytes, the device computing every hot
    neuron (False) or only the selected ones (True); and the prompt the thresholds were set on."""
    out: dict = {}
    prompt: list[int] = []
    for frac in fractions:
        for skips in (False, True):
            ctx, info = predictor_context(
                m, g, density=density, rank=256, pred_type="q8_0", threads=threads, n_ctx=n_ctx
            )
            prompt = info["prompt"]
            sizer, sizes = DeviceSizer(dev, ctx), P.ModelSizes.of_context(ctx)
            budget = int(frac * P.full_device_bytes(sizes, ctx.n_ctx, ctx.n_batch, sizer))
            plan = P.plan_placement(sizes, None, budget, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, sizer=sizer)
            place_plan(ctx, dev, plan, budget, device_skips=skips)
            out[(frac, skips)] = (ctx, plan)
    return {"contexts": out, "prompt": prompt}


def decode_rate(ctx, prompt: list[int], n: int) -> float:
    """Greedy decode tok/s of ``n`` tokens after the first 4 of ``prompt``."""
    ctx.truncate(0)
    logits = ctx.eval(prompt[:4])
    t = time.perf_counter()
    for _ in range(n):
        logits = ctx.eval([int(np.argmax(logits[-1]))])
    return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer_relu_bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device-threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    g, m = relu_model(a.dir, a.layers)
    n_ctx = a.tokens + 16
    dev = open_device(resolve_device("ggml-cpu"), a.device_threads)
    made = placed_contexts(m, g, dev, a.fractions, density=a.density, threads=a.threads, n_ctx=n_ctx)
    ctxs, prompt = made["contexts"], made["prompt"]
    rates: dict[tuple, list[float]] = {k: [] for k in ctxs}
    used: dict[tuple, float] = {}
    for _ in range(a.runs):
        for k, (ctx, _) in ctxs.items():
            ctx.ffn_stats(reset=True)
            rates[k].append(decode_rate(ctx, prompt, a.tokens))
            u, t = ctx.ffn_stats(reset=False)
            used[k] = u / max(1, t)
    sizes = P.ModelSizes.from_gguf(g)
    rows = []
    for frac in a.fractions:
        plan = ctxs[(frac, False)][1]
        n_hot = sum(L.n_hot for L in plan.layers)
        every, skip = max(rates[(frac, False)]), max(rates[(frac, True)])
        ratios = [s / e for s, e in zip(rates[(frac, True)], rates[(frac, False)])]
        rows.append(
            dict(
                fraction=frac,
                hot_neurons=n_hot,
                hot_share=n_hot / (sizes.n_ff * sizes.n_layer),
                every_hot_tok_s=rates[(frac, False)],
                skips_tok_s=rates[(frac, True)],
                used_every=used[(frac, False)],
                used_skips=used[(frac, True)],
                ratio_best=skip / every,
                ratio_median=statistics.median(ratios),
            )
        )
    for ctx, _ in ctxs.values():
        ctx.close()
    dev.close()
    m.close()
    if a.json:
        print(json.dumps(dict(args=vars(a), rows=rows), indent=1))
        return 0
    print(
        f"7B-shaped ReLU llama, {a.layers} layers, Q4_0, random predictors at density {a.density}, "
        f"ggml-cpu device ({a.device_threads} thread(s)), host {a.threads} thread(s), {a.tokens} tokens, "
        f"best of {a.runs}"
    )
    for r in rows:
        print(
            f"  {r['fraction']:.0%} of the device bytes ({r['hot_share']:.0%} of the neurons hot): every hot row "
            f"{max(r['every_hot_tok_s']):.2f} tok/s (FFN rows used {r['used_every']:.1%}), skipping "
            f"{max(r['skips_tok_s']):.2f} ({r['used_skips']:.1%}): {r['ratio_best']:.2f}x "
            f"(median of runs {r['ratio_median']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
