"""The built-in ``"llama_cpp"`` backend: llama-cpp-python computes the logits.

For GGUF architectures the native engine does not run (``Llama(backend="auto")``, the
default, falls back to it), so any model llama.cpp runs still runs through
``powerinfer_backend.Llama`` - on the CPU, without sparsity, which it says once when
loaded. Tests also use it to feed llama.cpp's own logits into our sampling path.
Registered through the ``powerinfer_backend`` entry-point group like ``"hybrid"``.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

import llama_cpp

from .hookspecs import hookimpl
from .reference import load_reference

NOT_ACCELERATED = (
    "powerinfer_backend: {path}: running on llama.cpp (backend 'llama_cpp'): "
    "not accelerated (no sparse FFN, no GPU placement by vram_budget)"
)


class LlamaCppBackend:
    """A backend over a ``llama_cpp.Llama`` (interface: hookspecs.powerinfer_backend_register).

    llama.cpp keeps every output row (``logits_all=True``) so ``eval(..., logits_all=True)``
    can return them; without it only the last row is returned.
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_threads=None,
        vram_budget=None,
        verbose: bool = True,
        quiet: bool = False,
        **_ignored,
    ):
        if not quiet:
            warnings.warn(NOT_ACCELERATED.format(path=model_path), stacklevel=3)
        self._llm = load_reference(
            model_path,
            n_ctx=int(n_ctx),
            n_batch=int(n_batch),
            n_threads=n_threads,
            n_threads_batch=n_threads,
            logits_all=True,
            verbose=False,
        )
        m = self._llm
        self.n_vocab, self.n_embd, self.n_ctx = m.n_vocab(), m.n_embd(), m.n_ctx()
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(m.model)
        self.metadata = dict(m.metadata)
        self.n_threads = m.n_threads
        if verbose:
            print(
                f"powerinfer_backend: llama.cpp backend, n_ctx {self.n_ctx}, n_threads {self.n_threads}",
                file=sys.stderr,
            )

    @property
    def n_past(self) -> int:
        return self._llm.n_tokens

    def eval(self, tokens, logits_all: bool = False) -> np.ndarray:
        m = self._llm
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("eval: tokens must be a non-empty 1-D sequence")
        bad = next((i for i, t in enumerate(tokens) if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise ValueError(f"eval: token {tokens[bad]} at index {bad} is outside [0, {self.n_vocab})")
        if m.n_tokens + len(tokens) > self.n_ctx:
            raise ValueError(f"Requested tokens ({m.n_tokens + len(tokens)}) exceed context window of {self.n_ctx}")
        start = m.n_tokens
        m.eval(tokens)
        rows = m.scores[start : m.n_tokens] if logits_all else m.scores[m.n_tokens - 1 : m.n_tokens]
        return np.array(rows, dtype=np.float32)

    def embeddings(self) -> np.ndarray:
        raise NotImplementedError("the llama_cpp backend does not return embeddings")

    def truncate(self, n_keep: int) -> None:
        m = self._llm
        n_keep = max(0, min(int(n_keep), m.n_tokens))
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(m.ctx), 0, n_keep, -1)  # its one sequence
        m.n_tokens = n_keep

    def close(self) -> None:
        m, self._llm = getattr(self, "_llm", None), None
        if m is not None:
            m.close()


@hookimpl
def powerinfer_backend_register():
    return {"llama_cpp": LlamaCppBackend}
