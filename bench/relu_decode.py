"""End-to-end decode of a synthetic 7B-shaped ReLU llama, dense vs sparse.

Writes (once, into --dir) a llama GGUF with random Q4_0 weights of a 7B layer shape
(n_embd 4096, n_ff 11008, 32 heads; --layers of them, small vocabulary) marked as a
ReLU model (``powerinfer.ffn_act = "relu"``), measures the gate activations on a few
tokens, sets every layer's threshold on |relu(gate x)| (CATS form: up and down rows
of a skipped neuron are not read) to reach --sparsity, writes that as the sparsity
sidecar, and times greedy decode for both, interleaved, best of --repeats.

    python bench/relu_decode.py [--layers 4] [--sparsity 0.9] [--threads 2] [--tokens 32]

Without a predictor the gate stays dense: with the FFN at about 2/3 of a 7B layer's
bytes, the ceiling at 90% sparsity is about 1.66x (docs/sparsity.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from gguf import GGMLQuantizationType as T  # noqa: E402

from tests.fixtures.tiny_gguf import write_tiny_llama  # noqa: E402
from powerinfer_backend import Llama  # noqa: E402
from powerinfer_backend.sparsity.calibrate import fraction_at_or_above, hist_quantiles, threshold_for_sparsity  # noqa: E402
from powerinfer_backend.engine.native import FFN_HIST_BINS, NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.sparsity.sidecar import QUANTILES, SparsityProfile, write_sidecar  # noqa: E402


def build(path: Path, layers: int) -> None:
    if path.exists():
        return
    t = time.time()
    write_tiny_llama(
        path,
        n_vocab=4096,
        n_embd=4096,
        n_ff=11008,
        n_layer=layers,
        n_head=32,
        n_head_kv=32,
        n_ctx_train=2048,
        types={"matrix": T.Q4_0, "token_embd": T.Q4_0},
        seed=7,
        extra_kv={"powerinfer.ffn_act": "relu"},
    )
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.time() - t:.0f} s", file=sys.stderr)


def make_sidecar(path: Path, out: Path, sparsity: float, threads: int, threshold_on: str = "gate") -> None:
    """A sidecar of per-layer thresholds skipping ``sparsity`` of the neurons on 64 random
    tokens: on |act(gate x)| ("gate", CATS: up and down rows of a skipped neuron unread)
    or on |h| ("product": only down rows skipped; the form a device split takes). The
    sidecar's activation is the model's (ReLU, SiLU, ...)."""
    g = load_gguf(str(path), verbose=False)
    hp = g.hparams
    m = NativeModel(g)
    ctx = NativeContext(m, n_ctx=128, n_batch=64, n_threads=threads)
    ctx.set_ffn_threshold_on(threshold_on)
    hist = np.zeros((hp.n_layer, hp.n_ff, FFN_HIST_BINS), np.uint32)
    ctx.set_ffn_hist(hist)
    ctx.eval(list(np.random.default_rng(0).integers(1, hp.n_vocab, 64)))
    ctx.close()
    m.close()
    layer = hist.sum(axis=1)
    thr = np.array([threshold_for_sparsity(layer[i], sparsity) for i in range(hp.n_layer)], np.float32)
    freq = np.stack([fraction_at_or_above(hist[i], float(thr[i])) for i in range(hp.n_layer)]).astype(np.float32)
    prof = SparsityProfile(
        thresholds=thr,
        layer_sparsity=np.full(hp.n_layer, sparsity, np.float32),
        neuron_freq=freq,
        neuron_quantiles=hist_quantiles(hist, QUANTILES),
        layer_hist=(layer / layer.sum(axis=1, keepdims=True)).astype(np.float32),
        ffn_act=hp.act_name,
        info={"threshold_on": threshold_on, "method": "bench: fixed sparsity"},
    )
    from powerinfer_backend.loader.artifacts import model_fingerprint

    prof.info.update(model_sha256=model_fingerprint(path), model_file=path.name)
    write_sidecar(out, prof)


def decode_time(llm: Llama, n: int, clock) -> float:
    be = llm._backend
    be.truncate(0)
    logits = be.eval([1, 2, 3, 4])
    t = clock()
    for _ in range(n):
        logits = be.eval([int(np.argmax(logits[-1]))])
    return clock() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer_relu_bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="with --threads 1: time by process CPU time (a loaded host's waiting excluded)",
    )
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time needs --threads 1")
    clock = time.process_time if args.cpu_time else time.perf_counter
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    model = d / f"relu7b-{args.layers}L-q4_0.gguf"
    build(model, args.layers)
    side = d / f"sparse-{args.sparsity:g}.gguf"
    make_sidecar(model, side, args.sparsity, args.threads)
    llms = {
        "dense": Llama(str(model), n_ctx=256, n_threads=args.threads, verbose=False, sparse="off"),
        "sparse": Llama(str(model), n_ctx=256, n_threads=args.threads, verbose=False, sparse=str(side)),
    }
    best = {k: float("inf") for k in llms}
    for _ in range(args.repeats):
        for k, llm in llms.items():
            best[k] = min(best[k], decode_time(llm, args.tokens, clock))
    measured = llms["sparse"].stats()["ffn_sparsity"]
    print(
        f"7B-shaped ReLU llama, {args.layers} layers, Q4_0, {args.threads} threads, {args.tokens} tokens, "
        f"{'CPU time' if args.cpu_time else 'wall clock'}"
    )
    for k in llms:
        print(f"  {k:<7} {args.tokens / best[k]:7.2f} tok/s")
    print(f"  sparse / dense decode: {best['dense'] / best['sparse']:.2f}x at measured FFN sparsity {measured:.1%}")


if __name__ == "__main__":
    main()
