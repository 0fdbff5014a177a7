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
    """A reusable ``llama_token_data_array`` over the full vocabulary.

    The C struct's header (data pointer, size, selected, sorted) is also viewed as numpy
    integers, and the record columns as numpy views, so the per-token work is three
    column writes, the C call, and a few scalar reads.
    """

    def __init__(self, n_vocab: int):
        self.n_vocab = int(n_vocab)
        self.data = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self._ids = np.arange(self.n_vocab, dtype=np.int32)
        self.id_col, self.logit_col, self.p_col = self.data["id"], self.data["logit"], self.data["p"]
        ptr = ctypes.cast(self.data.ctypes.data, llama_cpp.llama_token_data_p)
        self.array = llama_cpp.llama_token_data_array(data=ptr, size=self.n_vocab, selected=-1, sorted=False)
        self._data_ptr = ptr
        self._addr = self.data.ctypes.data
        self.ref = ctypes.byref(self.array)
        f = llama_cpp.llama_token_data_array
        assert (f.data.offset, f.size.offset, f.selected.offset) == (0, 8, 16) and ctypes.sizeof(f) >= 25
        raw = (ctypes.c_char * ctypes.sizeof(f)).from_address(ctypes.addressof(self.array))
        self._hdr = np.frombuffer(raw, dtype=np.int64, count=3)  # data pointer, size, selected
        self._sorted = np.frombuffer(raw, dtype=np.uint8, count=1, offset=f.sorted.offset)
        self._ids_intact = False

    def fill(self, logits: np.ndarray) -> None:
        """Reset to the whole vocabulary in id order with ``logits`` (as llama_sampler_sample)."""
        if not self._ids_intact:
            self.id_col[:] = self._ids
        self.logit_col[:] = logits
        self.p_col[:] = 0.0
        hdr = self._hdr
        hdr[0] = self._addr  # a sampler may have pointed it elsewhere
        hdr[1] = self.n_vocab
        hdr[2] = -1
        self._sorted[0] = 0

    def selected(self) -> tuple[int, float]:
        """The selected token and its logit after a chain ran (-inf: every token was
        masked); notes whether the ids are still 0..n-1 in order (no sampler sorted,
        shrank or moved the array, e.g. penalties + greedy), so the next fill can skip them."""
        addr, size, sel = self._hdr.tolist()
        if not 0 <= sel < size:
            raise RuntimeError(f"llama.cpp's sampler chain selected no token (selected={sel})")
        if addr == self._addr:
            self._ids_intact = size == self.n_vocab and not self._sorted[0]
            return int(self.id_col[sel]), float(self.logit_col[sel])
        self._ids_intact = False
        entry = self.array.data[sel]
        return int(entry.id), float(entry.logit)


class ChainSampler:
    """Applies a ``llama_cpp._internals.LlamaSampler`` chain to rows of our logits.

    ``sample(logits)`` = fill the buffer, ``llama_sampler_apply``, read the selected id,
    ``llama_sampler_accept`` (what ``llama_sampler_sample`` does inside llama.cpp).

    ``argmax_exact``: the chain is known to be [penalties that are a no-op, greedy]
    (llama-cpp-python's chain for temp == 0 with default penalties and no logits
    processor or grammar). Its result is then the first maximum of the logits, which
    ``np.argmax`` gives without filling the buffer; accepting is skipped too, as it
    changes nothing such a chain computes (the penalties' history is never used).
    """

    def __init__(self, chain, buffer: TokenDataBuffer, argmax_exact: bool = False):
        self.chain = chain  # keeps the chain (and its custom-sampler callbacks) alive
        self.buffer = buffer
        self.argmax_exact = argmax_exact

    def sample(self, logits: np.ndarray) -> int:
        buf = self.buffer
        if logits.shape[-1] != buf.n_vocab:
            raise ValueError(f"logits have {logits.shape[-1]} entries, the vocabulary {buf.n_vocab}")
        smpl = self.chain.sampler
        if self.argmax_exact:
            token = int(np.argmax(logits))  # a NaN would come first: then the chain decides
            if logits[token] == logits[token]:
                return token  # accepting is a no-op for this chain (no-op penalties, greedy)
        buf.fill(logits)
        llama_cpp.llama_sampler_apply(smpl, buf.ref)
        token, logit = buf.selected()
        if logit == -np.inf:
            # every token was masked (a grammar no token of this vocabulary can continue):
            # accepting it would make llama.cpp's grammar throw through its C API, which
            # aborts the process
            raise ValueError(f"no token can be sampled: the sampler chain masked the whole vocabulary "
                             f"({buf.n_vocab} tokens; e.g. a grammar that no token of this model's "
                             f"vocabulary can continue)")
        llama_cpp.llama_sampler_accept(smpl, token)
        return token

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.chain.sampler, int(token))

    def close(self) -> None:
        self.chain.close()
