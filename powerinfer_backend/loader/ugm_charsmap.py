"""The Unigram (``tokenizer.ggml.model`` "t5") normalizer table,
``tokenizer.ggml.precompiled_charsmap``, checked as llama.cpp reads it.

The table is a 4-byte size, an XOR-compressed double array (XCDA: a trie over input
bytes, one uint32 per node) of that many bytes, then NUL-terminated replacement
strings. llama.cpp checks the sizes while loading but bounds-checks each node and
replacement only while tokenizing, where its exception escapes the C API and aborts the
process. :func:`charsmap_problem` walks every node reachable from the root with every
input byte instead, vectorized with numpy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["charsmap_problem"]

_C = np.arange(1, 256, dtype=np.uint64)  # input bytes (a NUL ends the walk)
_CHUNK = 4096  # trie nodes expanded at once (x 255 children)


def charsmap_problem(cm: np.ndarray) -> str | None:
    """What llama.cpp would fail on in the charsmap bytes ``cm`` (1-D uint8), or None."""
    n = int(cm.size)
    if n < 4:
        return f"has {n} bytes, fewer than its 4-byte size header: llama.cpp refuses the file"
    blob = int.from_bytes(cm[:4].tobytes(), "little")
    if blob + 4 >= n:
        return (
            f"says its XCDA array has {blob} bytes but {n - 4} follow (it needs at least one byte of "
            "replacement strings after it): llama.cpp refuses the file"
        )
    xcda = np.frombuffer(cm[4 : 4 + blob // 4 * 4].tobytes(), "<u4").astype(np.uint64)
    repl = cm[4 + blob :]
    if xcda.size == 0:
        return None  # llama.cpp skips the table
    nul = np.flatnonzero(repl == 0)
    last_nul = int(nul[-1]) if nul.size else -1
    size = xcda.size

    def base(e):
        return ((e >> np.uint64(10)) << ((e & np.uint64(1 << 9)) >> np.uint64(6))) & np.uint64(0xFFFFFFFF)

    seen = {int(base(xcda[:1])[0])}
    frontier = np.array(sorted(seen), np.uint64)
    while frontier.size:
        found = []
        for f in np.array_split(frontier, max(1, -(-frontier.size // _CHUNK))):
            idx = f[:, None] ^ _C[None, :]
            bad = idx >= size
            if bad.any():
                r, c = np.argwhere(bad)[0]
                return (
                    f"input byte 0x{int(_C[c]):02X} at trie node {int(f[r])} leads outside the "
                    f"{size}-entry XCDA array: llama.cpp throws past its C API while tokenizing such "
                    "text, aborting the process"
                )
            e = xcda[idx]
            hit = (e & np.uint64(0x800000FF)) == _C[None, :]
            e, i = e[hit], idx[hit]
            nxt = i ^ base(e)
            leaf = nxt[((e >> np.uint64(8)) & np.uint64(1)).astype(bool)]
            if leaf.size:
                if int(leaf.max()) >= size:
                    return (
                        f"a trie leaf points to entry {int(leaf.max())} of the {size}-entry XCDA array: "
                        "llama.cpp throws past its C API while tokenizing, aborting the process"
                    )
                val = xcda[leaf] & np.uint64((1 << 31) - 1)
                if int(val.max()) > last_nul:
                    return (
                        f"a replacement string at byte {int(val.max())} of the {repl.size} replacement bytes "
                        "is missing or not NUL-terminated: llama.cpp throws past its C API while "
                        "tokenizing, aborting the process"
                    )
            found.append(nxt)
        new = set(np.unique(np.concatenate(found)).tolist()) - seen if found else set()
        seen |= new
        frontier = np.array(sorted(new), np.uint64)
    return None
