"""Perplexity against mean predicted density for trained predictors (docs/predictors.md).

    python bench/predictor_frontier.py --sidecar S --text tinyshakespeare.txt --max-bytes 1003854 \\
        --densities 0.95,0.9,0.85 --allocate sensitivity [--unseen-offset 1003854] [--chunks 4]

Takes the predictors a ``train-predictor`` run wrote (all layers: train with a low
``--density`` so that every layer keeps its predictor), the FFN inputs it captured (the
artifact folder's cache, same ``--max-bytes``/``--tokens``/``--ctx``), and for each mean
density re-chooses only the per-layer thresholds (``error_curve`` /
``allocate_densities``, as train-predictor does), then measures perplexity on the
held-out tail of the training slice and on unseen text (``--unseen-offset``).
``--allocate recall`` uses one recall per layer instead (the values are recalls).
Slow (two perplexity runs per point, plus one probe per layer for ``sensitivity``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.loader.artifacts import artifact_dir  # noqa: E402
from powerinfer_backend.sparsity.sidecar_run import split_text_tokens  # noqa: E402
from powerinfer_backend.engine.down_cache import down_t_dtype, load_down_cache  # noqa: E402
from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.llama import Llama  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402
from powerinfer_backend.sparsity.perplexity import perplexity, read_text  # noqa: E402
from powerinfer_backend.sparsity.predictors import PredictorSet, apply, scores  # noqa: E402
from powerinfer_backend.sparsity.sidecar import read_sidecar  # noqa: E402
from powerinfer_backend.sparsity.train import (  # noqa: E402
    LAYER_DENSITIES,
    allocate_densities,
    error_curve,
    layer_h,
    threshold_for_recall,
)
from powerinfer_backend.sparsity.train.capture import _dequant  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=12288)
    ap.add_argument("--heldout-tokens", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument(
        "--unseen-offset", type=int, default=None, help="byte offset of the unseen text (default: --max-bytes)"
    )
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--densities", default="0.95,0.9,0.85")
    ap.add_argument("--allocate", choices=("sensitivity", "error", "uniform", "recall"), default="sensitivity")
    ap.add_argument("--probe-density", type=float, default=0.6)
    ap.add_argument("--probe-tokens", type=int, default=3072)
    ap.add_argument("--max-density", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model_path = args.model or default_model_path()
    g = load_gguf(model_path, verbose=False)
    hp = g.hparams
    ps = read_sidecar(args.sidecar).predictors
    _, train_ids, held = split_text_tokens(
        model_path,
        args.text,
        offset_bytes=0,
        max_bytes=args.max_bytes,
        n_ctx=args.ctx,
        tokens=args.tokens,
        heldout_tokens=args.heldout_tokens,
        error=ValueError,
        purpose="the frontier",
    )
    caches = [
        p
        for p in artifact_dir(model_path).glob("ffn_inputs.*.npy")
        if np.load(p, mmap_mode="r").shape == (hp.n_layer, len(train_ids), hp.n_embd)
    ]
    if not caches:
        raise SystemExit("no captured FFN inputs of this shape in the artifact folder: run train-predictor first")
    xs = np.load(caches[0], mmap_mode="r")
    n = xs.shape[1]
    n_tr = n - max(1, n // 10)
    curves, rec = {}, {}
    for layer in ps.layers:
        wg, wu = (_dequant(g.tensors[f"blk.{layer}.ffn_{k}.weight"]) for k in ("gate", "up"))
        dn = _dequant(g.tensors[f"blk.{layer}.ffn_down.weight"])
        x = xs[layer, n_tr:].astype(np.float32)
        hs = layer_h(x, wg, wu, hp.act_name, signed=True)
        sv = scores(ps.fc1[layer], ps.fc2[layer], x, n_threads=args.threads)
        curves[layer] = error_curve(sv, hs, dn)
        if args.allocate == "recall":
            t_l = float(np.quantile(layer_h(xs[layer, :n_tr:5][:2048].astype(np.float32), wg, wu, hp.act_name), 0.5))
            rec[layer] = (sv, (np.abs(hs) >= t_l).astype(np.float32))
    model = NativeModel(g)
    ctx = NativeContext(model, n_ctx=args.ctx, n_batch=args.ctx, n_threads=args.threads)
    down_t = load_down_cache(model_path, down_t_dtype(g))
    with Llama(model_path, n_ctx=args.ctx, n_threads=1, verbose=False, sparse="off") as llm:
        off = args.max_bytes if args.unseen_offset is None else args.unseen_offset
        unseen = llm.tokenize(read_text(args.text, off, None).encode("utf-8"))[: args.ctx * args.chunks]

    def ev(toks):
        ctx.truncate(0)
        return ctx.eval(toks, logits_all=True)

    def install(pset):
        for layer in range(hp.n_layer):
            ctx.set_ffn_predictor(layer, None)
            ctx.set_ffn_sparsity(layer, None)
        if pset is not None and pset.layers:
            apply(ctx, g, pset, down_t={x: down_t[x] for x in pset.layers})

    def run(pset):
        install(pset)
        out = []
        for toks in (held, unseen):
            ctx.predictor_stats(reset=True)
            ctx.ffn_stats(reset=True)
            p = perplexity(toks, ev, args.ctx)["ppl"]
            pred = ctx.predictor_stats(reset=True)["predicted"]
            _, tot = ctx.ffn_stats(reset=True, per_layer=True)
            out.append((p, float(np.where(tot > 0, pred / np.maximum(tot, 1), 1.0).mean())))
        return out

    base = run(None)
    print(f"dense: held {base[0][0]:.4f}, unseen {base[1][0]:.4f}", flush=True)
    costs = curves
    if args.allocate == "sensitivity":  # as train-predictor: the held-out tail, then the last captured chunks
        i_p = LAYER_DENSITIES.index(args.probe_density)
        n_probe = max(1, args.probe_tokens // args.ctx) * args.ctx
        probe = list(held[:n_probe])
        extra = (n_probe - len(probe)) // args.ctx * args.ctx
        if extra > 0:
            probe += list(train_ids[len(train_ids) - extra :])
        install(None)
        nll0 = perplexity(probe, ev, args.ctx)["nll"]
        sens = {}
        for layer in ps.layers:
            one = PredictorSet()
            one.fc1[layer], one.fc2[layer], one.thresholds[layer] = ps.fc1[layer], ps.fc2[layer], curves[layer][i_p][0]
            install(one)
            sens[layer] = perplexity(probe, ev, args.ctx)["nll"] - nll0
            print(f"  layer {layer}: NLL rise {sens[layer]:+.5f} at density {args.probe_density}", flush=True)
        floor = max(0.1 * float(np.median(list(sens.values()))), 1e-6)
        costs = {
            x: [(t, e * max(sens[x], floor) / max(curves[x][i_p][1], 1e-12)) for t, e in curves[x]] for x in curves
        }
    for d in (float(v) for v in args.densities.split(",")):
        pset, dens = PredictorSet(), []
        for layer in range(hp.n_layer):
            if layer not in curves:
                dens.append(1.0)
                continue
            if args.allocate == "recall":
                sv, y = rec[layer]
                tau = threshold_for_recall(sv, y, d)
                dens.append(round(float((sv >= tau).mean()), 3))
                if dens[-1] > args.max_density:
                    continue
            else:
                if args.allocate == "uniform":
                    i = LAYER_DENSITIES.index(d)
                else:
                    lo = args.probe_density if args.allocate == "sensitivity" else 0.0
                    i = allocate_densities(costs, d, args.max_density, n_layer=hp.n_layer, min_density=lo)[layer]
                tau = curves[layer][i][0]
                dens.append(LAYER_DENSITIES[i])
                if not np.isfinite(tau):
                    continue
            pset.fc1[layer], pset.fc2[layer], pset.thresholds[layer] = ps.fc1[layer], ps.fc2[layer], tau
        r = run(pset)
        print(
            f"{args.allocate} {d}: held {r[0][0]:.4f} ({r[0][0] / base[0][0] - 1:+.2%}) density {r[0][1]:.3f}"
            f" | unseen {r[1][0]:.4f} ({r[1][0] / base[1][0] - 1:+.2%}) density {r[1][1]:.3f} | layers {dens}",
            flush=True,
        )


if __name__ == "__main__":
    main()
