"""Fidelity at partial placement: SmolLM2 Q4_1 on ``device="ggml-cpu"`` at about 10%, 25% and
50% of its full device bytes (placement "neurons": attention blocks, then hot neurons; n_batch
64), teacher-forced over llama.cpp's greedy continuations of prompts of this test's own, has no
more confident top-1 differences from llama.cpp than the CPU engine has on the same tokens, both
measured here. Confident: llama.cpp's own top-2 logit margin at the position is >= 0.1 (the
device parity test's margin floor). llama.cpp runs through llama-cpp-python on the same file,
its plain CPU kernels and 2 threads; its greedy tokens come with the logits it chose them by.
The model is loaded once; n_ctx 2048 so that 10% holds more than the compute buffer.
Measurements and causes: bench/partial_fidelity.py, docs/placement.md ("Accuracy")."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tests.fixtures.teacher_forced import confident_diffs, llama_cpp_greedy, summary, teacher_forced

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device
from powerinfer_backend.hybrid.offload import offload
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.plugins.reference import load_reference
from powerinfer_backend.sparsity import modes as sparsity

PROMPTS = (
    "A lighthouse keeper kept a diary. On the first page he wrote:",
    "The main difference between a list and a tuple in Python is",
    "Photosynthesis converts sunlight into",
    "Ingredients: two eggs, a cup of flour,",
    "The train left the station at noon and",
)
N_GEN = 32
N_CTX, N_BATCH, THREADS = 2048, 64, 2
MARGIN = 0.1  # a difference counts where llama.cpp's top-2 logit margin is at least this


@dataclass
class Smol:
    path: str
    model: NativeModel
    full: int  # full device bytes at N_CTX / N_BATCH
    seqs: list  # prompt + llama.cpp's greedy continuation
    n_prompt: list
    ref: list  # llama.cpp's summary (top1, margin, logprob) per sequence
    cpu: list  # the CPU engine's confident differences from llama.cpp


def _context(model) -> NativeContext:
    return NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS)


def _teacher_forced_all(ctx, s: Smol) -> list:
    return [teacher_forced(ctx, seq, n) for seq, n in zip(s.seqs, s.n_prompt)]


@pytest.fixture(scope="module")
def smol(model_path, tmp_path_factory):
    path = str(model_path)
    r = load_reference(
        path, extra_buffer_types=False, n_ctx=256, n_batch=256, n_threads=THREADS, n_threads_batch=THREADS,
        logits_all=True, verbose=False,
    )  # fmt: skip
    try:
        prompts = [r.tokenize(p.encode()) for p in PROMPTS]
        runs = [llama_cpp_greedy(r, p, N_GEN) for p in prompts]
    finally:
        r.close()
    seqs = [seq for seq, _ in runs]
    ref = [summary(logits, seq) for seq, logits in runs]
    g = load_gguf(path, verbose=False)
    model = NativeModel(g)
    with pytest.MonkeyPatch.context() as mp:  # plans and down_t caches in a private folder
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        ctx = _context(model)
        try:
            with open_device(resolve_device("ggml-cpu")) as dev:
                full = P.full_device_bytes(P.ModelSizes.from_gguf(g), N_CTX, N_BATCH, DeviceSizer(dev, ctx))
            s = Smol(path, model, full, seqs, [len(p) for p in prompts], ref, [])
            s.cpu = confident_diffs(_teacher_forced_all(ctx, s), ref, MARGIN)
        finally:
            ctx.close()
        yield s
    model.close()


@pytest.mark.parametrize("frac", [0.1, 0.25, 0.5])
def test_partial_placement_no_worse_than_cpu_engine(smol, frac):
    ctx = _context(smol.model)
    off = None
    try:
        sparsity.configure(ctx, smol.model.gguf, smol.path, "auto")  # as HybridBackend, then offload
        off = offload(
            ctx, smol.path, vram_budget=f"{int(smol.full * frac)}B", device="ggml-cpu", placement="neurons",
            device_threads=THREADS,
        )  # fmt: skip
        plan = off.plan
        # partial: some attention blocks and hot neurons on the device, some of the model not
        assert plan is not None and any(L.attn_on_device for L in plan.layers)
        assert any(L.n_hot > 0 for L in plan.layers) and plan.hot_fraction < 1.0
        placed = confident_diffs(_teacher_forced_all(ctx, smol), smol.ref, MARGIN)
    finally:
        ctx.close()
        if off is not None:
            off.close()
    n_sure = sum(int((m >= MARGIN).sum()) for _, m, _ in smol.ref)
    assert len(placed) <= len(smol.cpu), (
        f"{frac:.0%} of the device bytes: {len(placed)} confident top-1 differences from llama.cpp "
        f"(sequence, position, llama.cpp margin) {placed}, the CPU engine {len(smol.cpu)} {smol.cpu}, "
        f"over {n_sure} positions with margin >= {MARGIN}"
    )
