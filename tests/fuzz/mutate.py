"""Mutations of a GGUF seed, each described in words (what was changed, where, from what to
what) so that a saved crasher can be understood and rebuilt without the harness.

Kinds (:data:`KINDS`): ``bitflip`` (1-8 bits, mostly inside the header), ``boundary`` (one
structural field set to an edge value of its width: 0, 1, the type's maxima, value ± 1, the
file size, NaN / inf for floats), ``inflate`` (a count or an array length raised), ``truncate``
(at a random byte or at a field boundary), ``dup_chunk`` / ``drop_chunk`` (a whole key/value
entry, tensor directory entry or random header span repeated or removed, the count fixed up
or not), ``token_dup`` (one vocabulary string overwritten with another of the same length).
A mutant stacks 1-3 of them: fixed-size ones first, at most one size-changing one last (the
layout's positions stay valid until then).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from .gguf_layout import Layout

KINDS = ("bitflip", "boundary", "inflate", "truncate", "dup_chunk", "drop_chunk", "token_dup")
_SIZE_CHANGING = ("truncate", "dup_chunk", "drop_chunk")
# relative weights: structure-aware kinds dominate, as they reach the deepest checks
_WEIGHTS = {"bitflip": 4, "boundary": 6, "inflate": 2, "truncate": 2, "dup_chunk": 2, "drop_chunk": 2, "token_dup": 1}
_FLOATS = (0.0, -0.0, math.nan, math.inf, -math.inf, -1.0, 1e-45, 3.4e38, 1e30)


def _edges(value: int, size: int, file_size: int, pos: int) -> list[int]:
    top = 1 << (8 * size)
    vals = [
        0,
        1,
        2,
        3,
        7,
        8,
        31,
        32,
        33,
        64,
        255,
        256,
        0x7FFF,
        0xFFFF,
        0x7FFFFFFF,
        0x80000000,
        0xFFFFFFFF,
        1 << 32,
        (1 << 63) - 1,
        1 << 63,
        top - 1,
        top - 2,
        value - 1,
        value + 1,
        value * 2,
        value + 1024,
        value << 16,
        file_size,
        file_size - pos,
        file_size + 1,
    ]
    return sorted({v % top for v in vals})


class Mutator:
    """Mutants of one seed: ``buf`` (the bytes mutated: a whole tiny file, or the header
    region of a large one) with its parsed :class:`Layout`; ``file_size`` is the size of
    the real file (header region + data), for the size-related edge values."""

    def __init__(self, buf: bytes, layout: Layout, file_size: int | None = None, header_only: bool = False):
        self.buf = bytes(buf)
        self.lay = layout
        self.file_size = len(buf) if file_size is None else file_size
        self.header_only = header_only
        self._kinds = [k for k in KINDS if not (header_only and k == "truncate")]
        self._vocab = [s for s in layout.strings if s[2].startswith("tokenizer.ggml.tokens[")]
        self._rare = [x for x in layout.fields if x.kind not in ("str_len", "scalar")]
        self._counts = [x for x in layout.fields if x.kind in ("n_tensors", "n_kv", "array_len", "n_dims")]

    def mutant(self, rng: np.random.Generator) -> tuple[bytes, str]:
        """One mutant and its description ("; "-separated steps)."""
        n = int(rng.choice([1, 1, 1, 2, 3]))
        w = np.array([_WEIGHTS[k] for k in self._kinds], dtype=float)
        kinds = list(rng.choice(self._kinds, size=n, p=w / w.sum()))
        sized = [k for k in kinds if k in _SIZE_CHANGING][:1]
        kinds = [k for k in kinds if k not in _SIZE_CHANGING] + sized
        buf = bytearray(self.buf)
        steps = []
        for k in kinds:
            buf, step = getattr(self, "_" + k)(buf, rng)
            steps.append(step)
        return bytes(buf), "; ".join(steps)

    # -- fixed-size kinds --

    def _bitflip(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        end = self.lay.header_end if self.header_only or rng.random() < 0.85 else len(buf)
        flips = []
        for _ in range(int(rng.integers(1, 9))):
            pos = int(rng.integers(0, end))
            bit = int(rng.integers(0, 8))
            buf[pos] ^= 1 << bit
            flips.append(f"{pos}.{bit}")
        return buf, f"bitflip bytes.bits {','.join(flips)}"

    def _boundary(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        f = self.lay.fields[int(rng.integers(0, len(self.lay.fields)))]
        if rng.random() < 0.5:  # half the time a field of the rarer structural kinds
            f = self._rare[int(rng.integers(0, len(self._rare)))]
        (old,) = struct.unpack_from("<" + f.code, buf, f.pos)
        if f.code in "fd":
            new = _FLOATS[int(rng.integers(0, len(_FLOATS)))]
            struct.pack_into("<" + f.code, buf, f.pos, new)
        else:
            ucode = {1: "B", 2: "H", 4: "I", 8: "Q"}[f.size]
            (uold,) = struct.unpack_from("<" + ucode, buf, f.pos)
            edges = _edges(uold, f.size, self.file_size, f.pos)
            new = edges[int(rng.integers(0, len(edges)))]
            struct.pack_into("<" + ucode, buf, f.pos, new)
        return buf, f"boundary {f.kind} of {f.label!r} at byte {f.pos}: {old!r} -> {new!r}"

    def _inflate(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        f = self._counts[int(rng.integers(0, len(self._counts)))]
        ucode = "Q" if f.size == 8 else "I"
        (old,) = struct.unpack_from("<" + ucode, buf, f.pos)
        add = int(rng.choice([1, 2, 5, 100, 1 << 16, 1 << 24, 1 << 40]))
        new = (old * add if rng.random() < 0.3 else old + add) % (1 << (8 * f.size))
        struct.pack_into("<" + ucode, buf, f.pos, new)
        return buf, f"inflate {f.kind} of {f.label!r} at byte {f.pos}: {old} -> {new}"

    def _token_dup(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        if len(self._vocab) < 2:
            return self._bitflip(buf, rng)
        by_len: dict[int, list] = {}
        for s in self._vocab:
            by_len.setdefault(s[1], []).append(s)
        groups = [g for g in by_len.values() if len(g) >= 2]
        if not groups:
            return self._bitflip(buf, rng)
        g = groups[int(rng.integers(0, len(groups)))]
        i, j = rng.choice(len(g), size=2, replace=False)
        (pa, n, la), (pb, _, lb) = g[int(i)], g[int(j)]
        buf[pb : pb + n] = buf[pa : pa + n]
        return buf, f"token_dup {lb} := {la} (byte {pb}, {n} bytes)"

    # -- size-changing kinds (last in a stack) --

    def _truncate(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        if rng.random() < 0.5:
            f = self.lay.fields[int(rng.integers(0, len(self.lay.fields)))]
            at = f.pos + int(rng.integers(0, f.size + 1))
        else:
            at = int(rng.integers(0, len(buf)))
        return buf[:at], f"truncate at byte {at} of {len(buf)}"

    def _chunk(self, rng) -> tuple[int, int, str]:
        r = rng.random()
        pool = self.lay.kv_chunks if r < 0.45 else self.lay.tensor_chunks if r < 0.9 else None
        if pool:
            return pool[int(rng.integers(0, len(pool)))]
        a = int(rng.integers(0, self.lay.header_end))
        return a, min(self.lay.header_end, a + int(rng.integers(1, 65))), "span"

    def _fix_count(self, buf: bytearray, label_kind: str, delta: int) -> str:
        kind = "n_kv" if label_kind == "kv" else "n_tensors"
        f = next(x for x in self.lay.fields if x.kind == kind)
        (old,) = struct.unpack_from("<Q", buf, f.pos)
        struct.pack_into("<Q", buf, f.pos, (old + delta) % (1 << 64))
        return f", {kind} {old} -> {old + delta}"

    def _chunk_kind(self, chunk) -> str | None:
        if chunk in self.lay.kv_chunks:
            return "kv"
        if chunk in self.lay.tensor_chunks:
            return "tensor"
        return None

    def _dup_chunk(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        return self._edit_chunk(buf, rng, +1)

    def _drop_chunk(self, buf: bytearray, rng) -> tuple[bytearray, str]:
        return self._edit_chunk(buf, rng, -1)

    def _edit_chunk(self, buf: bytearray, rng, delta: int) -> tuple[bytearray, str]:
        """Duplicate (delta +1) or remove (delta -1) one chunk, often fixing its count too."""
        chunk = self._chunk(rng)
        a, b, label = chunk
        kind = self._chunk_kind(chunk)
        fix = ""
        if kind and rng.random() < 0.6:
            fix = self._fix_count(buf, kind, delta)
        out = buf[:b] + buf[a:b] + buf[b:] if delta > 0 else buf[:a] + buf[b:]
        return out, f"{'dup' if delta > 0 else 'drop'}_chunk {kind or 'bytes'} {label!r} (bytes {a}-{b}){fix}"
