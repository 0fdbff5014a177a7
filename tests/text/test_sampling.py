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
    r = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "GGML_NO_BACKTRACE": "1"})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "ValueError: no token can be sampled" in r.stdout and "masked the whole vocabulary" in r.stdout
