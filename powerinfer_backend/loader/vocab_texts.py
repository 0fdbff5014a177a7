"""A vocabulary's token strings as llama.cpp keys them, with set operations in numpy.

llama.cpp reads each ``tokenizer.ggml.tokens`` entry as a C string (so up to its first
NUL byte) and renames an empty one ``"[EMPTY_<id>]"``; its token -> id map must then hold
every token once. :class:`LlamaTexts` reproduces that view of a
:class:`~.gguf_meta.StringArray` and answers "which strings repeat" and "is this string
a token" without a Python object per token: each string gets a 64-bit hash (computed
column by column over all tokens at once), equal hashes are confirmed on the bytes.
"""

from __future__ import annotations

import numpy as np

from .gguf_meta import StringArray

__all__ = ["LlamaTexts"]

_P = 0x100000001B3  # odd: Horner hashing modulo 2**64, over 8-byte words
_K = 0x9E3779B97F4A7C15  # mixes the length in
_MASK = (1 << 64) - 1
_SHORT = 64  # strings up to this many bytes are hashed in numpy, longer ones one by one
_TAIL = np.array([(1 << 8 * r) - 1 for r in range(8)] + [_MASK], np.uint64)  # r bytes of a word


def _hash(s: bytes) -> int:
    """The hash :class:`LlamaTexts` gives the string ``s``."""
    if len(s) > _SHORT:
        return hash(s) & _MASK
    h = 0
    for k in range(0, len(s), 8):
        h = (h * _P + int.from_bytes(s[k : k + 8], "little")) & _MASK
    return h ^ (len(s) * _K & _MASK)


class LlamaTexts:
    """Token strings as llama.cpp reads them.

    Attributes:
        lens: int64 [n_tokens], each string's length as llama.cpp reads it.
        altered: sorted int64 ids whose string llama.cpp reads differently from the file
            (cut at a NUL byte, or empty and renamed).
    """

    def __init__(self, sa: StringArray):
        self._buf, self._starts, self._raw_lens = sa.buf, sa.starts, sa.lens
        lens = sa.lens.copy()
        # NUL bytes inside the strings: all NUL bytes minus those of the 8-byte lengths
        n_nul = sa.buf.size - np.count_nonzero(sa.buf)
        n_nul -= 8 * lens.size - np.count_nonzero(lens.astype("<u8").view(np.uint8))
        cut: np.ndarray = np.empty(0, np.int64)
        if n_nul:
            nul = np.concatenate(([0], np.cumsum(sa.buf == 0)))
            cut = np.flatnonzero(nul[sa.starts + sa.lens] != nul[sa.starts])
            for i in cut:
                lens[i] = self._raw(int(i)).index(0)  # llama.cpp reads token i up to its first NUL
        self.lens = lens
        self._renamed = {int(i): b"[EMPTY_%d]" % i for i in np.flatnonzero(lens == 0)}
        alt = np.sort(np.concatenate((cut, np.fromiter(self._renamed, np.int64, len(self._renamed)))))
        self.altered = alt[np.concatenate(([True], alt[1:] != alt[:-1]))] if alt.size else alt
        # (not np.union1d: its first call imports numpy.ma, ~30 ms of every load)
        h = self._hashes()
        self._order = np.argsort(h)
        self._sorted = h[self._order]

    def __len__(self) -> int:
        return int(self.lens.size)

    def __getitem__(self, i: int) -> bytes:
        i = int(i)
        if i in self._renamed:
            return self._renamed[i]
        s = int(self._starts[i])
        return self._buf[s : s + int(self.lens[i])].tobytes()

    def _raw(self, i: int) -> bytes:
        s = int(self._starts[i])
        return self._buf[s : s + int(self._raw_lens[i])].tobytes()

    def _hashes(self) -> np.ndarray:
        """:func:`_hash` of every string, a word column at a time over all of them."""
        lens = self.lens
        buf = np.concatenate((self._buf, np.zeros(8, np.uint8)))
        words: np.ndarray = np.ndarray((buf.size - 7,), "<u8", buf, 0, (1,))  # the 8 bytes at every offset
        h = np.zeros(len(self), np.uint64)
        idx = np.flatnonzero((lens > 0) & (lens <= _SHORT))
        st, left = self._starts[idx], lens[idx]
        while idx.size:
            w = words[st] & _TAIL[np.minimum(left, 8)]
            h[idx] = h[idx] * np.uint64(_P) + w
            more = left > 8
            idx, st, left = idx[more], st[more] + 8, left[more] - 8
        h ^= lens.astype(np.uint64) * np.uint64(_K)
        for i in np.flatnonzero(lens > _SHORT).tolist():
            h[i] = hash(self[i]) & _MASK
        for i, s in self._renamed.items():
            h[i] = _hash(s)
        return h

    def ids_of(self, s: bytes) -> list[int]:
        """Ids whose string is ``s`` (sorted)."""
        h = np.uint64(_hash(s))
        a = int(np.searchsorted(self._sorted, h, side="left"))
        b = int(np.searchsorted(self._sorted, h, side="right"))
        return sorted(int(i) for i in self._order[a:b] if self[i] == s)

    def __contains__(self, s: bytes) -> bool:
        return bool(self.ids_of(s))

    def duplicates(self) -> dict[bytes, list[int]]:
        """Each string held by more than one id -> its ids (empty when all are distinct)."""
        same = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
        if not same.size:
            return {}
        out: dict[bytes, list[int]] = {}
        for h in np.unique(self._sorted[same]):
            a = int(np.searchsorted(self._sorted, h, side="left"))
            b = int(np.searchsorted(self._sorted, h, side="right"))
            by_text: dict[bytes, list[int]] = {}
            for i in sorted(int(i) for i in self._order[a:b]):
                by_text.setdefault(self[i], []).append(i)
            out.update({t: ids for t, ids in by_text.items() if len(ids) > 1})
        return dict(sorted(out.items(), key=lambda kv: kv[1][0]))
