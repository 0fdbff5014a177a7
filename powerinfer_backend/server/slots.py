"""A server slot and the sequence operations the batch scheduler runs on.

:class:`SlotLlama` is one slot's :class:`~powerinfer_backend.Llama`: it shares the
served model's tokenizer, vocabulary, chat handlers and backend, and owns a
:class:`~powerinfer_backend.text.sequence.Sequence` (tokens, logits, sampler chain, seed).
The sequence's evaluator is a :class:`SlotBackend`, whose ``eval`` goes to the scheduler
(``decode``), so everything above the logits (the runner and the completion, chat and
``/completion`` renderings of its events) runs per slot unchanged: one implementation of
each piece.

:func:`seq_access` gives the scheduler the context's sequences (:class:`SeqAccess`): the
native engine's parallel sequences (``eval_seqs``) or, for one slot, any backend's own
``eval`` / ``truncate``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import numpy as np

from ..llama import Llama


class Cancelled(Exception):
    """Raised in a slot when its client went away (or the server stops)."""


class SeqAccess:
    """The sequences of one context as the scheduler uses them (one thread at a time).

    Attributes:
        n_seq: sequences (slots) served.
        n_ctx_seq: KV cells (tokens) per sequence.
        n_batch: most tokens of one :meth:`eval`, all items together.
    """

    n_seq: int
    n_ctx_seq: int
    n_batch: int

    def n_past(self, seq: int) -> int:
        raise NotImplementedError

    def truncate(self, seq: int, n_keep: int) -> None:
        raise NotImplementedError

    def eval(self, items: Sequence[Tuple[int, List[int]]], logits_all: bool) -> List[np.ndarray]:
        """One forward pass over ``items`` ((seq, tokens) each, seqs distinct); per item
        float32 logits, (len(tokens), n_vocab) with ``logits_all``, else (1, n_vocab)
        for its last token."""
        raise NotImplementedError


class _NativeSeqs(SeqAccess):
    """The native context's parallel sequences (``NativeContext.eval_seqs``)."""

    def __init__(self, ctx, n_seq: int):
        self.ctx = ctx
        self.n_seq = int(n_seq)
        self.n_ctx_seq = int(ctx.n_ctx_seq)
        self.n_batch = int(ctx.n_batch)

    def n_past(self, seq: int) -> int:
        return self.ctx.seq_n_past(seq)

    def truncate(self, seq: int, n_keep: int) -> None:
        self.ctx.seq_truncate(seq, n_keep)

    def eval(self, items, logits_all):
        if logits_all:
            return self.ctx.eval_seqs(items, logits_all=True)
        return [out[None, :] for out in self.ctx.eval_seqs(items)]


class _BackendSeq(SeqAccess):
    """One sequence through the backend's ``eval`` / ``truncate`` (any backend plugin)."""

    n_seq = 1

    def __init__(self, llm):
        self.be = llm.engine
        self.n_ctx_seq = int(llm.n_ctx())
        self.n_batch = int(llm.n_batch)

    def n_past(self, seq: int) -> int:
        return self.be.n_past

    def truncate(self, seq: int, n_keep: int) -> None:
        self.be.truncate(n_keep)

    def eval(self, items, logits_all):
        ((_, tokens),) = items
        out = self.be.eval(tokens, logits_all=logits_all)
        return [np.array(out if logits_all else out[-1:], dtype=np.float32)]  # a copy: the buffer is reused


