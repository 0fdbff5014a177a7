"""Token sampling with llama.cpp's own sampler chain, fed from our logits.

llama.cpp samples with ``llama_sampler_sample(chain, ctx, idx)``: it reads a context's
logits into a ``llama_token_data_array`` of the whole vocabulary in id order, applies the
chain and accepts the selected token. We have no llama.cpp context, so
:class:`ChainSampler` does those three steps through llama.cpp's C API (llama-cpp-python's
low-level ``llama_cpp`` bindings) on a buffer filled from our logits. :func:`build_chain`
assembles the chain stage by stage as ``llama_cpp.Llama`` does for the same arguments
(penalties, grammar, then greedy / dist / mirostat / top-k, typical, top-p, min-p,
temperature, dist), so equal logits and an equal seed give llama-cpp-python's tokens.
Logits processors (the Python stage llama-cpp-python puts first in the chain) run on the
buffer before the chain.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

import llama_cpp

from .grammar import as_grammar, grammar_sampler

# llama_token_data {int32 id; float logit; float p} as a numpy record (12 bytes, aligned)
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

#: mirostat v1's m (tokens used to estimate s_hat), llama.cpp's and llama-cpp-python's value
MIROSTAT_M = 100


@dataclass(frozen=True)
class SamplingParams:
    """``Llama.generate`` / ``sample``'s sampler arguments (llama-cpp-python's names and
    defaults). ``tfs_z`` and ``penalize_nl`` are accepted and unused, as there.
    ``logits_processor``: callables ``(input_ids, scores) -> scores`` run in order on the
    float32 logits before the chain; ``grammar``: a :class:`~.grammar.Grammar`, GBNF text
    or ``llama_cpp.LlamaGrammar``."""

    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    temp: float = 0.80
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    tfs_z: float = 1.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    penalize_nl: bool = True
    logits_processor: Optional[Sequence[Callable]] = None
    grammar: Any = None

    @property
    def greedy_argmax(self) -> bool:
        """Whether the chain is [no-op penalties, greedy]: its token is the first maximum of
        the logits (after the logits processors, which run before the chain)."""
        return (
            self.temp == 0.0
            and self.grammar is None
            and self.repeat_penalty == 1.0
            and self.frequency_penalty == 0.0
            and self.presence_penalty == 0.0
        )


class SamplerChain:
    """An owned ``llama_sampler`` chain (freed by :meth:`close`)."""

    def __init__(self):
        self.sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

    def add(self, stage) -> None:
        llama_cpp.llama_sampler_chain_add(self.sampler, stage)

    def close(self) -> None:
        smpl, self.sampler = self.sampler, None
        if smpl:
            llama_cpp.llama_sampler_free(smpl)  # frees the stages with it

    def __del__(self):
        self.close()


def _penalties(n_vocab: int, last_n: int, repeat: float, freq: float, present: float):
    """llama.cpp's penalties sampler; the llama.cpp that llama-cpp-python 0.3.36 vendors takes
    ``n_vocab`` first, upstream's signature (4 arguments) does not."""
    init = llama_cpp.llama_sampler_init_penalties
    if len(getattr(init, "argtypes", None) or ()) == 4:
        return init(last_n, repeat, freq, present)
    return init(n_vocab, last_n, repeat, freq, present)


