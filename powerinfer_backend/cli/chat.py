"""``powerinfer-backend chat``: an interactive chat in the terminal, and the one answer
``generate --chat`` streams.

Each turn goes through ``Llama.create_chat_completion`` (llama-cpp-python's chat
formatting: the GGUF's chat template or ``--chat-format``), with the whole history, and
streams the answer as it is decoded. Keys, as llama.cpp's ``llama-cli``: Ctrl-C while an
answer streams stops it (the partial answer stays in the history, as the user saw it)
and returns to the prompt; Ctrl-C or Ctrl-D at the prompt, or ``/exit``, ends the chat;
``/clear`` forgets the history; ``/help`` lists the commands. Any other line whose first
word is ``/name`` is refused as an unknown command (never sent to the model).
"""

from __future__ import annotations

import re
import signal
import sys
from typing import List, Optional, TextIO

from .stream import held_stderr, stop_note, write_pieces

PROMPT = "> "
#: the chat's commands and what they do (/help prints them)
COMMANDS = {
    "/help": "list these commands",
    "/clear": "forget the history (a --system message stays)",
    "/exit": "end the chat (as Ctrl-D, or Ctrl-C at the prompt)",
}
KEYS = "Ctrl-C while an answer streams stops it"
_COMMAND = re.compile(r"/\w+")  # a first word such as /help; "/usr/bin ..." is a message


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
        ``(text, finish_reason)``: the answer as written, and "stop" (the model ended it),
        "length" (``max_tokens`` or the context ended it; :func:`.stream.stop_note`) or
        None (Ctrl-C stopped it).

    Raises:
        ValueError: the history no longer fits in the context (llama-cpp-python's message).
    """
    with _StopOnInterrupt() as stop:
        chunks = llm.create_chat_completion(messages, stream=True, **sampling)
        try:
            return write_pieces(chunks, out, lambda c: c["choices"][0]["delta"].get("content"), lambda: stop.hit)
        finally:
            chunks.close()  # ends llama-cpp-python's generator (and its eval loop) here


def help_text() -> str:
    """What ``/help`` prints: one line per command, then the keys."""
    return "\n".join([f"  {name:<7} {what}" for name, what in COMMANDS.items()] + [f"  {KEYS}"])


def run_chat(
    llm, *, system: Optional[str] = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr, **sampling
) -> int:
    """The interactive loop: read a line after :data:`PROMPT`, answer it with the history,
    until ``/exit``, end of input or Ctrl-C at the prompt. Answers go to ``out``; the
    commands' replies, the stop notes and errors to ``err``. Returns the exit status (0)."""
    try:
        import readline  # noqa: F401 - line editing and history for input() on a terminal
    except ImportError:  # pragma: no cover - not on every platform
        pass
    history: List[dict] = [{"role": "system", "content": system}] if system else []
    if sys.stdin.isatty():
        print(f"chat with {llm.model_path} (/help lists the commands; {KEYS}; Ctrl-D quits)", file=err, flush=True)
    while True:
        try:
            line = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            out.flush()
            return 0
        text = line.strip()
        if not text:
            continue
        word = text.split()[0]
        if _COMMAND.fullmatch(word):
            if word == "/exit":
                return 0
            if word == "/clear":
                history = history[:1] if system else []
                print("history cleared" + (" (the system message stays)" if system else ""), file=err, flush=True)
            elif word == "/help":
                print(help_text(), file=err, flush=True)
            else:
                print(
                    f"powerinfer-backend: error: unknown command {word} (/help lists the commands)",
                    file=err,
                    flush=True,
                )
            continue
        history.append({"role": "user", "content": line})
        with held_stderr():
            try:
                answer, finish = stream_answer(llm, history, out, **sampling)
            except ValueError as e:  # the history outgrew the context: say so, keep chatting
                history.pop()
                print(f"\npowerinfer-backend: error: {e} (/clear forgets the history)", file=err, flush=True)
                continue
            out.write("\n")
            out.flush()
            note = stop_note(llm, finish, sampling.get("max_tokens"))
            if note:
                print(note, file=err, flush=True)
        history.append({"role": "assistant", "content": answer})
