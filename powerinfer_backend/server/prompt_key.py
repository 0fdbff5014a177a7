"""A request's prompt tokens before it runs, so the worker can give it the slot whose KV
cells share the longest prefix with it (llama-server's slot choice).

The route's call (``llm.create_completion(...)`` or ``llm.create_chat_completion(...)``)
runs once against a :class:`_Probe`: the chat handler formats the messages as it will in
the slot, and the probe's ``create_completion`` takes the prompt and stops there.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from ..text import chat


class _Prompt(BaseException):  # not an Exception: a handler's own ``except Exception`` lets it through
    def __init__(self, tokens: List[int]):
        super().__init__()
        self.tokens = tokens


class _Probe:
    """The served Llama as a chat handler sees it, stopping at ``create_completion``."""

    def __init__(self, llm):
        self._llm = llm

    def create_completion(self, prompt, suffix=None, **_kw):
        raise _Prompt(self._llm.prompt_tokens(prompt, suffix))

    def create_chat_completion(self, messages, **kwargs):
        return chat.complete(self, messages, kwargs)

    def __getattr__(self, name):  # the vocabulary, chat handlers, verbose, ...
        return getattr(self._llm, name)


def prompt_of(llm, call: Callable) -> Optional[List[int]]:
    """The prompt tokens ``call(llm)`` would evaluate, or None when they cannot be known
    before it runs (the request's own errors are raised when it runs, in its slot)."""
    try:
        call(_Probe(llm))
    except _Prompt as p:
        return [int(t) for t in p.tokens]
    except Exception:  # reported by the real run
        return None
    return None
