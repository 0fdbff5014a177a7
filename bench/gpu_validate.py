"""GPU validation of the ggml device (issue 14): logits, memory and speed against llama.cpp.

One command for a machine with a GPU build of ggml (a CUDA, Metal, Vulkan or HIP build of
llama-cpp-python, docs/building.md); about 3-6 minutes on a 16-core host with an H200:

    python bench/gpu_validate.py [--device cuda] [--budget-fraction 0.25] [--out gpu_validate.json]
    python bench/gpu_validate.py --device ggml-cpu --small      # smoke check of the script (~20 s)

What it does, for two synthetic 7B-shaped llama models it writes itself (n_embd 4096,
n_ff 11008, 32 heads, --layers layers, a 32000-token vocabulary; random F16 weights
quantized to --quant by llama.cpp's own quantizer): a ReLU one (``powerinfer.ffn_act =
"relu"``, with a sparsity sidecar whose thresholds skip --sparsity of the neurons: on |h|
by default, the form the device split takes, made as bench/relu_decode.py makes them;
random weights fire half of the neurons, trained ReLU models ~90%) and a SwiGLU one (dense):

1. **logits**: teacher-forced logits of --n-check random tokens, ``Llama(device=...)``
   against the CPU-only engine (both ``sparse="exact"``, the arithmetic a placed context
   runs), at three budgets (--fractions of the model's full device bytes): max |Δ|, the
   top-1 agreement (all positions, and those where the CPU's top-2 margin is >= 0.1);
2. **memory**: at each budget, ``llm.stats()["device"]`` (reserved, used, high-water)
   <= the budget, and the device's free memory (``ggml_backend_dev_memory``) before
   loading, after it and after the evals: the differences are what ggml allocated for us
   in loading and in all (on a GPU, the second also ggml's own pool and workspaces; on
   the CPU device the host's free memory moves with everything else, so it is only
   printed);
3. **speed** at each --budget-fraction (default 0.25 and 0.5; the goal, at the first: ours
   >= 3x llama.cpp's layer split decode on the ReLU model): decode (--n-decode tokens after
   8) and prefill (--n-prefill tokens) tok/s of ours on the device and of llama.cpp with
   ``n_gpu_layers`` chosen to fit the same budget (hybrid/placement/predict.py:
   llama_cpp_offload; its op offload on, as by default: batches on the device even with no
   layer there) at each budget, and of both CPU-only once (llama.cpp's op offload off);
   with a device bandwidth (--device-bandwidth; a GPU's from the planner's table by
   default) also what ``plan --predict`` predicts and, from it and the measurements, the
   device's round trip per split layer that ``placement="auto"`` does not model
   (``sync_fit_s``).

Prints a table and writes JSON (--out). Exit status 0 when every check passed, 1 when one
failed, 2 when the device or the ggml binding is missing (a message says what was looked
for and where). Written against issue 14's contract (powerinfer_backend.engine.ggml, the
``device=`` names of Llama); docs/placement.md "GPU validation".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

#: user device name -> the prefix of the ggml device names of that backend
_BACKEND_PREFIX = {"cuda": "CUDA", "metal": "Metal", "vulkan": "Vulkan", "hip": "ROCm", "ggml-cpu": "CPU"}
#: option defaults without / with --small
_DEFAULTS = {
    False: dict(ctx=512, batch=128, n_check=32, n_decode=32, n_prefill=128, repeats=2),
    True: dict(ctx=128, batch=8, n_check=16, n_decode=8, n_prefill=32, repeats=1),
}
#: top-2 margin (logits) above which the device must pick the CPU's top-1 token
MARGIN = 0.1


def log(msg: str) -> None:
    print(f"[gpu_validate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def resolve_device(name: str):
    """(the ggml binding module, the ggml device's info) for a ``device=`` name, or
    SystemExit(2) with a message naming what was looked for and where."""
    try:
        from powerinfer_backend.engine import ggml as G
    except ImportError as e:
        raise SystemExit(
            f"gpu_validate: this checkout has no ggml device (powerinfer_backend.engine.ggml: {e}); "
            f"it comes with issue 14 (branches ggmldev + ggmlpy)"
        ) from None
    try:
        version = G.bind()
    except RuntimeError as e:
        raise SystemExit(f"gpu_validate: ggml could not be bound: {e}") from None
    devs = G.list_devices()
    prefix = _BACKEND_PREFIX.get(name.lower())
    found = [d for d in devs if (d.name.startswith(prefix) if prefix else d.name == name)]
    if prefix == "CPU":
        found = [d for d in found if d.type == "cpu"]
    if not found:
        have = ", ".join(f"{d.name} ({d.type}, {d.description})" for d in devs) or "none"
        raise SystemExit(
            f"gpu_validate: no ggml device for {name!r} (looked for "
            f"{prefix + '*' if prefix else name!r}); ggml {version} found: {have}. A GPU needs a GPU "
            f"build of llama-cpp-python (docs/building.md); `powerinfer-backend devices` lists them"
        )
    return G, found[0]


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def device_free(G, name: str) -> int:
    return next(d.free_bytes for d in G.list_devices() if d.name == name)


def build_model(dir_: Path, kind: str, shape: dict, quant: str) -> Path:
    """The quantized model file (made once): F16 synthetic llama, then llama.cpp's quantizer."""
    import llama_cpp
    from gguf import GGMLQuantizationType as T

    from tests.fixtures.tiny_gguf import write_tiny_llama

    tag = "x".join(str(shape[k]) for k in ("n_layer", "n_embd", "n_ff", "n_vocab"))
    out = dir_ / f"{kind}-{tag}.{quant}.gguf"
    if out.exists():
        return out
    dir_.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    f16 = dir_ / f"{kind}-{tag}.F16.gguf"
    write_tiny_llama(
        f16,
        **shape,
        n_head_kv=shape["n_head"],
        n_ctx_train=4096,
        seed=7,
        types={"matrix": T.F16, "token_embd": T.F16},
        extra_kv={"powerinfer.ffn_act": "relu"} if kind == "relu" else None,
    )
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[quant]
    params.nthread = os.cpu_count() or 1
    with _quiet_stderr():  # the quantizer prints every tensor
        rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params))
    f16.unlink()
    if rc != 0:
        raise SystemExit(f"gpu_validate: llama_model_quantize of {f16} failed ({rc})")
    log(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f} s")
    return out


