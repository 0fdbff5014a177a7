"""Per-layer hybrid FFN on a GPU (issue 6): CUDA hot rows + CPU cold neurons vs CPU only.

What it does, in one process, printing one JSON summary on stdout (progress on stderr):
 1. builds the library with CUDA (``POWERINFER_CUDA=1 python3 setup.py build_ext
    --inplace``, archs from POWERINFER_CUDA_ARCHS, default 90 here) unless --no-build;
 2. writes a synthetic llama-shaped ReLU GGUF (random Q4_0 weights; default TinyLlama
    1.1B shape: 22 layers, n_embd 2048, n_ff 5632, 32 heads, 4 KV heads), marked
    ``powerinfer.ffn_act = "relu"`` (h = relu(gate x) * up x);
 3. runs 64 prompt tokens on the CPU engine, recording each layer's |h| histogram and
    its normed FFN inputs x; per layer the threshold on |h| that drops --sparsity (0.9)
    of the activations, and each neuron's firing frequency;
 4. places FFN rows only (the device runs only FFNs here): neurons ranked by frequency
    across all layers, as many as fit --budget-frac (0.25) of the model file's bytes,
    counted with the CUDA device's own accounting (cuda_ffn_bytes, scratch included) and
    a margin (4 MiB at most) for the allocator's granularity;
 5. on the CUDA device: measures context + workspace memory at start-up, uploads every
    layer's hot rows, checks the memory measured after the uploads (cudaMemGetInfo) is
    within the budget, compares each layer's hybrid output with the CPU-only sparse FFN
    (same thresholds; 8 captured tokens) and the GPU partial with the CPU-only sum of the
    same hot rows, checks reruns are bit-identical;
 6. times decode-shaped (1 token) and 8-token FFN passes over all layers: hybrid vs
    CPU-only, both with --threads CPU threads, best of --repeats; also the GPU half alone;
 7. a kernel matrix on a small random layer: every gate/up type (Q4_0, Q4_1, Q8_0, F16,
    F32) x FFN form (SwiGLU, GeGLU, ReLU, dReLU) x (max_tok, n_tok) in (1,1), (4,3),
    (16,16): GPU partial vs the CPU-only sum of the same rows, reruns bit-identical.
"ok" in the summary is correctness + memory within budget + the kernel matrix.
Whole-model execution on the device is not wired yet (docs/placement.md), so there are
no logits here: the comparison is per layer, on the layer inputs of a real CPU forward.

Running it on the GPU machine with the ``run`` device tool (one H200, no package
registry, at most 64 MiB carried; the run takes about 3-5 minutes):

  here, once: put wheels for the device machine's Python into .wheels/ (ignored by git;
  about 20 MiB), e.g. for Python 3.X:
      python3 -m pip download --only-binary=:all: --platform manylinux2014_x86_64 \\
          --platform manylinux_2_28_x86_64 --python-version 3.X --no-deps -d .wheels \\
          cffi pycparser gguf pyyaml numpy setuptools tqdm
  then:
      run(command="python3 bench/gpu_hybrid.py --out $OUT/gpu_hybrid.json",
          carry=[".wheels"], timeout_s=540)

The script extracts the wheels of missing modules from .wheels/ into .pydeps/ (ignored by
git) before anything else; they must match the device machine's Python (a mismatch is
refused with a message). The source tree travels by itself; the package's ``__init__``
(the llama-cpp-python compatible ``Llama``) is bypassed, so llama-cpp-python is not
needed there. Without nvcc or Python headers on that machine, build both libraries here
(``POWERINFER_CUDA=1 POWERINFER_CUDA_ARCHS=90 python3 setup.py build_ext --inplace``;
the extension is abi3, the CUDA runtime static) and run with --no-build, carrying them
too (about 2 MiB):

      run(command="python3 bench/gpu_hybrid.py --no-build --out $OUT/gpu_hybrid.json",
          carry=[".wheels", "powerinfer_backend/_native/_pi_native.abi3.so",
                 "powerinfer_backend/_native/libpi_cuda.so"], timeout_s=540)

``--device cpu-device`` runs the same pipeline on the CPU test device (a dry run of
everything but CUDA), e.g. ``--layers 2 --device cpu-device --no-build``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPS = ROOT / ".pydeps"
WHEELS = ROOT / ".wheels"
_MODULES = {"cffi": "cffi", "pycparser": "pycparser", "gguf": "gguf", "yaml": "pyyaml", "numpy": "numpy",
            "setuptools": "setuptools", "tqdm": "tqdm"}


def log(msg: str) -> None:
    print(f"[gpu_hybrid {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_deps() -> None:
    """Missing modules from the carried wheels (no registry on the GPU machine). A wheel
    is a zip of the installed layout, so extracting it into .pydeps/ and putting that
    on sys.path is an install (no pip needed; compiled modules such as cffi's load
    from there too)."""
    import zipfile

    DEPS.mkdir(exist_ok=True)
    sys.path.insert(0, str(DEPS))
    importlib.invalidate_caches()
    missing = [(mod, dist) for mod, dist in _MODULES.items() if importlib.util.find_spec(mod) is None]
    for mod, dist in missing:
        wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
        found = [w for w in wheels if w.name.lower().replace("-", "_").startswith(dist.lower() + "_")
                 or w.name.lower().startswith(dist.lower() + "-")]
        if not found:
            raise SystemExit(f"module {mod} is missing and {WHEELS} has no {dist} wheel (see the docstring)")
        tag = found[-1].name.split("-")[-3]  # name-version-python-abi-platform.whl
        here = f"cp{sys.version_info.major}{sys.version_info.minor}"
        if tag.startswith("cp") and tag != here:
            raise SystemExit(f"{found[-1].name} is for {tag}, this Python is {here}: download the wheels for "
                             f"--python-version {sys.version_info.major}.{sys.version_info.minor} (see the docstring)")
        log(f"installing {found[-1].name} into {DEPS}")
        with zipfile.ZipFile(found[-1]) as z:
            z.extractall(DEPS)
    importlib.invalidate_caches()


def build(archs: str) -> float:
    t = time.perf_counter()
    env = dict(os.environ, POWERINFER_CUDA="1", POWERINFER_CUDA_ARCHS=os.environ.get("POWERINFER_CUDA_ARCHS", archs))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DEPS), env.get("PYTHONPATH", "")) if p)
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"build failed:\n{p.stdout[-6000:]}")
    return time.perf_counter() - t


def import_package():
    """The package's submodules without its __init__ (which imports llama_cpp for ``Llama``)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("powerinfer_backend")
        pkg.__path__ = [str(ROOT / "powerinfer_backend")]
        sys.modules["powerinfer_backend"] = pkg
    sys.path[:0] = [str(ROOT)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer_gpu_bench", help="model and caches")
    ap.add_argument("--out", default=None, help="also write the JSON summary here")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--n-embd", type=int, default=2048)
    ap.add_argument("--n-ff", type=int, default=5632)
    ap.add_argument("--n-head", type=int, default=32)
    ap.add_argument("--n-head-kv", type=int, default=4)
    ap.add_argument("--n-vocab", type=int, default=32000)
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--budget-frac", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", choices=["cuda", "cpu-device"], default="cuda")
    ap.add_argument("--archs", default="90", help="POWERINFER_CUDA_ARCHS for the build (default 90: H100/H200)")
    ap.add_argument("--no-build", action="store_true", help="use the library as built")
    args = ap.parse_args()
    t_start = time.perf_counter()
    summary: dict = {"ok": False, "args": vars(args)}
    ensure_deps()
    if not args.no_build:
        log("building (POWERINFER_CUDA=1)" if args.device == "cuda" else "building")
        if args.device == "cuda":
            summary["build_s"] = round(build(args.archs), 1)
        else:
            subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
    import_package()
    try:
        run(args, summary)
    except BaseException as e:
        summary["error"] = repr(e)
        raise
    finally:
        summary["total_s"] = round(time.perf_counter() - t_start, 1)
        text = json.dumps(summary, indent=1)
        print(text)
        if args.out:
            Path(args.out).write_text(text)


