"""Fidelity of partial placements against llama.cpp: SmolLM2 (or --model) on ggml's CPU backend as
the device at fractions of its full device bytes, teacher-forced over llama.cpp's greedy
continuations (llama-cpp-python, same file, plain CPU kernels, 2 threads) of held-back prompts;
per configuration the top-1 differences from llama.cpp where llama.cpp's top-2 logit margin is
>= --margin, for the CPU engine (dense, and every layer over the split's CPU arithmetic) and for
each placement. Switches, one at a time: --flash (the device's attention through ggml's flash
attention, as before ggml's CPU backend defaulted to mul_mat + soft_max), --kv f32 (F32 KV cache,
both engines; the planner sizes the KV as F16, so a placement of an F32 cache is refused).
docs/placement.md ("Accuracy") has the results:

    python bench/partial_fidelity.py [--text-file TXT] [--fracs 0.1 0.25 0.5] [--placements neurons auto] [--flash]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from tests.fixtures.teacher_forced import (  # noqa: E402
    confident_diffs,
    llama_cpp_greedy,
    summary,
    teacher_forced,
)

from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.hybrid import placement as P  # noqa: E402
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device  # noqa: E402
from powerinfer_backend.hybrid.offload import offload, split_arithmetic  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402
from powerinfer_backend.plugins.reference import load_reference  # noqa: E402
from powerinfer_backend.sparsity import modes as sparsity  # noqa: E402

PROMPTS = (
    "The history of the Roman Empire",
    "Here is a recipe for a simple tomato soup:",
    "import numpy as np\n\ndef normalize(",
    "The three laws of thermodynamics state that",
    "Dear hiring manager, I am writing to",
)


TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def _text_prompts(n: int, path: Path = TEXT) -> tuple:
    """``n`` held-back prompts: the first 60 characters of evenly spaced speeches in the last 10%
    of tinyshakespeare (calibration reads the start of a text)."""
    if n == 0:
        return ()
    text = path.read_text()
    paras = [p for p in text[int(len(text) * 0.9) :].split("\n\n")[1:] if len(p) > 80]
    return tuple(paras[i * len(paras) // n][:60] for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--fracs", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    ap.add_argument("--mib", type=float, nargs="*", default=[], help="budgets in MiB (besides --fracs)")
    ap.add_argument("--placements", nargs="+", default=["neurons", "auto"])
    ap.add_argument("--text", type=int, default=15, help="this many more prompts from tinyshakespeare's last 10%%")
    ap.add_argument("--text-file", type=Path, default=TEXT)
    ap.add_argument("--n-gen", type=int, default=36)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--margin", type=float, default=0.1)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16")
    ap.add_argument("--skip-cpu", action="store_true", help="no CPU engine runs (the switches leave them as they are)")
    ap.add_argument("--flash", action="store_true")
    a = ap.parse_args()
    if a.flash:
        os.environ["POWERINFER_GGML_FLASH_ATTN"] = "1"
    path = a.model or str(default_model_path())
    r = load_reference(
        path, extra_buffer_types=False, n_ctx=a.n_ctx, n_batch=a.n_ctx, n_threads=a.threads,
        n_threads_batch=a.threads, logits_all=True, verbose=False,
    )  # fmt: skip
    prompts = [r.tokenize(p.encode()) for p in PROMPTS + _text_prompts(a.text, a.text_file)]
    runs = [llama_cpp_greedy(r, p, a.n_gen) for p in prompts]
    r.close()
    seqs, ref = [s for s, _ in runs], [summary(lg, s) for s, lg in runs]
    n_pos = sum(len(s) - 1 for s in seqs)
    n_sure = sum(int((m >= a.margin).sum()) for _, m, _ in ref)
    print(f"{len(seqs)} sequences, {n_pos} positions, {n_sure} with llama.cpp's margin >= {a.margin}")

    g = load_gguf(path, verbose=False)
    model = NativeModel(g)

    def ctx_of():
        return NativeContext(model, n_ctx=a.n_ctx, n_batch=a.n_batch, n_threads=a.threads, kv_f16=a.kv == "f16")

    def report(name, ours):
        d = confident_diffs(ours, ref, a.margin)
        print(f"{name:28s} {len(d)} confident top-1 differences {[m for _, _, m in d]} at {[(k, i) for k, i, _ in d]}")

    for name in () if a.skip_cpu else ("dense", "split"):
        ctx = ctx_of()
        if name == "split":
            split_arithmetic(ctx)
        report(f"CPU engine {name}", [teacher_forced(ctx, s, len(p)) for s, p in zip(seqs, prompts)])
        ctx.close()
    ctx = ctx_of()
    with open_device(resolve_device("ggml-cpu")) as dev:
        sizes = P.ModelSizes.from_gguf(g)
        full = P.full_device_bytes(sizes, a.n_ctx, a.n_batch, DeviceSizer(dev, ctx))
    ctx.close()
    print(f"full device bytes {full / 2**20:.1f} MiB")
    for budget in [int(full * f) for f in a.fracs] + [int(m * 2**20) for m in a.mib]:
        for placement in a.placements:
            ctx = ctx_of()
            sparsity.configure(ctx, g, path, "auto")
            off = offload(
                ctx, path, vram_budget=f"{budget}B", device="ggml-cpu", placement=placement,
                device_threads=a.threads,
            )  # fmt: skip
            plan = off.plan
            what = "CPU only" if plan is None else (
                f"{sum(L.attn_on_device for L in plan.layers)} attn, hot {plan.hot_fraction:.3f}, "
                f"{sum(0 < L.n_hot < sizes.n_ff for L in plan.layers)} split"
            )  # fmt: skip
            res = [teacher_forced(ctx, s, len(p)) for s, p in zip(seqs, prompts)]
            ctx.close()
            off.close()
            report(f"{budget / full:.2f} {budget / 2**20:.0f} MiB {placement} ({what})", res)
    model.close()


if __name__ == "__main__":
    main()