def sizes_of(path: Path):
    from powerinfer_backend.hybrid.placement import ModelSizes
    from powerinfer_backend.loader import load_gguf

    g = load_gguf(str(path), verbose=False)
    try:
        return ModelSizes.from_gguf(g)
    finally:
        g.close()


def logits_of(llm, tokens: list[int]) -> np.ndarray:
    be = llm.engine
    be.truncate(0)
    return np.array(be.eval(tokens, logits_all=True), np.float64)


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    top2 = np.sort(ref, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) >= MARGIN
    agree = ref.argmax(1) == got.argmax(1)
    return {
        "max_abs_diff": float(np.abs(ref - got).max()),
        "top1_agree": float(agree.mean()),
        "top1_agree_margin": float(agree[sure].mean()) if sure.any() else 1.0,
        "n_margin": int(sure.sum()),
    }


def open_llm(path: Path, a, **kw):
    from powerinfer_backend import Llama

    if kw.get("device") == "ggml-cpu":
        kw["device_threads"] = a.device_threads
    return Llama(str(path), n_ctx=a.ctx, n_batch=a.batch, n_threads=a.threads, verbose=False, **kw)


def check_budget(path: Path, a, G, dev, budget: int, ref: np.ndarray, tokens: list[int]) -> dict:
    """Logits and memory of ``Llama(device=a.device)`` at ``budget`` bytes, with the neuron
    plan (attention blocks and hot rows: every budget exercises the device half, where
    ``placement="auto"`` may place nothing)."""
    free0 = device_free(G, dev.name)
    llm = open_llm(path, a, device=a.device, vram_budget=f"{budget}B", sparse="exact", placement="neurons")
    free_loaded = device_free(G, dev.name)
    try:
        r = compare(ref, logits_of(llm, tokens))
        st = llm.stats().get("device") or {}
        free1 = device_free(G, dev.name)
    finally:
        llm.close()
        del llm
        gc.collect()
    r.update(
        budget=budget,
        reserved=st.get("reserved"),
        used=st.get("used"),
        high_water=st.get("high_water"),
        free_before=free0,
        free_after=free1,
        allocated_load=free0 - free_loaded,
        allocated=free0 - free1,
    )
    stats_ok = all(isinstance(st.get(k), int) and st[k] <= budget for k in ("reserved", "used", "high_water"))
    # a GPU's free memory is ours to measure; on the CPU device it is the host's (noise)
    mem_ok = dev.type == "cpu" or free0 - free1 <= budget + a.mem_slack
    r["ok"] = bool(stats_ok and mem_ok and r["top1_agree_margin"] == 1.0)
    return r


