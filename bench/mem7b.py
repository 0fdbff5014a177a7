"""Memory-bound decode on 7B-shaped synthetic llamas (issue 16 item 5), against llama.cpp.

Files (made once into --workdir by bench/synth_models.py: F16 random weights written with
gguf.GGUFWriter, quantized by llama.cpp's own quantizer through llama-cpp-python):
n_embd 4096, n_ff 11008, 32 heads (n_head_kv 32), --layers 8 (about 1-2 GiB: far beyond
the last-level cache), vocabulary 4096; SwiGLU in Q4_0, Q8_0 and Q4_K_M, and a ReLU
(``powerinfer.ffn_act = "relu"``) twin in Q4_0.

Measured in one process, --runs times, engines interleaved within a run (same file, same
threads): greedy decode of --tokens tokens after a 4-token prompt, one eval per token.

1. dense decode, ours vs llama-cpp-python, for each type;
2. SwiGLU Q4_0, gate form (``threshold_on = "gate"``: the up row of a skipped neuron is
   not read; its down row neither, or at this density the down runs densely over ffn_down
   with its h 0, whichever reads fewer bytes: ``stats()["down_dense_layers"]``) at
   --swiglu-sparsity (thresholds from one statistics pass on random tokens, as
   bench/relu_decode.py sets them), vs our dense;
3. ReLU Q4_0 with random rank-256 Q8_0 predictors thresholded to --relu-density of
   their scores (bench/predictor_decode.py), vs our dense.

Medians over the runs; the load average is printed with the numbers.

    python bench/mem7b.py --runs 3 [--threads 2] [--tokens 32] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first; the imports below follow it (noqa: E402)

from synth_models import DEFAULT_DIR, synthetic_llama, tensor_types  # noqa: E402

SHAPE = dict(n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_vocab=4096)
DENSE_TYPES = ("Q4_0", "Q8_0", "Q4_K_M")


def build(workdir: Path, layers: int) -> dict[str, Path]:
    """{"Q4_0", "Q8_0", "Q4_K_M", "relu-Q4_0"} -> the (cached) model files."""

    def log(s):
        print(s, file=sys.stderr, flush=True)

    stem = f"llama7b-{layers}L"
    files = synthetic_llama(workdir, stem + "-swiglu", DENSE_TYPES, n_layer=layers, seed=7, log=log, **SHAPE)
    relu = synthetic_llama(
        workdir,
        stem + "-relu",
        ["Q4_0"],
        n_layer=layers,
        seed=7,
        log=log,
        extra_kv={"powerinfer.ffn_act": "relu"},
        **SHAPE,
    )
    return files | {"relu-Q4_0": relu["Q4_0"]}


def greedy_decode(eval_last, reset, n: int) -> float:
    """Seconds for ``n`` greedy decode steps after a 4-token prompt; ``eval_last(tokens)``
    returns the last row's logits."""
    reset()
    logits = eval_last([1, 2, 3, 4])
    t = time.perf_counter()
    for _ in range(n):
        logits = eval_last([int(np.argmax(logits))])
    return time.perf_counter() - t


def _ctx_engine(ctx):
    return (lambda toks: ctx.eval(toks)[-1]), (lambda: ctx.truncate(0))


def dense_vs_llama_cpp(path: Path, threads: int, tokens: int, runs: int) -> dict:
    """Our dense decode and llama.cpp's on one file, interleaved, ``runs`` times."""
    import llama_cpp

    from powerinfer_backend.engine.native import NativeContext, NativeModel
    from powerinfer_backend.loader import load_gguf
    from powerinfer_backend.plugins.reference import load_reference, reference_mode

    g = load_gguf(str(path), verbose=False)
    m = NativeModel(g)
    m.repack()  # as Llama runs it on the CPU (row groups where the types have them)
    ctx = NativeContext(m, n_ctx=tokens + 8, n_batch=8, n_threads=threads)
    ref = load_reference(str(path), n_ctx=tokens + 8, n_batch=8, n_threads=threads, n_threads_batch=threads)

    def ref_last(toks):
        ref.eval(toks)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))

    ours, theirs = [], []
    for _ in range(runs):
        ours.append(tokens / greedy_decode(*_ctx_engine(ctx), tokens))
        theirs.append(tokens / greedy_decode(ref_last, ref.reset, tokens))
    extra_bufts = reference_mode(ref)["extra_buffer_types"]
    ref.close()
    ctx.close()
    m.close()
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "tensor_types": tensor_types(path),
        "ours_tok_s": ours,
        "llama_cpp_tok_s": theirs,
        "llama_cpp_extra_buffer_types": extra_bufts,
        "ratio": statistics.median(a / b for a, b in zip(ours, theirs)),
    }


def swiglu_gate_form(path: Path, sparsity: float, threads: int, tokens: int, runs: int, workdir: Path) -> dict:
    """Our dense vs the gate form at ``sparsity`` (sidecar thresholds), interleaved."""
    from relu_decode import make_sidecar

    from powerinfer_backend import Llama

    side = workdir / f"{path.stem}.gate-{sparsity:g}.sparsity.gguf"
    if not side.exists():
        make_sidecar(path, side, sparsity, threads, threshold_on="gate")
    return _dense_vs(
        lambda sparse: Llama(str(path), n_ctx=tokens + 8, n_batch=8, n_threads=threads, verbose=False, sparse=sparse),
        str(side),
        tokens,
        runs,
    )


