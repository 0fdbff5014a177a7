"""The completion runner: one :class:`~.sequence.Sequence` generating after a prompt,
as typed events (:class:`Token`, :class:`Delta`, :class:`Stop`, :class:`Usage`,
:class:`Error`) that the API layers render (``Llama.create_completion`` and its stream,
chat completion through it, the server's routes).

Stop rules are llama-cpp-python's, so renderings equal its results: generation ends at an
end-of-generation token, at the first listed stop string found in the text (the text is
cut before it), after ``max_tokens``, or when ``stopping_criteria`` says so. While the text
ends inside a UTF-8 character (:func:`~.detok.utf8_hold`) no stop is looked for and
nothing is streamed. Streamed text (``stream="chars"``: the shortest token groups that
decode as UTF-8; ``"tokens"``: one delta per token) holds back any tail that could begin a
stop string; what is left is sent when generation ends, cut at a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence as Seq, Union

from .detok import PieceText, decodes, utf8_hold
from .sampling import SamplingParams
from .sequence import Sequence


@dataclass
class Token:
    """A generated token (not an end-of-generation one), ``index`` in the completion."""

    token: int
    index: int


@dataclass
class Delta:
    """Streamed text: ``text`` of completion tokens from ``index`` on (one token,
    ``token``, in ``"tokens"`` mode); ``final``: sent after generation ended (its text is
    decoded leniently, a split character dropped)."""

    text: str
    index: int
    token: int
    final: bool


@dataclass
class Stop:
    """The end: ``reason`` "stop" (end-of-generation token, stop string, stopping
    criteria) or "length"; ``text``: the completion's bytes, cut before a stop string."""

    reason: str
    text: bytes


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Error:
    """Generation failed with ``error`` (the last event)."""

    error: BaseException


Event = Union[Token, Delta, Stop, Usage, Error]


@dataclass
class Request:
    """What to generate. ``completion``: the completion so far (tokens before the first
    generated one; pieces by the caller's tokenizer), ``stops``: UTF-8 stop strings in
    priority order; ``stream``: None, "chars" or "tokens"; ``stopping_criteria(input_ids,
    logits) -> bool``; ``is_eog(token) -> bool``."""

    prompt_tokens: List[int]
    params: SamplingParams
    completion: PieceText
    max_tokens: int
    is_eog: Callable[[int], bool]
    stops: Seq[bytes] = ()
    stream: Optional[str] = None
    stopping_criteria: Optional[Callable] = None


def _held(text: bytes, stops: Seq[bytes]) -> int:
    """Bytes at the end of ``text`` that could begin a stop string (the longest such tail)."""
    held = 0
    for s in stops:
        for i in range(min(len(s), len(text)), 0, -1):
            if text.endswith(s[:i]):
                held = max(held, i)
                break
    return held


def _deltas(c: PieceText, returned: int, stops: Seq[bytes], by_token: bool):
    """Stream what is safe of ``c`` after ``returned`` tokens; returns the new count."""
    rem = c.span(returned)
    budget = len(rem) - _held(rem, stops)
    pos, n = 0, len(c)
    if by_token:
        for k in range(returned, n):
            tok = c.tokens[k]
            if tok == c.bos:
                continue
            piece = c.span(k, k + 1)
            pos += len(piece)
            if pos > budget:
                break
            yield Delta(piece.decode("utf-8", "ignore"), returned, tok, False)
            returned += 1
        return returned
    while returned < n:
        for i in range(1, n - returned + 1):
            piece = c.span(returned, returned + i)
            text = decodes(piece)
            if text is not None:
                break
        else:
            break
        pos += len(piece)
        if pos > budget:
            break
        yield Delta(text, returned, c.tokens[returned], False)
        returned += i
    return returned


def _flush(c: PieceText, returned: int, stops: Seq[bytes], by_token: bool) -> Iterator[Delta]:
    """The rest after generation ended, one delta per token, cut at the first stop string."""
    rem = c.span(returned)
    found = [rem.index(s) for s in stops if s in rem]
    end = min(found) if found else len(rem)
    pos = 0
    for k in range(returned, len(c)):
        tok = c.tokens[k]
        piece = c.span(k, k + 1)
        pos += len(piece)
        if by_token and tok == c.bos:
            continue
        if pos >= end:
            yield Delta(piece[: len(piece) - (pos - end)].decode("utf-8", "ignore"), returned, tok, True)
            return
        yield Delta(piece.decode("utf-8", "ignore"), returned, tok, True)
        returned += 1


def run(seq: Sequence, req: Request) -> Iterator[Event]:
    """Generate for ``req`` on ``seq``: events ending with :class:`Stop` and
    :class:`Usage`, or with :class:`Error` when sampling or evaluation failed."""
    try:
        yield from _run(seq, req)
    except Exception as e:  # handed to the renderer, which raises it
        yield Error(e)


def _run(seq: Sequence, req: Request) -> Iterator[Event]:
    c, stops = req.completion, list(req.stops)
    by_token = req.stream == "tokens"
    returned, hold = 0, 0
    reason, text = "length", b""
    gen = seq.generate(req.prompt_tokens, req.params, stopping_criteria=req.stopping_criteria)
    try:
        for token in gen:
            if req.is_eog(token):
                reason, text = "stop", c.text()
                break
            c.append(token)
            yield Token(token, len(c) - 1)
            all_text = c.text()
            h = utf8_hold(all_text)
            if h is not None:
                hold = h
            if hold > 0:  # inside a character: no stop search, nothing sent (nor the length check)
                hold -= 1
                continue
            hit = next((s for s in stops if s in all_text), None)
            if hit is not None:
                reason, text = "stop", all_text[: all_text.index(hit)]
                break
            if req.stream:
                returned = yield from _deltas(c, returned, stops, by_token)
            if len(c) >= req.max_tokens:
                reason, text = "length", all_text
                break
    finally:
        gen.close()
    if req.stopping_criteria is not None and req.stopping_criteria(seq.tokens, seq.last_logits):
        reason, text = "stop", c.text()
    if req.stream:
        yield from _flush(c, returned, stops, by_token)
    yield Stop(reason, text)
    yield Usage(len(req.prompt_tokens), len(c))