def measure_speed(eval_tokens, reset, a, tokens: list[int]) -> dict:
    from powerinfer_backend.cli.bench import _measure

    t_pre, t_dec = _measure(eval_tokens, reset, tokens[: a.n_prefill], tokens[:8], a.n_decode, a.repeats)
    return {"prefill_tok_s": a.n_prefill / t_pre, "decode_tok_s": a.n_decode / t_dec}


def speed_ours(path: Path, a, key: str, sparse: str, kw: dict, tokens: list[int]) -> dict:
    """measure_speed of our engine opened with ``sparse`` (exact where the device refuses it)."""
    from powerinfer_backend.cli.bench import _engine_calls

    try:
        llm = open_llm(path, a, sparse=sparse, **kw)
    except (ValueError, NotImplementedError) as e:  # a sparse mode the device does not take: exact
        log(f"{key}: sparse={sparse} refused ({e}); exact")
        llm = open_llm(path, a, sparse="exact", **kw)
    try:
        out = measure_speed(*_engine_calls(llm.engine), a, tokens)
        out["mode"] = llm.stats().get("mode")
        out["placement"] = (llm.stats().get("device") or {}).get("placement")  # what auto chose
    finally:
        llm.close()
    return out


def llama_speed(path: Path, a, G, dev, ngl: int, tokens: list[int], **kw) -> dict:
    """measure_speed of llama.cpp with ``ngl`` layers on the device (kw: more of
    ``llama_cpp.Llama``'s arguments), and its device bytes."""
    import llama_cpp

    from powerinfer_backend.plugins.reference import load_reference, reference_mode

    free0 = device_free(G, dev.name)
    ref = load_reference(
        str(path), n_ctx=a.ctx, n_batch=a.batch, n_threads=a.threads, n_threads_batch=a.threads, n_gpu_layers=ngl, **kw
    )
    free1 = device_free(G, dev.name)

    def ref_eval(t):
        ref.eval(t)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))

    try:
        out = measure_speed(ref_eval, ref.reset, a, tokens)
        out.update(
            n_gpu_layers=ngl,
            allocated=free0 - free1,  # llama.cpp's own device bytes (a GPU's)
            extra_buffer_types=reference_mode(ref)["extra_buffer_types"],
        )
    finally:
        ref.close()
        gc.collect()
    return out


def speed(path: Path, a, G, dev, sizes, budget: int, sparse: str, tokens: list[int]) -> dict:
    """Decode/prefill tok/s at ``budget``: ours on the device, llama.cpp's layer split."""
    from powerinfer_backend.hybrid.placement.predict import llama_cpp_offload

    dev_kw = dict(device=a.device, vram_budget=f"{budget}B")
    if a.device_bandwidth:  # placement auto plans with the bandwidth the prediction uses
        dev_kw["device_bandwidth"] = a.device_bandwidth
    out = {"ours": speed_ours(path, a, "ours", sparse, dev_kw, tokens)}
    gc.collect()
    if out["ours"]["placement"] is None or out["ours"]["placement"].get("policy") != "neurons":
        # the neuron plan too: its split layers measure the round trip (auto may place nothing)
        out["ours_neurons"] = speed_ours(path, a, "ours_neurons", sparse, dict(dev_kw, placement="neurons"), tokens)
        gc.collect()
    n_gpu, _ = llama_cpp_offload(sizes, budget, n_ctx=a.ctx, n_batch=a.batch)
    out["llama_cpp_layers"] = llama_speed(path, a, G, dev, n_gpu, tokens)
    out["decode_ratio"] = out["ours"]["decode_tok_s"] / out["llama_cpp_layers"]["decode_tok_s"]
    out["prefill_ratio"] = out["ours"]["prefill_tok_s"] / out["llama_cpp_layers"]["prefill_tok_s"]
    return out