def seq_access(llm, parallel: int) -> SeqAccess:
    """The sequences of ``llm``'s context for ``parallel`` slots.

    Raises:
        ValueError: ``parallel`` < 1, above the context's ``n_seq_max``, or > 1 on a
            backend without parallel sequences.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    ctx = getattr(llm, "native_context", None)
    if ctx is not None and hasattr(ctx, "eval_seqs"):
        if parallel > ctx.n_seq_max:
            raise ValueError(
                f"parallel={parallel} exceeds the context's n_seq_max={ctx.n_seq_max}: "
                f"load the Llama with n_seq_max={parallel}"
            )
        if parallel > ctx.n_batch:
            raise ValueError(
                f"parallel={parallel} exceeds n_batch={ctx.n_batch}: one step decodes a token of every slot"
            )
        return _NativeSeqs(ctx, parallel)
    if parallel != 1:
        raise ValueError(
            f"parallel={parallel} needs the native engine's parallel sequences "
            f"(backend 'hybrid', Llama(..., n_seq_max={parallel})); backend "
            f"{getattr(llm, 'backend', '?')!r} runs one sequence"
        )
    return _BackendSeq(llm)


class SlotBackend:
    """A slot's backend as :meth:`Llama.eval` uses it: ``n_past``, ``truncate`` and
    ``eval`` of the slot's own sequence, ``eval`` through the scheduler (a truncation is
    carried out by the scheduler before the next decode); any other attribute is the
    served backend's."""

    def __init__(self, backend, slot: "SlotLlama", decode: Callable):
        self.backend = backend
        self.slot = slot
        self.decode = decode
        self.n_past = 0  # tokens of the sequence as this slot's Llama knows them

    def truncate(self, n_keep: int) -> None:
        self.n_past = min(self.n_past, int(n_keep))

    def eval(self, tokens, logits_all: bool = False) -> np.ndarray:
        out = self.decode(self.slot, self.n_past, list(tokens))
        self.n_past += len(tokens)
        return out

    def __getattr__(self, name):
        return getattr(self.backend, name)


# What a slot takes from the served Llama, by reference: settings, the tokenizer and
# vocabulary, chat handlers, the timing report. The rest of a Llama's state is per
# sequence and the slot's own (its backend view, sequence, context length, prompt cache).
# tests/server/test_slots.py checks the two lists cover every attribute a Llama has.
SHARED = (
    "model_path",
    "_init_kwargs",
    "verbose",
    "vram_budget",
    "sparse",
    "_logits_all",
    "_embedding",
    "last_n_tokens_size",
    "spm_infill",
    "draft_model",
    "backend",
    "_tok",
    "n_batch",
    "n_threads",
    "_n_vocab",
    "tokenizer_",
    "chat_format",
    "chat_handler",
    "chat_handlers",
    "perf",
)
OWN = ("_backend", "_seq", "_n_ctx", "cache", "_announced", "seq", "job")


class SlotLlama(Llama):
    """One slot's view of a served :class:`Llama` (see the module docstring).

    Args:
        base: the served model (not modified; never closed by the slot).
        seq: this slot's sequence id.
        n_ctx: the slot's context (tokens), n_ctx // n_seq_max.
        decode: ``decode(slot, n_past, tokens) -> logits`` ((len(tokens), n_vocab)
            float32 with logits_all, else (1, n_vocab)), run by the scheduler; raises
            :class:`Cancelled` when the slot's client left.
    """

    def __init__(self, base: Llama, seq: int, n_ctx: int, decode: Callable):  # no Llama.__init__ to call
        for name in SHARED:
            setattr(self, name, getattr(base, name))
        self._announced = False  # the model_loaded / unloaded hooks belong to the base
        self.seq = int(seq)
        self.job: Any = None  # the worker's Job running in this slot (its cancel flag)
        self._backend = SlotBackend(base.engine, self, decode)
        self._n_ctx = int(n_ctx)
        self.cache = None
        self._seq = base.new_sequence(self._backend, self._n_ctx, seq_id=self.seq)

    def n_ctx(self) -> int:
        """The slot's context length in tokens."""
        return self._n_ctx

    def forget(self) -> None:
        """Forget the cached tokens (the scheduler cleared or will clear the KV cells)."""
        self._backend.n_past = 0
        self._seq.forget()

    def generate(self, *args, **kwargs):
        """:meth:`Llama.generate`, stopping within one token when the client left."""
        for token in Llama.generate(self, *args, **kwargs):
            job = self.job
            if job is not None and job.cancel.is_set():
                raise Cancelled()
            yield token

    def embed(self, *args, **kwargs):
        raise RuntimeError("embeddings run on the served Llama, not in a slot")

    def close(self) -> None:
        """Free the slot's sampler chain (the model belongs to the base)."""
        self._seq.close_sampler()