def build_chain(p: SamplingParams, *, seed: int, n_vocab: int, vocab, penalty_last_n: int) -> SamplerChain:
    """llama.cpp's sampler chain for ``p`` (the processors excepted: :class:`ChainSampler`
    runs them), seeded with ``seed`` (uint32; 0xFFFFFFFF = random), over ``vocab``
    (``llama_vocab_p``, for a grammar).

    Raises:
        ValueError: llama.cpp cannot parse the grammar.
    """
    c = llama_cpp
    chain = SamplerChain()
    seed = int(seed) & 0xFFFFFFFF
    try:
        chain.add(_penalties(n_vocab, penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        grammar = as_grammar(p.grammar)
        if grammar is not None:
            chain.add(grammar_sampler(grammar, vocab))
        if p.temp < 0.0:  # sample from the unscaled distribution
            chain.add(c.llama_sampler_init_dist(seed))
        elif p.temp == 0.0:
            chain.add(c.llama_sampler_init_greedy())
        elif p.mirostat_mode == 1:
            chain.add(c.llama_sampler_init_mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, MIROSTAT_M))
        elif p.mirostat_mode == 2:
            chain.add(c.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
        else:
            min_keep = 1
            chain.add(c.llama_sampler_init_top_k(p.top_k))
            chain.add(c.llama_sampler_init_typical(p.typical_p, min_keep))
            chain.add(c.llama_sampler_init_top_p(p.top_p, min_keep))
            chain.add(c.llama_sampler_init_min_p(p.min_p, min_keep))
            chain.add(c.llama_sampler_init_temp(p.temp))
            chain.add(c.llama_sampler_init_dist(seed))
    except BaseException:
        chain.close()
        raise
    return chain


class LogitBias:
    """A logits processor adding ``bias`` ({token id: value}) to the logits, rounded as
    llama-cpp-python's (a Python float plus the float32 logit, stored as float32).
    Called, it returns a new array; :class:`ChainSampler` adds it in place instead
    (:meth:`add_inplace`: the same values, without copying the vocabulary's logits)."""

    def __init__(self, bias: Dict[int, float]):
        self.items = [(int(k), float(v)) for k, v in bias.items()]

    def add_inplace(self, scores: np.ndarray) -> None:
        """Add the bias to ``scores`` (float32, n_vocab) in place."""
        for tok, b in self.items:
            scores[tok] = b + scores[tok]

    def __call__(self, input_ids, scores):
        out = np.copy(scores)
        self.add_inplace(out)
        return out


def logit_bias_processor(bias: Dict[int, float]) -> Callable:
    """The :class:`LogitBias` processor for ``bias`` ({token id: value})."""
    return LogitBias(bias)


class TokenDataBuffer:
    """A reusable ``llama_token_data_array`` over the full vocabulary, its records also
    seen as numpy columns (so a fill is three column writes)."""

    def __init__(self, n_vocab: int):
        self.n_vocab = int(n_vocab)
        self.data = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self._ids = np.arange(self.n_vocab, dtype=np.int32)
        self.id_col, self.logit_col, self.p_col = self.data["id"], self.data["logit"], self.data["p"]
        self.scores = np.zeros(self.n_vocab, dtype=np.float32)  # contiguous logits the processors run on
        self._addr = self.data.ctypes.data
        # Any: llama_cpp annotates the struct's data field as an array; the C field is a pointer
        self._ptr: Any = ctypes.cast(self._addr, llama_cpp.llama_token_data_p)
        self.array = llama_cpp.llama_token_data_array(data=self._ptr, size=self.n_vocab, selected=-1, sorted=False)
        self.ref = ctypes.byref(self.array)
        self._ids_intact = False

    def fill(self, logits: np.ndarray) -> None:
        """Reset to the whole vocabulary in id order with ``logits`` (as llama_sampler_sample)."""
        if not self._ids_intact:
            self.id_col[:] = self._ids
        self.logit_col[:] = logits
        self.p_col[:] = 0.0
        a = self.array
        a.data = self._ptr  # a sampler may have pointed it elsewhere
        a.size = self.n_vocab
        a.selected = -1
        a.sorted = False

    def selected(self) -> tuple:
        """The selected token and its logit after a chain ran (-inf: every token was
        masked); notes whether the ids are still 0..n-1 in order (no sampler sorted,
        shrank or moved the array, e.g. penalties + greedy), so the next fill can skip them."""
        a = self.array
        size, sel = a.size, a.selected
        if not 0 <= sel < size:
            raise RuntimeError(f"llama.cpp's sampler chain selected no token (selected={sel})")
        if ctypes.cast(a.data, ctypes.c_void_p).value == self._addr:
            self._ids_intact = size == self.n_vocab and not a.sorted
            return int(self.id_col[sel]), float(self.logit_col[sel])
        self._ids_intact = False
        entry = a.data[sel]
        return int(entry.id), float(entry.logit)


class ChainSampler:
    """Samples tokens from rows of our logits with one chain (its state: penalty history,
    grammar position, RNG, mirostat's mu).

    ``sample(logits, input_ids)`` = run the logits processors (given ``input_ids``, the
    sequence so far), fill the buffer, ``llama_sampler_apply``, read the selected
    id, ``llama_sampler_accept`` (what ``llama_sampler_sample`` does inside llama.cpp).
    For a chain that is [no-op penalties, greedy] the first maximum of the logits (after
    the processors) is the answer, which ``np.argmax`` gives without the chain (and without
    the buffer when there are no processors); accepting is then skipped, as it changes
    nothing such a chain computes. A :class:`LogitBias` processor is added in place.
    """

    def __init__(self, params: SamplingParams, chain: SamplerChain, buffer: TokenDataBuffer):
        self.params = params
        self.chain = chain
        self.buffer = buffer
        self.processors = list(params.logits_processor or ())
        self.argmax_exact = params.greedy_argmax

    def sample(self, logits: np.ndarray, input_ids: Optional[np.ndarray] = None) -> int:
        """The next token from ``logits`` (float32, n_vocab).

        Raises:
            ValueError: wrong logits length, or the chain masked every token (e.g. a
                grammar no token of the vocabulary can continue: accepting would make
                llama.cpp throw through its C API, which aborts the process).
        """
        buf = self.buffer
        if logits.shape[-1] != buf.n_vocab:
            raise ValueError(f"logits have {logits.shape[-1]} entries, the vocabulary {buf.n_vocab}")
        if self.processors:
            logits = self._processed(logits, input_ids)
        if self.argmax_exact:
            token = int(np.argmax(logits))  # a NaN would come first: then the chain decides
            top = logits[token]
            # after processors the chain also decides an all-masked vocabulary (it raises below)
            if top == top and not (self.processors and top == -np.inf):
                return token
        buf.fill(logits)
        smpl = self.chain.sampler
        llama_cpp.llama_sampler_apply(smpl, buf.ref)
        token, logit = buf.selected()
        if logit == -np.inf:
            raise ValueError(
                f"no token can be sampled: the sampler chain masked the whole vocabulary "
                f"({buf.n_vocab} tokens; e.g. a grammar that no token of this model's "
                f"vocabulary can continue)"
            )
        llama_cpp.llama_sampler_accept(smpl, token)
        return token

    def _processed(self, logits: np.ndarray, input_ids: Optional[np.ndarray]) -> np.ndarray:
        """``logits`` through the processors, in order, in the buffer's float32 scores (a
        :class:`LogitBias` added in place)."""
        scores = self.buffer.scores
        np.copyto(scores, logits)
        for proc in self.processors:
            if isinstance(proc, LogitBias):
                proc.add_inplace(scores)
            else:
                scores[:] = proc(input_ids, scores)
        return scores

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.chain.sampler, int(token))

    def close(self) -> None:
        self.chain.close()
