"""Token sampling with llama.cpp's own sampler chain, fed from our logits.

``llama_cpp.Llama`` samples with ``llama_sampler_sample(chain, ctx, idx)``, which reads
the logits of a llama.cpp context, builds a ``llama_token_data_array`` of the whole
vocabulary in id order, applies the chain and accepts the selected token. We have no
llama.cpp context, so :class:`ChainSampler` does the same three steps through
llama-cpp-python's low-level API on a token-data buffer filled from our logits
(allocated once per Llama, not per token). The chain itself is built by
``llama_cpp.Llama._init_sampler`` (penalties, grammar, top-k / typical / top-p / min-p /
temperature / dist, mirostat, greedy, the custom logits-processor stage), so equal
logits and an equal seed give the same tokens as llama-cpp-python.
"""

from __future__ import annotations

import ctypes

import numpy as np

import llama_cpp

# llama_token_data {int32 id; float logit; float p} as a numpy record (12 bytes, aligned)
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class TokenDataBuffer:
    """A reusable ``llama_token_data_array`` over the full vocabulary."""

    def __init__(self, n_vocab: int):
        self.n_vocab = int(n_vocab)
        self.data = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self._ids = np.arange(self.n_vocab, dtype=np.int32)
        ptr = ctypes.cast(self.data.ctypes.data, llama_cpp.llama_token_data_p)
        self.array = llama_cpp.llama_token_data_array(data=ptr, size=self.n_vocab, selected=-1, sorted=False)
        self._data_ptr = ptr
        self._addr = self.data.ctypes.data
        self.ref = ctypes.byref(self.array)
        self._ids_intact = False

    def fill(self, logits: np.ndarray) -> None:
        """Reset to the whole vocabulary in id order with ``logits`` (as llama_sampler_sample)."""
        d = self.data
        if not self._ids_intact:
            d["id"] = self._ids
        d["logit"] = logits
        d["p"] = 0.0
        a = self.array
        a.data = self._data_ptr  # a sampler may have pointed it elsewhere
        a.size = self.n_vocab
        a.selected = -1
        a.sorted = False
        self._ids_intact = False

    def applied(self) -> None:
        """After a chain ran: the ids are still 0..n-1 in order when no sampler sorted,
        shrank or moved the array (e.g. penalties + greedy), so the next fill can skip them."""
        a = self.array
        self._ids_intact = (a.size == self.n_vocab and not a.sorted
                            and ctypes.cast(a.data, ctypes.c_void_p).value == self._addr)


class ChainSampler:
    """Applies a ``llama_cpp._internals.LlamaSampler`` chain to rows of our logits.

    ``sample(logits)`` = fill the buffer, ``llama_sampler_apply``, read the selected id,
    ``llama_sampler_accept`` (what ``llama_sampler_sample`` does inside llama.cpp).
    """

    def __init__(self, chain, buffer: TokenDataBuffer):
        self.chain = chain  # keeps the chain (and its custom-sampler callbacks) alive
        self.buffer = buffer

    def sample(self, logits: np.ndarray) -> int:
        buf = self.buffer
        if logits.shape[-1] != buf.n_vocab:
            raise ValueError(f"logits have {logits.shape[-1]} entries, the vocabulary {buf.n_vocab}")
        buf.fill(logits)
        smpl = self.chain.sampler
        llama_cpp.llama_sampler_apply(smpl, buf.ref)
        buf.applied()
        sel = buf.array.selected
        if not 0 <= sel < buf.array.size:
            raise RuntimeError(f"llama.cpp's sampler chain selected no token (selected={sel})")
        token = int(buf.array.data[sel].id)
        llama_cpp.llama_sampler_accept(smpl, token)
        return token

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.chain.sampler, int(token))

    def close(self) -> None:
        self.chain.close()