def _dense_vs(make, sparse, tokens, runs) -> dict:
    llms = {"dense": make("off"), "sparse": make(sparse)}
    rate = {k: [] for k in llms}
    for _ in range(runs):
        for k, llm in llms.items():
            be = llm._backend
            rate[k].append(
                tokens / greedy_decode(lambda t, be=be: be.eval(t)[-1], lambda be=be: be.truncate(0), tokens)
            )
    st = llms["sparse"].stats()
    for llm in llms.values():
        llm.close()
    return {
        "dense_tok_s": rate["dense"],
        "sparse_tok_s": rate["sparse"],
        "ffn_sparsity": st["ffn_sparsity"],
        "down_t_type": st.get("down_t_type"),
        "down_dense_layers": st.get("down_dense_layers", []),
        "ratio": statistics.median(s / d for s, d in zip(rate["sparse"], rate["dense"])),
    }


def relu_predictors(path: Path, density: float, threads: int, tokens: int, runs: int) -> dict:
    """Our dense vs predictor mode at ``density`` (random rank-256 Q8_0 predictors)."""
    from predictor_decode import predictor_context

    from powerinfer_backend.engine.native import NativeContext, NativeModel
    from powerinfer_backend.loader import load_gguf

    g = load_gguf(str(path), verbose=False)
    m = NativeModel(g)
    m.repack()  # dense as Llama runs it; the predictor context gathers the file's rows
    dense = NativeContext(m, n_ctx=tokens + 8, n_batch=32, n_threads=threads)
    pred, info = predictor_context(m, g, density=density, rank=256, pred_type="q8_0", threads=threads, n_ctx=tokens + 8)
    rate = {"dense": [], "predictor": []}
    for _ in range(runs):
        rate["dense"].append(tokens / greedy_decode(*_ctx_engine(dense), tokens))
        pred.ffn_stats(reset=True)
        pred.predictor_stats(reset=True)
        rate["predictor"].append(tokens / greedy_decode(*_ctx_engine(pred), tokens))
    used, total = pred.ffn_stats()
    pred.close()
    dense.close()
    m.close()
    return info | {
        "dense_tok_s": rate["dense"],
        "predictor_tok_s": rate["predictor"],
        "ffn_sparsity": 1.0 - used / max(1, total),
        "ratio": statistics.median(p / d for p, d in zip(rate["predictor"], rate["dense"])),
    }


def _fmt(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_DIR, help=f"model file cache (default {DEFAULT_DIR})")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--swiglu-sparsity", type=float, default=0.4)
    ap.add_argument("--relu-density", type=float, default=0.1)
    ap.add_argument(
        "--only",
        choices=("dense", "gate", "predictor"),
        action="append",
        help="run only these parts (repeatable; default all)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    parts = set(a.only or ("dense", "gate", "predictor"))
    files = build(a.workdir, a.layers)
    r = {"threads": a.threads, "tokens": a.tokens, "runs": a.runs, "layers": a.layers, "loadavg_start": os.getloadavg()}
    if "dense" in parts:
        r["dense"] = {t: dense_vs_llama_cpp(files[t], a.threads, a.tokens, a.runs) for t in DENSE_TYPES}
    if "gate" in parts:
        r["swiglu_gate"] = swiglu_gate_form(files["Q4_0"], a.swiglu_sparsity, a.threads, a.tokens, a.runs, a.workdir)
    if "predictor" in parts:
        r["relu_predictor"] = relu_predictors(files["relu-Q4_0"], a.relu_density, a.threads, a.tokens, a.runs)
    r["loadavg_end"] = os.getloadavg()
    if a.json:
        print(json.dumps(r))
        return
    print(
        f"7B-shaped llama (n_embd 4096, n_ff 11008, 32 heads), {a.layers} layers, {a.threads} threads, "
        f"{a.tokens} decoded tokens, {a.runs} runs; load average {r['loadavg_start'][0]:.2f} at the start, "
        f"{r['loadavg_end'][0]:.2f} at the end"
    )
    for t, d in r.get("dense", {}).items():
        print(
            f"  dense {t:<7} ({d['bytes'] / 2**30:.2f} GiB, {'/'.join(d['tensor_types'])}): "
            f"ours {_fmt(d['ours_tok_s'])} tok/s, llama.cpp {_fmt(d['llama_cpp_tok_s'])} (extra buffer types "
            f"{'on' if d['llama_cpp_extra_buffer_types'] else 'off'}); ours / llama.cpp {d['ratio']:.2f}x"
        )
    if "swiglu_gate" in r:
        s = r["swiglu_gate"]
        down = (
            f"down over ffn_down on {len(s['down_dense_layers'])} layers"
            if s["down_dense_layers"]
            else f"down_t {s['down_t_type']}"
        )
        print(
            f"  SwiGLU Q4_0 gate form, FFN sparsity {s['ffn_sparsity']:.1%} ({down}): "
            f"dense {_fmt(s['dense_tok_s'])}, sparse {_fmt(s['sparse_tok_s'])} tok/s; "
            f"sparse / dense {s['ratio']:.2f}x"
        )
    if "relu_predictor" in r:
        s = r["relu_predictor"]
        print(
            f"  ReLU Q4_0 predictors (rank 256 Q8_0), FFN sparsity {s['ffn_sparsity']:.1%} "
            f"(down_t {s['down_t_type']}): dense {_fmt(s['dense_tok_s'])}, predictor {_fmt(s['predictor_tok_s'])}"
            f" tok/s; predictor / dense {s['ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
