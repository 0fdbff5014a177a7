"""The runner's typed events (text/runner.py) on the real default model: tokens equal the
low-level generate's, streamed deltas add up to the final text, a stop string is never
streamed, a failing callback ends the run with an Error event; and the UTF-8 hold rule
(text/detok.py) on byte tails. Completion renderings are compared with llama-cpp-python
in tests/test_llama_parity.py."""

from __future__ import annotations

import pytest

from powerinfer_backend import Llama
from powerinfer_backend.text.detok import PieceText, utf8_hold
from powerinfer_backend.text.runner import Delta, Error, Stop, Token, Usage
from powerinfer_backend.text.sampling import SamplingParams

PROMPT = b"The capital of France is"  # greedy: " Paris.\n\nThe United States has"
GREEDY = SamplingParams(temp=0.0)


@pytest.fixture(scope="module")
def llm(model_path):
    m = Llama(model_path, n_ctx=128, n_threads=1, verbose=False, sparse="off")
    yield m
    m.close()


def _greedy(llm, toks, n):
    out = []
    for t in llm.generate(toks, temp=0.0):
        out.append(t)
        if len(out) == n:
            return out


def test_greedy_events(llm):
    toks = llm.tokenize(PROMPT, special=True)
    want = _greedy(llm, toks, 8)
    events = list(llm.run(toks, GREEDY, max_tokens=8, stream="chars"))
    assert [(e.token, e.index) for e in events if isinstance(e, Token)] == [(t, i) for i, t in enumerate(want)]
    stop, usage = events[-2:]
    assert stop == Stop("length", llm.detokenize(want)) and usage == Usage(len(toks), 8)
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.text for d in deltas).encode() == stop.text and len(deltas) >= 6
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)


def test_stop_string_is_cut_and_never_streamed(llm):
    toks = llm.tokenize(PROMPT, special=True)
    events = list(llm.run(toks, GREEDY, max_tokens=8, stops=["never", "United"], stream="tokens"))
    stop = events[-2]
    assert stop.reason == "stop" and stop.text == b" Paris.\n\nThe "
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.text for d in deltas) == " Paris.\n\nThe "
    assert (deltas[-1].text, deltas[-1].final) == (" ", True)  # " United" cut at the stop, after the run


def test_a_failing_callback_ends_with_an_error_event(llm):
    boom = RuntimeError("processor failed")

    def proc(input_ids, scores):
        if len(input_ids) > 6:
            raise boom
        return scores

    toks = llm.tokenize(PROMPT, special=True)
    events = list(llm.run(toks, SamplingParams(temp=0.0, logits_processor=[proc]), max_tokens=8))
    assert isinstance(events[-1], Error) and events[-1].error is boom
    assert [type(e) for e in events[:-1]] == [Token, Token]  # 5 prompt tokens: samples at 5 and 6 pass


def test_piece_text_spans_drop_the_space_after_a_leading_bos():
    pieces = {1: b" <s>", 2: b" a", 3: b"\xc3", 4: b"\xa9"}
    t = PieceText(pieces.__getitem__, bos=1)
    for tok in (1, 2, 3, 4):
        t.append(tok)
    assert t.text() == b"<s> a\xc3\xa9" and t.span(1) == b" a\xc3\xa9" and t.span(2, 3) == b"\xc3"


@pytest.mark.parametrize(
    "tail,hold",
    [
        (b"ab\xf0", 3),
        (b"a\xf0", 2),
        (b"\xf0\x9f", 1),
        (b"ab\xc3", 1),
        (b"x\xc3", None),
        (b"ab\xe2\x82", 1),
        (b"\xf0\x9f\x8d\xa8", None),
        (b"abc", None),
    ],
)
def test_utf8_hold(tail, hold):
    """llama-cpp-python's rule, counted as if the tail were 3 bytes: b"a\\xf0" needs 3 more
    bytes but holds 2 tokens (the rule re-arms on the next token), b"x\\xc3" holds none."""
    assert utf8_hold(tail) == hold
