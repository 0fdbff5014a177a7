"""Parity with llama.cpp (llama-cpp-python) on SmolLM2-135M-Instruct Q4_1: same file,
same thread count.

What can be matched is matched bit for bit: activation quantization, the quantized and
F16 dot products, RMSNorm, RoPE, the KV cache and attention sums follow llama.cpp's x86
arithmetic, so the first positions' logits are identical. Two ops cannot be matched
without copying ggml's SIMD exp approximation (up to 2.2 ulp off; 58% of its results
differ from glibc's expf): SiLU and the softmax exp. This model amplifies such 1-ulp
differences chaotically once Q8 activation rounding flips: llama.cpp itself, evaluating
the same tokens one at a time instead of in one batch, agrees with its own top-1 at only
~95% of positions (max |dlogit| ~1.4). The tests therefore compare our disagreement with
llama.cpp against llama.cpp's disagreement with itself, measured in the same run
(docs/parity.md).
"""

import numpy as np
import pytest

from powerinfer_backend import Llama
from powerinfer_backend.plugins.reference import load_reference
from powerinfer_backend.sparsity.perplexity import log_softmax_nll

from tests.fixtures import SHARED_DATA
from tests.fixtures.llama_reference import reference_logits

N_THREADS = 2
SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"
PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
]


needs_text = pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} not found")


@pytest.fixture(scope="module")
def ours(model_path):
    # the file's rows, as the reference's plain kernels (its extra buffer types off); the
    # row groups' order against llama.cpp's repacked one: tests/engine/test_repack.py
    llm = Llama(model_path, n_ctx=512, n_threads=N_THREADS, verbose=False, repack=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ref(model_path):
    llm = load_reference(
        model_path, extra_buffer_types=False, n_ctx=512, n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True
    )
    yield llm
    llm.close()


def _ours_logits(llm, tokens, one_by_one=False):
    be = llm._backend
    be.truncate(0)
    llm._input_ids = []
    if one_by_one:
        return np.stack([be.eval([t])[0].copy() for t in tokens])
    return be.eval(tokens, logits_all=True).copy()


def _margin(row):
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def test_first_positions_bit_identical(ours, ref):
    tokens = ref.tokenize(PROMPTS[0].encode(), special=True)[:2]
    got = _ours_logits(ours, tokens, one_by_one=True)
    expected = reference_logits(ref, tokens, one_by_one=True)
    assert np.array_equal(got, expected), f"max |dlogit| {np.abs(got - expected).max()}"


@needs_text
def test_logits_track_llama_cpp_on_shakespeare(ours, ref):
    text = SHAKESPEARE.read_text()[:4000]
    tokens = ref.tokenize(text.encode(), add_bos=False)[:128]
    batch = reference_logits(ref, tokens)
    seq = reference_logits(ref, tokens, one_by_one=True)
    got = _ours_logits(ours, tokens)
    top1 = float(np.mean(got.argmax(1) == batch.argmax(1)))
    self_top1 = float(np.mean(seq.argmax(1) == batch.argmax(1)))
    delta, self_delta = np.abs(got - batch), np.abs(seq - batch)
    print(f"\nours vs llama.cpp: top-1 {top1:.4f}, max |dlogit| {delta.max():.4f}, mean {delta.mean():.4f}")
    print(
        f"llama.cpp one-by-one vs its batch: top-1 {self_top1:.4f}, max {self_delta.max():.4f}, "
        f"mean {self_delta.mean():.4f}"
    )
    assert np.array_equal(got[0], batch[0]), "position 0 must be bit-identical"
    assert top1 >= min(0.99, self_top1 - 2 / len(tokens))
    assert delta.mean() <= 1.25 * self_delta.mean()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_match_llama_cpp(ours, ref, prompt):
    prompt_tokens = ref.tokenize(prompt.encode(), special=True)
    assert ours.tokenize(prompt.encode(), special=True) == prompt_tokens
    ref.reset()
    expected = []
    for tok in ref.generate(prompt_tokens, temp=0.0, top_k=1, repeat_penalty=1.0):
        expected.append(tok)
        if len(expected) == 64:
            break
    got = []
    for tok in ours.generate(prompt_tokens, temp=0.0, top_k=1, repeat_penalty=1.0):
        got.append(tok)
        if len(got) == 64:
            break
    if got == expected:
        return
    # Teacher-forced along llama.cpp's sequence: at every one of the 64 steps our argmax
    # must equal llama.cpp's token, except at near-ties - positions whose top-2 margin in
    # llama.cpp is below llama.cpp's own batch-vs-decode noise on this same sequence.
    seq = prompt_tokens + expected
    n0 = len(prompt_tokens) - 1
    ref_dec = np.array(ref.scores[n0 : n0 + 64], dtype=np.float32)  # decode-path logits of the greedy run
    ref_batch = reference_logits(ref, seq)[n0 : n0 + 64]
    noise = float(np.quantile(np.abs(ref_dec - ref_batch).max(axis=1), 0.95))
    mine = _ours_logits(ours, seq)[n0 : n0 + 64].argmax(1)
    first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    print(
        f"\nfirst divergence at generated token {first} (llama.cpp margin {_margin(ref_dec[first]):.4f}); "
        f"llama.cpp self-noise (95th pct max |dlogit|) {noise:.4f}"
    )
    bad = []
    for i in np.flatnonzero(mine != np.asarray(expected)):
        m = _margin(ref_dec[i])
        print(f"  step {i}: ours {mine[i]}, llama.cpp {expected[i]}, llama.cpp margin {m:.4f}")
        if m >= noise:
            bad.append(int(i))
    assert not bad, f"disagreements beyond llama.cpp's own noise at steps {bad}"
    assert np.count_nonzero(mine != np.asarray(expected)) <= 3


@needs_text
def test_perplexity_matches_llama_cpp(ours, ref):
    """Within 0.5% of llama.cpp's one-token path (whose arithmetic ours follows, batched or
    not), and of its batched path within 0.5% or 1.25 x its own batched vs one-token
    difference, whichever is larger (0.77% on a Zen 4 AVX-512 host, where its batched
    kernels differ more)."""
    tokens = ref.tokenize(SHAKESPEARE.read_text()[:6000].encode(), add_bos=False)[:256]
    targets = np.asarray(tokens[1:])
    ppl = {
        name: float(np.exp(log_softmax_nll(logits[:-1], targets).mean()))
        for name, logits in (
            ("ours", _ours_logits(ours, tokens)),
            ("llama.cpp", reference_logits(ref, tokens)),
            ("llama.cpp one by one", reference_logits(ref, tokens, one_by_one=True)),
        )
    }
    print(f"\nperplexity over {len(targets)} scored tokens: {ppl}")
    own = abs(ppl["llama.cpp one by one"] / ppl["llama.cpp"] - 1)
    assert abs(ppl["ours"] / ppl["llama.cpp one by one"] - 1) < 0.005
    assert abs(ppl["ours"] / ppl["llama.cpp"] - 1) < max(0.005, 1.25 * own)
