"""Request fields to generation arguments: sampling parameters, logit bias, grammars and
response formats as llama-cpp-python takes them, each checked first (an
:class:`APIError` 400, never a crash in llama.cpp)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from .errors import APIError


def logit_bias(d: Optional[Dict[str, float]], n_vocab: int) -> Optional[Dict[int, float]]:
    """OpenAI's ``{"token id": bias}`` as ``{id: bias}``; ``None`` when empty."""
    if not d:
        return None
    out = {}
    for k, v in d.items():
        try:
            tok = int(k)
        except ValueError:
            raise APIError(400, f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
        if not 0 <= tok < n_vocab:
            raise APIError(400, f"logit_bias: token id {tok} out of range [0, {n_vocab})", param="logit_bias")
        out[tok] = float(v)
    return out


def parse_grammar(text: Optional[str], llm, schema: Optional[dict] = None):
    """A :class:`~powerinfer_backend.text.grammar.Grammar` from GBNF text (or a JSON
    schema), parsed once here by llama.cpp: a grammar it cannot parse fails the request
    before it takes a slot."""
    if not text and not schema:
        return None
    from ..text.grammar import Grammar, check_grammar

    param = "grammar" if text else "json_schema"
    try:
        g = Grammar(text) if text else Grammar.from_json_schema(schema)
        check_grammar(g, llm.vocab)
    except Exception as e:
        msg = str(e)
        raise APIError(
            400, msg if msg.startswith("invalid grammar") else f"invalid grammar: {msg}", param=param
        ) from None
    return g


def check_finite(**values) -> None:
    """Raises APIError(400) for a value (keyword: field name) that is inf or NaN."""
    for k, v in values.items():
        if v is not None and not math.isfinite(v):
            raise APIError(400, f"{k} must be a finite number, got {v}", param=k)


def check_token_ids(ids, n_vocab: int, what: str = "token id", param: Optional[str] = None) -> None:
    """Raises APIError(400) naming the first id outside [0, n_vocab) (llama.cpp would
    abort the process on it); ``param``: the request field holding them."""
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise APIError(400, f"{what} {bad[0]} out of range [0, {n_vocab})", param=param)


def sampling(b, llm, n_vocab: int) -> dict:
    """The ``create_completion`` / ``create_chat_completion`` keywords of a
    :class:`~.schemas.CompletionBody` or :class:`~.schemas.ChatBody` (only ``n=1``)."""
    check_finite(
        temperature=b.temperature,
        top_p=b.top_p,
        min_p=b.min_p,
        typical_p=b.typical_p,
        frequency_penalty=b.frequency_penalty,
        presence_penalty=b.presence_penalty,
        repeat_penalty=b.repeat_penalty,
    )
    if b.n != 1:
        raise APIError(400, f"n={b.n}: only n=1 is supported", param="n")
    return dict(
        temperature=b.temperature,
        top_p=b.top_p,
        min_p=b.min_p,
        typical_p=b.typical_p,
        top_k=b.top_k,
        stop=b.stop or [],
        frequency_penalty=b.frequency_penalty,
        presence_penalty=b.presence_penalty,
        repeat_penalty=b.repeat_penalty,
        seed=b.seed,
        mirostat_mode=b.mirostat_mode,
        mirostat_tau=b.mirostat_tau,
        mirostat_eta=b.mirostat_eta,
        logit_bias=logit_bias(b.logit_bias, n_vocab),
        grammar=parse_grammar(b.grammar, llm),
    )


def response_format(rf):
    """OpenAI's ``response_format`` as llama-cpp-python's chat completion takes it
    (``json_schema`` becomes ``json_object`` with a schema; ``text`` is none)."""
    if rf is None:
        return None
    t = rf.get("type")
    if t == "json_schema":  # OpenAI's newer shape: {"type": "json_schema", "json_schema": {"schema": ...}}
        js = rf.get("json_schema") or {}
        return {"type": "json_object", "schema": js.get("schema", js)}
    if t in ("json_object", "text"):
        return None if t == "text" else rf
    raise APIError(400, f"response_format type {t!r} is not supported", param="response_format")


def dumped(value):
    """A request model (or a list of them) as the plain JSON value the client sent
    (fields it left out stay out), for llama-cpp-python, which takes dicts."""
    if isinstance(value, list):
        return [dumped(v) for v in value]
    dump = getattr(value, "model_dump", None)
    return dump(by_alias=True, exclude_unset=True) if dump is not None else value


def functions(defs, tools: bool = True) -> Optional[List[Dict[str, Any]]]:
    """``tools`` (or, ``tools=False``, the legacy ``functions``) as llama-cpp-python
    takes them: a function left without ``parameters`` gets OpenAI's meaning of that, no
    parameters (llama-cpp-python's handlers read the key)."""
    out = dumped(defs)
    for d in out or ():
        f = d["function"] if tools else d
        if f.get("parameters") is None:
            f["parameters"] = {"type": "object", "properties": {}}
    return out
