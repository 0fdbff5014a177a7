"""Streaming an answer to the terminal: what is printed to stderr while it streams waits
until the answer's line has ended, and an answer the context cut off says so."""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Iterator, Optional, TextIO


@contextlib.contextmanager
def held_stderr() -> Iterator[TextIO]:
    """Hold what Python code prints to ``sys.stderr`` inside the block and write it out
    at the end. llama-cpp-python's completion code prints the ``--verbose`` timing report
    before the last pieces of a stream, so on a terminal it would land inside (or glued
    to) the answer's last line. Yields the real stderr, for lines meant to come first."""
    real = sys.stderr
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield real
    finally:
        real.write(held.getvalue())
        real.flush()


def stop_note(llm, finish_reason: Optional[str], max_tokens: Optional[int]) -> str:
    """The line telling why an answer ended early, "" when the model ended it: the
    context was full (``[stopped: context full (N tokens)]``), or, when ``max_tokens`` is
    given, the answer reached it (``[stopped: -n N tokens]``).

    Args:
        llm: the :class:`powerinfer_backend.Llama` that just answered.
        finish_reason: the stream's last ``finish_reason`` ("stop", "length" or None).
        max_tokens: the answer's token limit (-n), or None to name only a full context.
    """
    if finish_reason != "length":
        return ""
    n_ctx = llm.n_ctx()
    if llm.n_tokens + 1 >= n_ctx:  # the last sampled token is never evaluated
        return f"[stopped: context full ({n_ctx} tokens)]"
    return f"[stopped: -n {max_tokens} tokens]" if max_tokens else ""


def write_pieces(chunks, out: TextIO, piece, stop=lambda: False) -> tuple:
    """Write each chunk's text (``piece(chunk)``) to ``out`` as it comes; stop early when
    ``stop()`` turns true. Returns ``(text, finish_reason)`` (None when stopped early)."""
    parts = []
    finish = None
    for chunk in chunks:
        text = piece(chunk)
        if text:
            parts.append(text)
            out.write(text)
            out.flush()
        finish = chunk["choices"][0].get("finish_reason") or finish
        if stop():
            finish = None
            break
    return "".join(parts), finish
