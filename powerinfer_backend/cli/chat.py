"""``powerinfer-backend chat``: an interactive chat in the terminal, and the one answer
``generate --chat`` streams.

Each turn goes through ``Llama.create_chat_completion`` (llama-cpp-python's chat
formatting: the GGUF's chat template or ``--chat-format``), with the whole history, and
streams the answer as it is decoded. Keys, as llama.cpp's ``llama-cli``: Ctrl-C while an
answer streams stops it (the partial answer stays in the history, as the user saw it)
and returns to the prompt; Ctrl-C or Ctrl-D at the prompt, or ``/exit``, ends the chat;
``/clear`` forgets the history.
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional, TextIO

PROMPT = "> "
COMMANDS = "/exit: quit, /clear: forget the history; Ctrl-C stops an answer, Ctrl-D quits"


class _StopOnInterrupt:
    """A SIGINT handler for the time an answer streams: the first Ctrl-C asks the answer
    to stop after the current token (so the model's state stays consistent), a second
    one before it has stopped raises KeyboardInterrupt (quit)."""

    def __init__(self):
        self.hit = False
        self._previous = None

    def __call__(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGINT, self)
        except ValueError:  # not the main thread: no handler, Ctrl-C behaves as usual
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def stream_answer(llm, messages: List[dict], out: TextIO, **sampling) -> tuple:
    """Stream the assistant's answer to ``messages`` (OpenAI-style ``{"role",
    "content"}`` dicts) onto ``out``, token by token.

    Args:
        llm: a :class:`powerinfer_backend.Llama`.
        sampling: ``create_chat_completion`` keywords (``max_tokens``, ``temperature``, ``seed``...).

    Returns:
        ``(text, stopped)``: the answer as written, and True when Ctrl-C stopped it.

    Raises:
        ValueError: the history no longer fits in the context (llama-cpp-python's message).
    """
    parts: List[str] = []
    with _StopOnInterrupt() as stop:
        chunks = llm.create_chat_completion(messages, stream=True, **sampling)
        try:
            for chunk in chunks:
                piece = chunk["choices"][0]["delta"].get("content") or ""
                if piece:
                    parts.append(piece)
                    out.write(piece)
                    out.flush()
                if stop.hit:
                    break
        finally:
            chunks.close()  # ends llama-cpp-python's generator (and its eval loop) here
    return "".join(parts), stop.hit


def run_chat(llm, *, system: Optional[str] = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
             **sampling) -> int:
    """The interactive loop: read a line after :data:`PROMPT`, answer it with the history,
    until ``/exit``, end of input or Ctrl-C at the prompt. Returns the exit status (0)."""
    try:
        import readline  # noqa: F401  (line editing and history for input() on a terminal)
    except ImportError:  # pragma: no cover - not on every platform
        pass
    history: List[dict] = [{"role": "system", "content": system}] if system else []
    if sys.stdin.isatty():
        print(f"chat with {llm.model_path} ({COMMANDS})", file=err, flush=True)
    while True:
        try:
            line = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            out.flush()
            return 0
        text = line.strip()
        if text == "/exit":
            return 0
        if text == "/clear":
            history = history[:1] if system else []
            continue
        if not text:
            continue
        history.append({"role": "user", "content": line})
        try:
            answer, _ = stream_answer(llm, history, out, **sampling)
        except ValueError as e:  # the history outgrew the context: say so, keep chatting
            history.pop()
            print(f"\npowerinfer-backend: error: {e} (/clear forgets the history)", file=err, flush=True)
            continue
        out.write("\n")
        out.flush()
        history.append({"role": "assistant", "content": answer})
