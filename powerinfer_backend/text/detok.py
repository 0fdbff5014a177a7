"""Incremental detokenization of a growing completion, and the UTF-8 hold rule.

:class:`PieceText` keeps each token's piece once, so the text of any span of the
completion is a slice (llama.cpp's detokenize of that token list: pieces joined, the
leading space after a leading BOS dropped) and the whole text grows per token without
re-joining.
"""

from __future__ import annotations

from typing import Callable, List, Optional


class PieceText:
    """The bytes of a token list, built one token at a time.

    Args:
        piece: ``piece(token) -> bytes`` (llama_token_to_piece, special tokens as text
            only when the caller's tokenizer does so).
        bos: the BOS token id (-1: none).
    """

    def __init__(self, piece: Callable[[int], bytes], bos: int):
        self.piece = piece
        self.bos = bos
        self.tokens: List[int] = []
        self.raw = bytearray()  # pieces joined
        self.ends: List[int] = [0]  # ends[i]: bytes of raw before token i

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        self.tokens.append(int(token))
        self.raw += self.piece(int(token))
        self.ends.append(len(self.raw))

    def span(self, i: int, j: Optional[int] = None) -> bytes:
        """Detokenized bytes of ``tokens[i:j]`` as a list of its own."""
        j = len(self.tokens) if j is None else j
        out = bytes(self.raw[self.ends[i] : self.ends[j]])
        if i < j and self.tokens[i] == self.bos and out[:1] == b" ":
            return out[1:]
        return out

    def text(self) -> bytes:
        """All the bytes (``span(0)``)."""
        return self.span(0)


def utf8_hold(text: bytes) -> Optional[int]:
    """llama-cpp-python's guard against streaming a split character: a UTF-8 lead byte
    among the last three bytes whose character cannot be complete gives how many more
    tokens to wait (its length minus its distance from the end, counted as if the tail
    were three bytes long; the byte nearest the end and the longest match win); None when
    the tail has no lead byte."""
    hold = None
    tail = text[-3:]
    for i, byte in enumerate(tail):
        dist = 3 - i
        for length, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0)):
            if length > dist and byte & lead == lead:
                hold = length - dist
    return hold


def decodes(data: bytes) -> Optional[str]:
    """``data`` as UTF-8 text, or None when it is not valid UTF-8 (e.g. ends inside a character)."""
    try:
        return data.decode("utf-8")
    except UnicodeError:
        return None
