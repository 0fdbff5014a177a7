"""GBNF grammars for llama.cpp's grammar sampler: our :class:`Grammar` (text and root
rule), made from GBNF text, a JSON schema, or a caller's ``llama_cpp.LlamaGrammar``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar: ``gbnf`` (the rules, UTF-8 text) and ``root`` (the start rule)."""

    gbnf: str
    root: str = "root"

    @classmethod
    def from_json_schema(cls, schema: Any) -> "Grammar":
        """The grammar of JSON documents valid under ``schema`` (a dict or its JSON text),
        by llama-cpp-python's public schema converter."""
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        return cls(json_schema_to_gbnf(schema if isinstance(schema, str) else json.dumps(schema)))


def as_grammar(grammar: Any) -> Optional[Grammar]:
    """``grammar`` as a :class:`Grammar`: None, a :class:`Grammar`, GBNF text, or a
    ``llama_cpp.LlamaGrammar``.

    Raises:
        TypeError: anything else.
    """
    if grammar is None or isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, str):
        return Grammar(grammar)
    from llama_cpp import LlamaGrammar

    if isinstance(grammar, LlamaGrammar):
        # LlamaGrammar (0.3.x) keeps its text only in these two attributes and offers no
        # accessor: the one private read of llama-cpp-python in the package, allowed by
        # name in tests/test_no_private_llama_cpp.py
        return Grammar(grammar._grammar, grammar._root)
    raise TypeError(f"grammar must be a Grammar, GBNF text or a llama_cpp.LlamaGrammar, got {type(grammar).__name__}")


def grammar_sampler(grammar: Grammar, vocab):
    """A new llama.cpp grammar sampler (``llama_sampler_p``; the caller frees or chains it)
    for ``vocab`` (a ``llama_vocab_p``).

    Raises:
        ValueError: llama.cpp cannot parse the grammar (it returns no sampler).
    """
    import llama_cpp

    smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.gbnf.encode("utf-8"), grammar.root.encode("utf-8"))
    if not smpl:
        raise ValueError("invalid grammar: llama.cpp cannot parse it")
    return smpl


def check_grammar(grammar: Grammar, vocab) -> None:
    """Parse ``grammar`` once with llama.cpp (and free it).

    Raises:
        ValueError: llama.cpp cannot parse it.
    """
    import llama_cpp

    llama_cpp.llama_sampler_free(grammar_sampler(grammar, vocab))
