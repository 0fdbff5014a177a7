"""One token sequence in a KV cache: its tokens, the logits we keep of them, its sampler
chain, and the eval / generate steps over an evaluator (a backend, or a server slot's view
of one) that owns the KV cells.

The evaluator is anything with ``n_past`` (tokens its cache holds), ``truncate(n_keep)``
and ``eval(tokens, logits_all) -> float32 logits`` ((len(tokens), n_vocab) with
``logits_all``, else at least the last row): the backend plugins' interface.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Generator, List, Optional, Sequence as Seq

import numpy as np

from .perf import PerfContext
from .sampling import ChainSampler, SamplingParams, TokenDataBuffer, build_chain


def common_prefix(a: Seq[int], b: Seq[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Sequence:
    """A sequence of tokens in sequence ``seq_id`` of ``evaluator``'s KV cache.

    Attributes:
        input_ids: int32 (intc) array of ``n_ctx`` token slots; the first ``n_tokens``
            are the sequence.
        scores: float32 logits, (n_ctx, n_vocab) rows by position with ``logits_all``,
            else one unused row (the last logits are :attr:`last_logits`).
        last_logits: the logits after the last evaluated token (None before any eval).
        requires_eval: the last logits are not live (restored or truncated state): a
            generate must evaluate at least one token before sampling.
        sampler: the chain of the running :meth:`generate` (None outside one).
        prompt_evaluated: tokens of the last :meth:`generate`'s prompt that were
            evaluated; the rest were cached KV cells (llama-server's ``prompt_n``).
    """

    def __init__(
        self,
        evaluator,
        *,
        n_ctx: int,
        n_vocab: int,
        logits_all: bool,
        vocab,
        seq_id: int = 0,
        penalty_last_n: int = 64,
        perf: Optional[PerfContext] = None,
        verbose: bool = False,
    ):
        self.evaluator = evaluator
        self.seq_id = int(seq_id)
        self.n_ctx = int(n_ctx)
        self.n_vocab = int(n_vocab)
        self.logits_all = bool(logits_all)
        self.vocab = vocab
        self.penalty_last_n = int(penalty_last_n)
        self.perf = perf if perf is not None else PerfContext()
        self.verbose = verbose
        self.n_tokens = 0
        self.input_ids = np.zeros(self.n_ctx, dtype=np.intc)
        self.scores = np.zeros((self.n_ctx if self.logits_all else 1, self.n_vocab), dtype=np.single)
        self.last_logits: Optional[np.ndarray] = None  # without logits_all: a view of the evaluator's buffer
        self.requires_eval = True
        self.sampler: Optional[ChainSampler] = None
        self.seed = 0xFFFFFFFF
        self.prompt_evaluated = 0
        self._buffer = TokenDataBuffer(self.n_vocab)

    # ---- tokens and logits -------------------------------------------------------------

    @property
    def tokens(self) -> np.ndarray:
        """The sequence (a view of ``input_ids``)."""
        return self.input_ids[: self.n_tokens]

    def set_tokens(self, tokens: Seq[int]) -> None:
        """Replace the token record (the KV cells follow at the next eval)."""
        tokens = list(tokens)
        self.input_ids[: len(tokens)] = tokens
        self.n_tokens = len(tokens)

    def rows(self) -> np.ndarray:
        """Logits rows: every position with logits_all, else the last one (0 or 1 row)."""
        if self.logits_all:
            return self.scores[: self.n_tokens, :]
        if self.last_logits is None:
            return self.scores[:0]
        return self.last_logits[None, :]

    def logits_at(self, idx: Optional[int]) -> np.ndarray:
        """The logits after position ``idx`` (default: the last evaluated token).

        Raises:
            RuntimeError: nothing evaluated yet.
            ValueError: ``idx`` is not kept (logits_all=False keeps the last only).
        """
        if self.n_tokens == 0 or self.last_logits is None:
            raise RuntimeError("sample() before eval(): no logits yet")
        if idx is None or idx == self.n_tokens - 1:
            return self.last_logits
        if self.logits_all and 0 <= idx < self.n_tokens:
            return self.scores[idx]
        raise ValueError(f"sample: no logits kept for position {idx} (logits_all=False keeps the last only)")

    def reset(self) -> None:
        """Forget all tokens (the KV cells are reused from position 0 at the next eval)."""
        self.n_tokens = 0
        self.requires_eval = True

    def forget(self) -> None:
        """Forget the tokens and the logits (the KV cells were cleared elsewhere)."""
        self.reset()
        self.last_logits = None

    def eval(self, tokens: Seq[int]) -> None:
        """Append ``tokens`` and compute their logits.

        Raises:
            ValueError: the sequence would exceed n_ctx, or a token id is out of range.
        """
        tokens = list(tokens)
        if not tokens:
            return
        n_past = self.n_tokens
        if n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"Requested tokens ({n_past + len(tokens)}) exceed context window of {self.n_ctx}")
        ev = self.evaluator
        if ev.n_past != n_past:  # reset / truncation, or a chunk of a failed eval got cached
            ev.truncate(n_past)
        t0 = time.perf_counter()
        logits = ev.eval(tokens, logits_all=self.logits_all)
        self.perf.record(len(tokens), time.perf_counter() - t0)
        self.input_ids[n_past : n_past + len(tokens)] = tokens
        if self.logits_all:
            self.scores[n_past : n_past + len(tokens), :] = logits
            self.last_logits = self.scores[n_past + len(tokens) - 1]
        else:
            self.last_logits = logits[-1]  # a view of the evaluator's last-token buffer (no copy per token)
        self.n_tokens = n_past + len(tokens)
        self.requires_eval = False

    def restore(self, tokens: Seq[int] | np.ndarray, scores: np.ndarray) -> None:
        """Make the sequence ``tokens`` with logits rows ``scores`` (all rows with
        logits_all, else at least the last one), re-evaluating only what the KV cells do
        not share with ``tokens``; the logits are not live afterwards (:attr:`requires_eval`).

        Raises:
            ValueError: more tokens than n_ctx.
        """
        toks = np.asarray(tokens, dtype=np.intc)
        n = len(toks)
        if n > self.n_ctx:
            raise ValueError(f"Requested tokens ({n}) exceed context window of {self.n_ctx}")
        ev = self.evaluator
        keep = min(common_prefix(self.input_ids[: min(self.n_tokens, ev.n_past)].tolist(), toks.tolist()), n)
        ev.truncate(keep)
        if keep < n:
            ev.eval(toks[keep:].tolist(), logits_all=False)
        self.input_ids[:n] = toks
        self.n_tokens = n
        scores = np.asarray(scores, dtype=np.single)
        if self.logits_all:
            self.scores[: len(scores)] = scores
            self.last_logits = self.scores[n - 1] if n else None
        else:
            self.last_logits = scores[-1].copy() if len(scores) else None
        self.requires_eval = True

    # ---- sampling ------------------------------------------------------------------------

    def new_sampler(self, params: SamplingParams) -> ChainSampler:
        """A sampler with a fresh chain for ``params``, seeded with :attr:`seed`."""
        chain = build_chain(
            params, seed=self.seed, n_vocab=self.n_vocab, vocab=self.vocab, penalty_last_n=self.penalty_last_n
        )
        return ChainSampler(params, chain, self._buffer)

    def sample(self, params: SamplingParams, idx: Optional[int] = None) -> int:
        """A token from the logits at ``idx`` with the running generate's chain, else a
        one-off chain for ``params`` (as llama-cpp-python's ``Llama.sample``)."""
        logits = self.logits_at(idx)
        sampler = self.sampler
        one_off = sampler is None
        if sampler is None:
            sampler = self.new_sampler(params)
        try:
            return sampler.sample(logits, self.tokens)
        finally:
            if one_off:
                sampler.close()

    def close_sampler(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()

    def _reuse_prefix(self, tokens: List[int]) -> Optional[List[int]]:
        """Keep the cached prefix shared with ``tokens``; the tokens still to evaluate,
        or None when nothing is shared (start over)."""
        prefix = common_prefix(self.tokens.tolist(), tokens)
        consumed = prefix == len(tokens)
        if consumed and self.n_tokens == len(tokens) and not self.requires_eval:
            return []  # the whole prompt is cached with live logits
        keep = prefix - 1 if consumed else prefix  # re-evaluate one token for fresh logits
        if keep <= 0:
            return None
        self.n_tokens = keep
        self.requires_eval = True
        if self.verbose:
            print(
                f"Llama.generate: {keep} prefix-match hit, remaining {len(tokens) - keep} prompt tokens to eval",
                file=sys.stderr,
            )
        return tokens[keep:]

    def generate(
        self,
        tokens: Seq[int],
        params: SamplingParams,
        *,
        reset: bool = True,
        stopping_criteria: Optional[Callable] = None,
    ) -> Generator[int, Optional[list], None]:
        """Yield sampled tokens after ``tokens``, endlessly (the caller stops); a list sent
        to the generator is appended after the yielded token. With ``reset``, the cached
        prefix shared with ``tokens`` is kept and only the rest evaluated.

        ``stopping_criteria(input_ids, logits) -> bool`` is asked after each sample (the
        sequence up to the sampled position and the logits sampled from); True ends it.

        Raises:
            RuntimeError: empty ``tokens`` with nothing cached (no logits to sample from).
        """
        self.close_sampler()
        sampler = self.sampler = self.new_sampler(params)
        tokens = list(tokens)
        if reset and self.n_tokens > 0:
            rest = self._reuse_prefix(tokens)
            if rest is not None:
                reset, tokens = False, rest
        if reset:
            self.reset()
        if not tokens and self.n_tokens == 0:
            raise RuntimeError("generate: empty prompt and nothing cached: no logits to sample from")
        sample_idx = self.n_tokens + len(tokens) - 1
        self.prompt_evaluated = len(tokens)
        while True:
            self.eval(tokens)
            while sample_idx < self.n_tokens:
                logits = self.last_logits
                if sample_idx == self.n_tokens - 1 and self.sampler is sampler and logits is not None:  # usually
                    token = sampler.sample(logits, self.tokens)
                else:
                    token = self.sample(params, idx=sample_idx)
                sample_idx += 1
                if stopping_criteria is not None and stopping_criteria(self.input_ids[:sample_idx], self.last_logits):
                    return
                sent = yield token
                tokens = [token] if sent is None else [token, *sent]
                if sample_idx < self.n_tokens and token != self.input_ids[sample_idx]:
                    self.n_tokens = sample_idx
                    self.requires_eval = True
                    break