def predicted(path: Path, a, sizes, budget: int, freq, sp: dict, cpu: dict) -> dict:
    """What ``plan --predict`` says at ``budget`` (placement auto, the default, with the
    engine's round trip ``sync_s``), and the round trip per split layer that the measurements
    leave: (measured seconds per token of the run with split layers, ``sp["ours_neurons"]``
    where auto placed otherwise, - its plan's predicted ones without a round trip, scaled as
    the CPU-only run's measured / predicted) / its split layers (work on both sides). The
    host bandwidth is the engine's (its plan's inputs, so the same plan), else
    --host-bandwidth, else measured here; the device's seconds are scaled too (approximate)."""
    from powerinfer_backend.hybrid.placement import plan_auto, plan_placement
    from powerinfer_backend.hybrid.placement import predict as pr

    engine = sp["ours"].get("placement") or (sp.get("ours_neurons") or {}).get("placement") or {}
    host = engine.get("host_gbps") or a.host_bandwidth or pr.measure_host_bandwidth(n_threads=a.threads)
    mode = "relu" if freq is not None else "dense"
    sizes = sizes.for_mode(mode)  # the engine's sparse layers keep their down_t once split
    kw = dict(device_gbps=a.device_bandwidth, host_gbps=host, mode=mode)
    sync = engine.get("sync_s", 0.0)
    plan = plan_auto(sizes, freq, budget, n_ctx=a.ctx, n_batch=a.batch, sync_s=sync, **kw)  # placement="auto"
    ours = pr.predict_ours(sizes, plan, freq, sync_s=sync, **kw)
    split = pr.predict_layer_split(
        sizes, budget, device_gbps=a.device_bandwidth, host_gbps=host, n_ctx=a.ctx, n_batch=a.batch
    )
    cpu_pred = pr.predict_ours(sizes, plan_placement(sizes, freq, 0, n_ctx=a.ctx, n_batch=a.batch), freq, **kw)
    fitted, measured = (plan, sp["ours"]) if "ours_neurons" not in sp else (None, sp["ours_neurons"])
    if fitted is None:
        fitted = plan_placement(sizes, freq, budget, n_ctx=a.ctx, n_batch=a.batch)
    n_split = sum(pr.split_layer(L.attn_on_device, L.n_hot, sizes.n_ff) for L in fitted.layers)
    host_scale = cpu_pred.tok_s / cpu["decode_tok_s"]  # measured / predicted seconds, CPU-only
    fit = 1 / measured["decode_tok_s"] - pr.predict_ours(sizes, fitted, freq, **kw).seconds_per_token * host_scale
    return {
        "ours_tok_s": ours.tok_s,
        "layer_split_tok_s": split.tok_s,
        "ratio": ours.tok_s / split.tok_s,
        "cpu_only_tok_s": cpu_pred.tok_s,
        "host_scale": host_scale,
        "split_layers": n_split,
        "sync_fit_s": fit / n_split if n_split else None,
        "host_gbps": host,
        "device_gbps": a.device_bandwidth,
        "policy": plan.choice["policy"],
        "placed": plan.device_bytes > 0,
        "sync_s": sync,
    }


