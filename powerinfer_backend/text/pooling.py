"""Embedding pooling as llama.cpp defines it (``LLAMA_POOLING_TYPE_*``): per-token rows
kept (NONE), or pooled to one vector (MEAN / CLS / LAST), optionally L2-normalised."""

from __future__ import annotations

from typing import List, Union

import llama_cpp
import numpy as np


def l2_normalized(v: np.ndarray) -> List[float]:
    """``v / ||v||`` as a list (a zero vector stays zero)."""
    n = float(np.linalg.norm(v))
    return (v / n).tolist() if n else v.tolist()


def pool(rows: np.ndarray, pooling: int, normalize: bool) -> Union[List[float], List[List[float]]]:
    """Pool one input's embeddings ``rows`` (float32, n_tokens × n_embd) by llama.cpp's
    ``pooling`` type.

    Raises:
        NotImplementedError: a pooling type other than NONE, MEAN, CLS or LAST.
    """
    if pooling == llama_cpp.LLAMA_POOLING_TYPE_NONE:
        return [l2_normalized(r) if normalize else r.tolist() for r in rows]
    if pooling == llama_cpp.LLAMA_POOLING_TYPE_MEAN:
        v = rows.mean(axis=0)
    elif pooling == llama_cpp.LLAMA_POOLING_TYPE_CLS:
        v = rows[0]
    elif pooling == llama_cpp.LLAMA_POOLING_TYPE_LAST:
        v = rows[-1]
    else:
        raise NotImplementedError(f"pooling type {pooling} is not supported")
    return l2_normalized(v) if normalize else v.tolist()
