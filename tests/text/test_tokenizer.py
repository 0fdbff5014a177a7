"""The tokenizer shared by the server's slot threads: pieces detokenized from several
threads at once are each token's own (one ctypes buffer was shared: a piece written by
another thread, e.g. "river" over "return" giving "rivern", was returned and cached)."""

from __future__ import annotations

import functools
import random
from concurrent.futures import ThreadPoolExecutor

from powerinfer_backend.text.tokenizer import LlamaCppTokenizer


def _pieces(tok, order):
    return {t: tok.piece(t) for t in order}


def test_pieces_from_many_threads_are_each_tokens_own(model_path):
    ids = list(range(2000, 10000))
    want = LlamaCppTokenizer(model_path)
    expected = {t: want.piece(t) for t in ids}
    want.close()
    for round_ in range(3):
        tok = LlamaCppTokenizer(model_path)  # empty piece cache: every call reaches llama.cpp
        orders = [random.Random(round_ * 8 + i).sample(ids, len(ids)) for i in range(8)]
        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(functools.partial(_pieces, tok), orders))
        tok.close()
        for g in got:
            assert g == expected