def run_model(kind: str, a, G, dev) -> dict:
    from powerinfer_backend.hybrid.placement import full_device_bytes

    shape = (
        dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_vocab=512)
        if a.small
        else dict(n_layer=a.layers, n_embd=4096, n_ff=11008, n_head=32, n_vocab=32000)
    )
    path = build_model(Path(a.dir), kind, shape, a.quant)
    sizes = sizes_of(path)
    full = full_device_bytes(sizes, a.ctx, a.batch)
    tokens = [int(t) for t in np.random.default_rng(1).integers(1, shape["n_vocab"], max(a.n_prefill, a.n_check))]
    sidecar, freq = None, None
    if kind == "relu":
        from relu_decode import make_sidecar

        from powerinfer_backend.sparsity.sidecar import read_sidecar

        sidecar = path.with_suffix(f".sparse{a.sparsity:g}-{a.threshold_on}.gguf")
        make_sidecar(path, sidecar, a.sparsity, a.threads, threshold_on=a.threshold_on)
        freq = read_sidecar(sidecar, model_path=path).neuron_freq
    r: dict = {"model": str(path), "kind": kind, "quant": a.quant, **shape, "full_device_bytes": full}
    cpu = open_llm(path, a, device="cpu", sparse="exact")
    ref = logits_of(cpu, tokens[: a.n_check])
    cpu.close()
    del cpu
    gc.collect()
    r["budgets"] = []
    for f in a.fractions:
        log(f"{kind}: logits and memory at {f:.0%} of {full} B")
        r["budgets"].append({"fraction": f, **check_budget(path, a, G, dev, int(f * full), ref, tokens[: a.n_check])})
    log(f"{kind}: CPU-only speeds")
    sparse = str(sidecar) if sidecar else "auto"
    r["cpu"] = {
        "ours": speed_ours(path, a, "ours_cpu", sparse, dict(device="cpu"), tokens),
        # op_offload off: a GPU build otherwise runs big batches on the GPU with no layer there
        "llama_cpp": llama_speed(path, a, G, dev, 0, tokens, op_offload=False),
    }
    r["speeds"] = []
    for f in a.budget_fraction:
        budget = int(f * full)
        log(f"{kind}: speed at {f:.0%} ({budget} B)")
        sp = {"fraction": f, "budget": budget, **speed(path, a, G, dev, sizes, budget, sparse, tokens)}
        if a.device_bandwidth:
            sp["predicted"] = predicted(path, a, sizes, budget, freq, sp, r["cpu"]["ours"])
        r["speeds"].append(sp)
    if kind == "relu" and not a.no_skips:
        log(f"{kind}: the device skipping what random predictors leave out, at {a.budget_fraction[-1]:.0%}")
        r["skips"] = check_skips(path, a, a.budget_fraction[-1], tokens)
    return r


def check_skips(path: Path, a, fraction: float, tokens: list[int]) -> dict:
    """The device skipping the hot neurons a predictor leaves out (``device_skips``) on the
    ReLU model with random rank-256 Q8_0 predictors at density 0.1 (bench/device_skips.py's
    setup), the neuron plan at ``fraction`` of the full device bytes: teacher-forced logits of
    the prompt (a batch, then 8 tokens alone) against the CPU engine with the same predictors,
    and decode tok/s, the device computing every hot neuron or only the selected ones.
    Reported, not a pass/fail check (random predictors: scores near a threshold move with the
    device's rounding); an exception is reported as ``error``."""
    from device_skips import decode_rate, placed_contexts
    from predictor_decode import predictor_context

    from powerinfer_backend.engine.native import NativeModel
    from powerinfer_backend.hybrid.devices import open_device
    from powerinfer_backend.hybrid.devices import resolve_device as resolve
    from powerinfer_backend.loader import load_gguf

    g = load_gguf(str(path), verbose=False)
    m = NativeModel(g)
    dev = open_device(resolve(a.device), a.device_threads)
    n_ctx = a.n_decode + 48
    out: dict = {"fraction": fraction}
    made: dict = {"contexts": {}}
    try:
        made = placed_contexts(m, g, dev, [fraction], density=0.1, threads=a.threads, n_ctx=n_ctx)
        cpu, _ = predictor_context(m, g, density=0.1, rank=256, pred_type="q8_0", threads=a.threads, n_ctx=n_ctx)
        seq = made["prompt"] + [int(t) for t in tokens[:8]]

        def forced(ctx) -> np.ndarray:
            ctx.truncate(0)
            rows = [ctx.eval(seq[:32], logits_all=True)] + [ctx.eval([t], logits_all=True) for t in seq[32:]]
            return np.concatenate(rows)

        ref = forced(cpu)
        cpu.close()
        for (_, skips), (ctx, plan) in made["contexts"].items():
            key = "skips" if skips else "every_hot"
            out[key] = compare(ref, forced(ctx))
            ctx.ffn_stats(reset=True)
            out[key]["decode_tok_s"] = decode_rate(ctx, made["prompt"], a.n_decode)
            used, total = ctx.ffn_stats(reset=False)
            out[key]["ffn_rows_computed"] = used / max(1, total)
            out["hot_neurons"] = sum(L.n_hot for L in plan.layers)
    except Exception as e:  # reported: the validation's other results stand
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        for ctx, _ in made["contexts"].values():
            ctx.close()
        dev.close()
        m.close()
    return out


