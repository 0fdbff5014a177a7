"""The package uses llama-cpp-python only through its public API and low-level bindings:
no ``llama_cpp.Llama`` method run on our object, no private attribute of llama_cpp's
modules, classes or objects (tests/llama_cpp_use.py, over every module's AST). Planted
sources show each rule reports."""

from __future__ import annotations

import pytest

from tests.fixtures import ROOT
from tests.llama_cpp_use import check_source, check_tree, llama_cpp_facts

# LlamaGrammar (0.3.x) keeps its GBNF text only in these attributes, with no accessor
ALLOWED = {("powerinfer_backend/text/grammar.py", "_grammar"), ("powerinfer_backend/text/grammar.py", "_root")}


@pytest.fixture(scope="module")
def facts():
    return llama_cpp_facts()


def test_package_and_adapters_use_only_public_llama_cpp(facts):
    found = check_tree(ROOT / "powerinfer_backend", ALLOWED)  # the adapters included
    assert not found, f"{len(found)} private use(s) of llama-cpp-python:\n" + "\n".join(found)


def test_the_allowed_reads_exist():
    """The allowance is for reads that are there (a stale allowance would hide a new one)."""
    found = check_source((ROOT / "powerinfer_backend/text/grammar.py").read_text(), "text/grammar.py")
    assert sorted(f.rsplit(" reads ", 1)[1].split(",")[0] for f in found) == ["_grammar", "_root"]


PLANTED = {
    "unbound method": (
        "import llama_cpp\n\nclass L:\n    def f(self, p):\n"
        "        return llama_cpp.Llama.create_completion(self, p)\n",
        ["5: takes llama_cpp.Llama.create_completion (function) from the class"],
    ),
    "aliased private method": (
        "from llama_cpp.llama import Llama as _L\nX = _L\n\ndef g(o):\n    return X._create_completion(o)\n",
        ["5: takes llama_cpp.Llama._create_completion (function) from the class"],
    ),
    "borrowed classmethod": (
        "from llama_cpp import Llama\n\nclass L:\n    from_pretrained = classmethod(Llama.from_pretrained.__func__)\n",
        ["4: takes llama_cpp.Llama.from_pretrained (classmethod) from the class"],
    ),
    "subclass": (
        "import llama_cpp\n\nclass L(llama_cpp.Llama):\n    def f(self):\n"
        "        return super().create_completion('x')\n",
        ["3: class L derives from llama_cpp.Llama"],
    ),
    "private module": (
        "import llama_cpp\nfrom llama_cpp import _internals\n\ndef f():\n"
        "    return llama_cpp._internals.LlamaSampler()\n",
        [
            "2: imports the private name llama_cpp._internals",
            "5: reads the private _internals of llama_cpp (llama_cpp)",
        ],
    ),
    "object made by llama_cpp": (
        "import llama_cpp\n\nclass T:\n    def __init__(self, p):\n"
        "        self.m = llama_cpp.Llama(model_path=p, vocab_only=True)\n"
        "        self.v = getattr(self.m, '_vocab_thing')\n",
        ["6: reads the private _vocab_thing of llama_cpp.Llama() (llama_cpp)"],
    ),
    "private name on anything": (
        "def f(llm):\n    return llm._scores[-1], llm._is_public_here\n",
        ["2: reads _scores, a private attribute of llama-cpp-python's classes"],
    ),
}


@pytest.mark.parametrize("case", PLANTED)
def test_planted_violation_is_reported(facts, case):
    src, want = PLANTED[case]
    got = [f[len("planted.py:") :] for f in check_source(src, "planted.py", facts)]
    assert len(got) == len(want) and all(g.startswith(w) for g, w in zip(got, want)), got


def test_public_uses_are_not_reported(facts):
    src = (
        "import llama_cpp\nfrom llama_cpp import Llama, LlamaGrammar\n\nclass Ours:\n"
        "    def __init__(self, p):\n        self._seed = 1\n        self.m = Llama(model_path=p)\n"
        "        v = llama_cpp.llama_model_get_vocab(self.m.model)\n"
        "        self.n = Llama.longest_token_prefix([1], [1])\n"
        "        self.g = LlamaGrammar.from_string('root ::= \"a\"')\n"
    )
    assert check_source(src, "ok.py", facts) == []