def run(args, summary: dict) -> None:
    import numpy as np
    from gguf import GGMLQuantizationType as T

    from tests.fixtures.tiny_gguf import write_tiny_llama
    from powerinfer_backend import _native
    from powerinfer_backend._native import ffi, lib
    from powerinfer_backend.sparsity.calibrate import fraction_at_or_above, threshold_for_sparsity
    from powerinfer_backend.hybrid.devices.cpu import CpuDevice, ffn_bytes
    from powerinfer_backend.engine.down_cache import transposed_down
    from powerinfer_backend.engine.native import FFN_HIST_BINS, NativeContext, NativeModel
    from powerinfer_backend.loader import load_gguf

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    E, FF, L = args.n_embd, args.n_ff, args.layers
    path = d / f"relu-{L}L-{E}x{FF}-v{args.n_vocab}-q4_0.gguf"
    if not path.exists():
        t = time.perf_counter()
        write_tiny_llama(path, n_vocab=args.n_vocab, n_embd=E, n_ff=FF, n_layer=L, n_head=args.n_head,
                         n_head_kv=args.n_head_kv, n_ctx_train=2048, types={"matrix": T.Q4_0, "token_embd": T.Q4_0},
                         seed=11, extra_kv={"powerinfer.ffn_act": "relu"}, with_tokenizer=False)
        log(f"wrote {path.name} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f} s")
    model_bytes = path.stat().st_size
    summary["model"] = {"path": str(path), "bytes": model_bytes, "n_layer": L, "n_embd": E, "n_ff": FF,
                        "n_vocab": args.n_vocab, "type": "Q4_0", "act": "relu(gate x) * up x"}

    # 3. calibration on the CPU engine: |h| histograms and the layers' normed FFN inputs
    t = time.perf_counter()
    g = load_gguf(str(path), verbose=False)
    nm = NativeModel(g)
    n_cal = 64
    ctx = NativeContext(nm, n_ctx=128, n_batch=n_cal, n_threads=args.threads)
    hist = np.zeros((L, FF, FFN_HIST_BINS), np.uint32)
    cap = np.zeros((L, n_cal, E), np.float32)
    ctx.set_ffn_hist(hist)
    ctx.set_ffn_capture(cap)
    ctx.eval(list(np.random.default_rng(0).integers(1, args.n_vocab, n_cal)))
    ctx.close()
    layer_hist = hist.sum(axis=1)
    thr = np.array([threshold_for_sparsity(layer_hist[i], args.sparsity) for i in range(L)], np.float32)
    freq = np.stack([fraction_at_or_above(hist[i], float(thr[i])) for i in range(L)])
    summary["calibration"] = {"tokens": n_cal, "s": round(time.perf_counter() - t, 1),
                              "threshold_mean": float(thr.mean()), "firing_mean": float(freq.mean())}
    log(f"calibrated in {summary['calibration']['s']} s; mean firing fraction {freq.mean():.3f}")

    # 4. FFN-only placement within the budget, in the device's own byte accounting
    gate_type = g.layer_tensors(0)[6].type
    budget = int(args.budget_frac * model_bytes)
    max_tok = 8
    if args.device == "cuda":
        from powerinfer_backend.hybrid.devices.cuda import CudaDevice, cuda_ffn_bytes

        def layer_bytes(n_hot):
            return cuda_ffn_bytes(gate_type, int(T.F16), E, n_hot, max_tok)
    else:
        def layer_bytes(n_hot):
            return ffn_bytes(gate_type, int(T.F16), E, n_hot, max_tok)
    margin = min(4 << 20, budget // 10)  # cudaMalloc rounds the reservation up to its page size (2 MiB)
    order = np.lexsort((np.arange(L * FF) % FF, np.arange(L * FF) // FF, -freq.reshape(-1)))  # freq desc, ties by layer/id

    def take(k):
        counts = np.bincount(order[:k] // FF, minlength=L)
        return counts, sum(layer_bytes(int(c)) for c in counts)

    lo, hi = 0, L * FF  # largest k whose bytes fit: bytes grow with k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if take(mid)[1] <= budget - margin:
            lo = mid
        else:
            hi = mid - 1
    counts, need = take(lo)
    hot_mask = np.zeros(L * FF, bool)
    hot_mask[order[:lo]] = True
    hot_mask = hot_mask.reshape(L, FF)
    hot_ids = [np.flatnonzero(hot_mask[i]).astype(np.int32) for i in range(L)]
    mass = float((freq * hot_mask).sum() / freq.sum())
    summary["placement"] = {"budget_bytes": budget, "reserve_bytes": need, "hot_neurons": int(lo),
                            "hot_fraction": lo / (L * FF), "firing_mass_on_device": mass,
                            "hot_per_layer_min_max": [int(counts.min()), int(counts.max())]}
    log(f"budget {budget / 2**20:.0f} MiB: {lo} hot neurons ({lo / (L * FF):.1%}), {mass:.1%} of the firing mass")

    # 5. the device: start-up memory, uploads, measured use, correctness
    t = time.perf_counter()
    downs = [np.ascontiguousarray(transposed_down(g, i, dtype="f16", progress=False)) for i in range(L)]
    summary["down_cache_s"] = round(time.perf_counter() - t, 1)
    if args.device == "cuda":
        probe0 = CudaDevice.probe()
        dev = CudaDevice(need, args.threads)
    else:
        probe0 = None
        dev = CpuDevice(need, args.threads)
    s0 = dev.stats()
    t = time.perf_counter()
    ffns = []
    for i in range(L):
        lt = g.layer_tensors(i)
        ffns.append(dev.upload_ffn("relu", gate_type, lt[6].data, lt[7].data, int(T.F16), downs[i], E, FF, hot_ids[i],
                                   max_tok))
    s1 = dev.stats()
    summary["upload_s"] = round(time.perf_counter() - t, 1)
    mem = {"reserved": s1["reserved"], "used": s1["used"], "high_water": s1["high_water"],
           "n_refused": s1["n_refused"]}
    ok_mem = s1["used"] <= need <= budget and s1["high_water"] <= s1["reserved"]
    if probe0 is not None:
        probe1 = CudaDevice.probe()
        measured = s0["free_bytes"] - (probe1["total_bytes"] - probe1["context_bytes"])  # free at start-up - free now
        mem.update({k: s0[k] for k in ("total_bytes", "context_bytes", "workspace_bytes", "free_bytes", "name",
                                       "cc_major", "cc_minor", "runtime_version", "driver_version")})
        mem["measured_device_bytes"] = int(measured)
        ok_mem = ok_mem and measured <= budget
    mem["within_budget"] = bool(ok_mem)
    summary["memory"] = mem
    log(f"uploaded in {summary['upload_s']} s; memory {mem}")

    pool = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(args.threads, pool), "pi_pool_create")
    pool = pool[0]
    gt, ut = [g.layer_tensors(i)[6].data for i in range(L)], [g.layer_tensors(i)[7].data for i in range(L)]

    def cpu_ffn(i, x, ids=None):
        """CPU-only pi_op_ffn_sparse of layer i over ids (None = all neurons) for each row of x."""
        n = x.shape[0]
        y = np.empty((n, E), np.float32)
        if ids is None:
            a, off = ffi.NULL, ffi.NULL
        else:
            a = ffi.from_buffer("int32_t[]", np.tile(ids, n))
            off = ffi.from_buffer("int64_t[]", np.arange(n + 1, dtype=np.int64) * len(ids))
        _native.check(lib.pi_op_ffn_sparse(pool, 2, gate_type, ffi.from_buffer(gt[i]), ffi.from_buffer(ut[i]), E, FF,
                                           int(T.F16), ffi.from_buffer(downs[i]), ffi.from_buffer("float[]", x), n, a,
                                           off, float(thr[i]), ffi.from_buffer("float[]", y), ffi.NULL),
                      "pi_op_ffn_sparse")
        return y

    t = time.perf_counter()
    worst_all = worst_hot = 0.0
    deterministic = True
    for i in range(L):
        x = np.ascontiguousarray(cap[i, :max_tok])
        y, yd = ffns[i].run(x, float(thr[i]), return_device_part=True)
        y2, yd2 = ffns[i].run(x, float(thr[i]), return_device_part=True)
        deterministic &= bool(np.array_equal(y, y2) and np.array_equal(yd, yd2))
        ref = cpu_ffn(i, x)
        scale = float(np.abs(ref).max()) or 1.0
        worst_all = max(worst_all, float(np.abs(y - ref).max()) / scale)
        if len(hot_ids[i]):
            worst_hot = max(worst_hot, float(np.abs(yd - cpu_ffn(i, x, hot_ids[i])).max()) / scale)
    tol = 2e-3  # a neuron within rounding of its threshold may be kept on one side only
    summary["correctness"] = {"tokens_per_layer": max_tok, "max_rel_err_hybrid_vs_cpu": worst_all,
                              "max_rel_err_device_part_vs_cpu_hot": worst_hot, "tolerance": tol,
                              "deterministic_reruns": deterministic,
                              "ok": bool(worst_all <= tol and worst_hot <= tol and deterministic),
                              "s": round(time.perf_counter() - t, 1)}
    log(f"correctness {summary['correctness']}")

    # 6. timing: all layers' FFNs, hybrid vs CPU-only, best of --repeats
    def best(fn):
        fn()  # warm-up
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    timing = {}
    for n_tok in (1, 8):
        xs = [np.ascontiguousarray(cap[i, :n_tok]) for i in range(L)]
        t_cpu = best(lambda: [cpu_ffn(i, xs[i]) for i in range(L)])
        t_hyb = best(lambda: [ffns[i].run(xs[i], float(thr[i])) for i in range(L)])
        timing[f"{n_tok}_tok"] = {"cpu_only_ms": round(1e3 * t_cpu, 3), "hybrid_ms": round(1e3 * t_hyb, 3),
                                  "speedup": round(t_cpu / t_hyb, 3)}
        if args.device == "cuda":  # the GPU half alone (its start, then its wait)
            f_lib, f_ffi = dev._lib, dev._ffi
            outs = [np.empty((n_tok, E), np.float32) for _ in range(L)]

            def gpu_only():
                for i in range(L):
                    f_lib.pi_cuda_ffn_run_async(ffns[i]._ptr, 2, f_ffi.cast("const float *", f_ffi.from_buffer(xs[i])),
                                                n_tok, float(thr[i]))
                    f_lib.pi_cuda_ffn_wait(ffns[i]._ptr, f_ffi.cast("float *", f_ffi.from_buffer(outs[i])),
                                           f_ffi.NULL)
            timing[f"{n_tok}_tok"]["gpu_half_only_ms"] = round(1e3 * best(gpu_only), 3)
        log(f"{n_tok} token(s): {timing[f'{n_tok}_tok']}")
    summary["timing_all_layers_ffn"] = timing
    summary["kernel_matrix"] = kernel_matrix(pool, args.device)
    log(f"kernel matrix: {summary['kernel_matrix']['ok']} ({summary['kernel_matrix']['cases']} cases, worst "
        f"{summary['kernel_matrix']['worst_rel_err']:.2e})")
    summary["stats_after"] = {k: v for k, v in dev.stats().items() if k in ("n_jobs", "rows", "n_refused")}
    dev.close()
    lib.pi_pool_free(pool)
    nm.close()
    summary["ok"] = bool(summary["correctness"]["ok"] and summary["memory"]["within_budget"]
                         and summary["kernel_matrix"]["ok"])


def kernel_matrix(pool, kind: str) -> dict:
    """Every gate/up type x FFN form x (max_tok, n_tok) on a small random layer: the
    device partial vs the CPU-only sum over the same hot rows (threshold 0), and reruns
    bit-identical. What tests/hybrid/devices/test_cuda.py checks, without needing pytest."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    from powerinfer_backend import _native
    from powerinfer_backend._native import ffi, lib
    from powerinfer_backend.hybrid.devices.cpu import CpuDevice

    E, FF = 320, 384
    rng = np.random.default_rng(5)
    worst, fails, cases = 0.0, [], 0
    hot = np.sort(rng.choice(FF, FF // 3, replace=False)).astype(np.int32)
    for gt in (T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.F32):
        g = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
        u = (rng.standard_normal((FF, E)) / 8).astype(np.float32)
        dt = T.F32 if gt == T.F32 else T.F16
        d = (rng.standard_normal((FF, E)) / 8).astype(np.float32 if dt == T.F32 else np.float16)
        if gt == T.F16:
            g, u = g.astype(np.float16), u.astype(np.float16)
        elif gt != T.F32:
            g, u = quants.quantize(g, gt), quants.quantize(u, gt)
        for act, form in (("swiglu", 0), ("geglu", 1), ("relu", 2), ("drelu", 3)):
            for max_tok, n_tok in ((1, 1), (4, 3), (16, 16)):
                cases += 1
                x = rng.standard_normal((n_tok, E)).astype(np.float32)
                ref = np.empty((n_tok, E), np.float32)
                _native.check(lib.pi_op_ffn_sparse(
                    pool, form, int(gt), ffi.from_buffer(g), ffi.from_buffer(u), E, FF, int(dt), ffi.from_buffer(d),
                    ffi.from_buffer("float[]", x), n_tok, ffi.from_buffer("int32_t[]", np.tile(hot, n_tok)),
                    ffi.from_buffer("int64_t[]", np.arange(n_tok + 1, dtype=np.int64) * len(hot)), 0.0,
                    ffi.from_buffer("float[]", ref), ffi.NULL), "pi_op_ffn_sparse")
                if kind == "cuda":
                    from powerinfer_backend.hybrid.devices.cuda import CudaDevice, cuda_ffn_bytes

                    dev = CudaDevice(cuda_ffn_bytes(int(gt), int(dt), E, len(hot), max_tok))
                else:
                    dev = CpuDevice(1 << 22)
                with dev:
                    f = dev.upload_ffn(act, int(gt), g, u, int(dt), d, E, FF, hot, max_tok)
                    _, yd = f.run(x, 0.0, return_device_part=True)
                    _, yd2 = f.run(x, 0.0, return_device_part=True)
                err = float(np.abs(yd - ref).max() / (np.abs(ref).max() or 1.0))
                worst = max(worst, err)
                if err > 1e-4 or not np.array_equal(yd, yd2):
                    fails.append(f"{gt.name}/{act}/{max_tok},{n_tok}: rel err {err:.2e}, "
                                 f"rerun equal {np.array_equal(yd, yd2)}")
    return {"cases": cases, "worst_rel_err": worst, "failures": fails[:20], "ok": not fails}


if __name__ == "__main__":
    main()