def format_table(res: dict) -> str:
    lines = [
        f"device {res['device']['name']} ({res['device']['description']}), ggml {res['ggml_version']}",
        f"{'model':8s} {'budget':>7s} {'max|dlogit|':>11s} {'top1':>6s} {'top1@m':>7s} {'reserved MiB':>12s} "
        f"{'alloc MiB':>10s}  ok",
    ]
    for m in res["models"]:
        for b in m["budgets"]:

            def mib(x):
                return f"{x / 2**20:.1f}" if isinstance(x, (int, float)) else "?"

            lines.append(
                f"{m['kind']:8s} {b['fraction']:6.0%} {b['max_abs_diff']:11.4f} {b['top1_agree']:6.3f} "
                f"{b['top1_agree_margin']:7.3f} {mib(b['reserved']):>12s} {mib(b['allocated']):>10s}  "
                f"{'yes' if b['ok'] else 'NO'}"
            )
    lines.append(f"{'model':8s} {'engine':24s} {'decode tok/s':>12s} {'prefill tok/s':>13s}")
    gpu = res["device"]["type"] != "cpu"
    for m in res["models"]:
        rows = [("ours CPU", m["cpu"]["ours"]), ("llama.cpp CPU", m["cpu"]["llama_cpp"])]
        for s in m["speeds"]:
            lc = s["llama_cpp_layers"]
            rows += [
                (f"ours on {res['device']['name']} {s['fraction']:.0%}", s["ours"]),
                *([(f"ours neurons {s['fraction']:.0%}", s["ours_neurons"])] if "ours_neurons" in s else []),
                (f"llama.cpp -ngl {lc['n_gpu_layers']}" + (f" {lc['allocated'] / 2**20:.0f}MiB" if gpu else ""), lc),
            ]
        for label, r in rows:
            lines.append(f"{m['kind']:8s} {label:24s} {r['decode_tok_s']:12.2f} {r['prefill_tok_s']:13.2f}")
        for s in m["speeds"]:
            p = s.get("predicted")
            fit = p and p["sync_fit_s"]
            lines.append(
                f"{m['kind']:8s} {s['fraction']:.0%}: ours / layer split: decode {s['decode_ratio']:.2f}x, prefill "
                f"{s['prefill_ratio']:.2f}x"
                + (f"; predicted decode {p['ratio']:.2f}x" if p else "")
                + (
                    f"; round trip per split layer ~{fit * 1e6:.0f} us ({p['split_layers']} split)"
                    if fit is not None and fit > 0
                    else "; no round trip measurable (the fit is <= 0: noise, or the model's error)"
                    if fit is not None
                    else ""
                )
            )
    for m in res["models"]:
        sk = m.get("skips")
        if sk and "error" in sk:
            lines.append(f"{m['kind']:8s} device_skips at {sk['fraction']:.0%}: {sk['error']}")
        elif sk:
            lines.append(
                f"{m['kind']:8s} predictors at {sk['fraction']:.0%} ({sk['hot_neurons']} hot): "
                + "; ".join(
                    f"{k} {sk[k]['decode_tok_s']:.2f} tok/s, rows {sk[k]['ffn_rows_computed']:.1%}, "
                    f"vs CPU max|dlogit| {sk[k]['max_abs_diff']:.3f} top1 {sk[k]['top1_agree']:.3f}"
                    for k in ("every_hot", "skips")
                )
            )
    lines.append(
        f"goal (ReLU decode >= {res['goal']['min_ratio']}x at {res['goal']['fraction']:.0%}): "
        f"{'met' if res['goal']['met'] else 'NOT met'}; all checks {'passed' if res['ok'] else 'FAILED'}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    from powerinfer_backend.server.arg_types import number

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device",
        default="cuda",
        help="Llama(device=...) name: cuda, metal, vulkan, hip, a ggml device name (CUDA0), or ggml-cpu (default cuda)",
    )
    ap.add_argument("--small", action="store_true", help="tiny shapes (2 layers, n_embd 256): a smoke check")
    ap.add_argument("--layers", type=int, default=8, help="layers of the 7B-shaped models (default 8)")
    ap.add_argument("--quant", choices=("Q4_0", "Q4_K_M"), default="Q4_0")
    ap.add_argument(
        "--budget-fraction",
        type=float,
        nargs="+",
        default=[0.25, 0.5],
        help="budgets of the speed comparison, fractions of the model's full device bytes (default 0.25 0.5; "
        "the goal is checked at the first)",
    )
    ap.add_argument(
        "--fractions",
        type=float,
        nargs=3,
        default=(0.1, 0.25, 0.5),
        help="the three budgets of the logits and memory checks (default 0.1 0.25 0.5)",
    )
    ap.add_argument("--sparsity", type=float, default=0.9, help="ReLU model: fraction of neurons skipped")
    ap.add_argument(
        "--threshold-on",
        choices=("product", "gate"),
        default="product",
        help="ReLU model's thresholds: on |h| (default; what the device split takes) or on the gate "
        "(CATS; refused with a device today, then the run falls back to exact)",
    )
    # defaults (full / --small): see _DEFAULTS
    ap.add_argument("--ctx", type=int, default=None, help="n_ctx (default 512 / 128)")
    ap.add_argument("--batch", type=int, default=None, help="n_batch, the prefill batch (default 128 / 32)")
    ap.add_argument("--n-check", type=int, default=None, help="tokens of the logits check (default 32 / 16)")
    ap.add_argument("--n-decode", type=int, default=None, help="decoded tokens (default 32 / 8)")
    ap.add_argument("--n-prefill", type=int, default=None, help="prefill tokens (default 128 / 32)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per speed measurement, best kept (2 / 1)")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="CPU threads (both engines)")
    ap.add_argument("--device-threads", type=int, default=1, help="ggml-cpu: the device's threads")
    ap.add_argument(
        "--mem-slack",
        type=int,
        default=64 << 20,
        help="bytes a GPU's free memory may drop beyond the budget (runtime workspaces; default 64 MiB)",
    )
    ap.add_argument(
        "--device-bandwidth",
        type=number("--device-bandwidth", above=True),
        default=None,
        metavar="GB/s",
        help="also print plan --predict's ratio and the round-trip fit with this device bandwidth "
        "(default: a GPU's from the bandwidth table where it names the GPU; none for ggml-cpu)",
    )
    ap.add_argument(
        "--host-bandwidth",
        type=number("--host-bandwidth", above=True),
        default=None,
        metavar="GB/s",
        help="the host's, where the engine's plan records none (placement auto's choice records its own)",
    )
    ap.add_argument("--dir", default="/tmp/powerinfer-gpu-validate", help="where the model files are made (once)")
    ap.add_argument(
        "--no-skips", action="store_true", help="without the ReLU model's predictor run (device_skips on and off)"
    )
    ap.add_argument("--out", default=None, help="JSON result file")
    ap.add_argument("--models", nargs="+", choices=("relu", "swiglu"), default=("relu", "swiglu"))
    ap.add_argument(
        "--check-args",
        action="store_true",
        help="check the arguments and exit 0 (bench/gpu_run.sh does, before its build)",
    )
    a = ap.parse_args(argv)
    for k, v in _DEFAULTS[a.small].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if not all(0 < f <= 1 for f in [*a.budget_fraction, *a.fractions]):
        ap.error("--budget-fraction and --fractions must be in (0, 1]")
    if a.check_args:
        return 0
    a.n_prefill = min(a.n_prefill, a.batch)
    t0 = time.perf_counter()
    try:
        G, dev = resolve_device(a.device)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    # the device's runtime (a CUDA context, streams) is created now, so that the free-memory
    # differences below count our buffers only
    keep = G.GgmlDevice(dev.name, a.device_threads)
    if a.device_bandwidth is None and dev.type != "cpu":
        from powerinfer_backend.hybrid.placement.bandwidth import gpu_bandwidth

        a.device_bandwidth = gpu_bandwidth(dev.description or dev.name)  # None: not in the table
        log(f"device bandwidth {a.device_bandwidth} GB/s (the table's for {dev.description!r})")
    res = {
        "device": {"name": dev.name, "description": dev.description, "type": dev.type, "total_bytes": dev.total_bytes},
        "ggml_version": G.bind(),
        "args": vars(a).copy(),
        "models": [],
    }
    for kind in a.models:
        res["models"].append(run_model(kind, a, G, dev))
    relu = [m for m in res["models"] if m["kind"] == "relu"]
    res["goal"] = {
        "min_ratio": 3.0,
        "fraction": a.budget_fraction[0],
        "met": bool(relu) and relu[0]["speeds"][0]["decode_ratio"] >= 3.0,
    }
    res["ok"] = all(b["ok"] for m in res["models"] for b in m["budgets"])
    res["seconds"] = time.perf_counter() - t0
    keep.close()
    print(format_table(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
        log(f"wrote {a.out}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
