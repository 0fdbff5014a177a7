"""text/sampling.py: llama.cpp's sampler chain over our logits."""

import subprocess
import sys
import textwrap

from tests.fixtures import ROOT

# a child process: without the guard llama.cpp's grammar throws through its C API and the
# process aborts (exit 134), which must not take the test runner down with it
_CHILD = textwrap.dedent("""
    import sys
    from llama_cpp import LlamaGrammar
    from powerinfer_backend import Llama
    from tests.fixtures.tiny_gguf import write_tiny_llama
    path = write_tiny_llama(sys.argv[1] + "/tiny.gguf", n_vocab=64)
    llm = Llama(path, n_ctx=64, n_threads=1, verbose=False)
    grammar = LlamaGrammar.from_string('root ::= "{"', verbose=False)  # no token holds "{"
    try:
        llm("the", max_tokens=4, grammar=grammar, temperature=0.0)
    except ValueError as e:
        print("ValueError:", e)
""")


def test_grammar_without_a_possible_token_raises_value_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "GGML_NO_BACKTRACE": "1"},
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "ValueError: no token can be sampled" in r.stdout and "masked the whole vocabulary" in r.stdout


def _greedy_pair(n_vocab, processors):
    """A greedy sampler that may take the argmax shortcut and one that always runs the chain."""
    from powerinfer_backend.text.sampling import ChainSampler, SamplingParams, TokenDataBuffer, build_chain

    p = SamplingParams(temp=0.0, logits_processor=processors)
    fast, slow = (
        ChainSampler(
            p, build_chain(p, seed=1, n_vocab=n_vocab, vocab=None, penalty_last_n=64), TokenDataBuffer(n_vocab)
        )
        for _ in range(2)
    )
    slow.argmax_exact = False
    return fast, slow


def test_greedy_with_processors_takes_the_chains_token():
    import numpy as np
    import pytest

    from powerinfer_backend.text.sampling import LogitBias

    n = 4096
    rng = np.random.default_rng(0)
    bias = LogitBias({5: 1.0, 9: -100.0, 4000: 0.37})
    fast, slow = _greedy_pair(n, [bias, lambda ids, s: np.where(np.arange(n) % 7 == 0, s + 1.0, s)])
    ids = np.arange(8, dtype=np.intc)
    for _ in range(20):  # small integer logits: many ties at the maximum (the first one wins)
        logits = rng.integers(0, 4, n).astype(np.float32)
        assert fast.sample(logits, ids) == slow.sample(logits, ids)
    logits = rng.standard_normal(n).astype(np.float32)
    logits[4000] = logits.max() + 2.0  # above every other token after both processors
    assert fast.sample(logits, ids) == slow.sample(logits, ids) == 4000
    assert fast.buffer.array.selected == -1  # the shortcut: llama.cpp's chain never ran
    # in place or copied, the bias gives the same float32 values as llama-cpp-python's processor
    inplace = logits.copy()
    bias.add_inplace(inplace)
    assert np.array_equal(bias(ids, logits), inplace) and inplace[4000] == np.float32(0.37 + logits[4000])
    masked, _ = _greedy_pair(n, [lambda ids, s: np.full_like(s, -np.inf)])
    with pytest.raises(ValueError, match="masked the whole vocabulary"):
        masked.sample(logits, ids)
