"""The skeleton ``calibrate`` and ``train-predictor`` share: measure on a model, choose within
a perplexity budget, write the sidecar. :meth:`SidecarRun.prepare` reads and splits the text
(a head to fit on, a held-out tail to measure on) and settles where the sidecar goes;
:meth:`SidecarRun.context` opens the native context both measure with, :meth:`SidecarRun.down_t`
its transposed down cache; :meth:`SidecarRun.speed` times decode dense against the chosen
sparse configuration; :meth:`SidecarRun.provenance` and :func:`speed_info` are the sidecar
keys both record; :meth:`SidecarRun.write` writes it."""

from __future__ import annotations

import hashlib
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .perplexity import read_text

__all__ = ["SidecarRun", "split_text_tokens", "speed_info", "sha256_bytes"]


def sha256_bytes(b: bytes) -> str:
    """Hex SHA-256 of ``b`` (the text's fingerprint in the sidecar)."""
    return hashlib.sha256(b).hexdigest()


def split_text_tokens(
    model_path: str,
    text_path: str,
    *,
    offset_bytes: int,
    max_bytes: Optional[int],
    n_ctx: int,
    tokens: int,
    heldout_tokens: int,
    error: type = ValueError,
    purpose: str = "calibration",
):
    """Read and tokenize the text slice (BOS first) and split it for a fit/check run:
    the last ``heldout_tokens`` in whole chunks of ``n_ctx`` (at least one, at most a
    quarter of the chunks) are held out; the head is at most ``tokens`` from the start.

    Returns:
        (text bytes, head ids, held-out ids).

    Raises:
        ``error`` (a ValueError subclass): the text is missing, a folder, empty, not
            UTF-8, or shorter than two chunks (message names ``purpose``, file and byte range).
    """
    from ..text.tokenizer import LlamaCppTokenizer

    try:
        text = read_text(text_path, offset_bytes, max_bytes)
    except ValueError as e:  # missing, folder, empty, not UTF-8, offset past the end
        raise error(f"{purpose} {e}") from None
    text_bytes = text.encode("utf-8")
    ids = LlamaCppTokenizer(model_path).tokenize(text_bytes, add_bos=True, special=False)
    n_chunks = len(ids) // n_ctx
    if n_chunks < 2:
        raise error(
            f"{purpose} text {text_path} (bytes {offset_bytes}..{offset_bytes + len(text_bytes)}) has "
            f"{len(ids)} tokens; at least two chunks of n_ctx={n_ctx} ({2 * n_ctx} tokens) are needed "
            f"(one to fit on, one held out)"
        )
    n_held = max(1, min(heldout_tokens // n_ctx, n_chunks // 4))
    held = ids[len(ids) - n_held * n_ctx :]
    return text_bytes, ids[: min(int(tokens), len(ids) - n_held * n_ctx)], held


def speed_info(speed: dict) -> dict:
    """The sidecar keys of a :func:`~powerinfer_backend.sparsity.speed.measure_speedup` result."""
    return {
        "decode_speedup": speed["speedup"],
        "decode_dense_tok_s": speed["dense_tok_s"],
        "decode_sparse_tok_s": speed["sparse_tok_s"],
        "speed_threads": speed["threads"],
        "speed_host": speed["host"],
        "speed_dense_layout": speed.get("dense_layout", "rows"),
    }


@dataclass
class SidecarRun:
    """One calibration or training run's inputs (see :meth:`prepare`)."""

    model_path: str
    text_path: str
    gguf: Any  # the loaded model (loader.GGUFModel)
    text_bytes: bytes
    head: list  # token ids to fit on
    held: list  # held-out token ids (whole chunks of n_ctx)
    n_ctx: int
    offset_bytes: int
    model_sha: str
    text_sha: str
    path: Path  # the sidecar

    @classmethod
    def prepare(
        cls,
        model_path: str,
        text_path: str,
        gguf,
        *,
        out: Optional[str],
        n_ctx: int,
        tokens: int,
        heldout_tokens: int,
        offset_bytes: int,
        max_bytes: Optional[int],
        error: type,
        purpose: str,
    ) -> "SidecarRun":
        """Split the text (:func:`split_text_tokens`) and settle the sidecar's path (``out``,
        else :func:`~powerinfer_backend.sparsity.sidecar.sidecar_path`, its folder created).

        Raises:
            ``error``: the text (as :func:`split_text_tokens`), ``n_ctx`` past the model's
                training context, ``out`` a folder, the sidecar's folder missing or not writable.
        """
        from ..loader.artifacts import model_fingerprint
        from .sidecar import sidecar_path

        text_bytes, head, held = split_text_tokens(
            model_path,
            text_path,
            offset_bytes=offset_bytes,
            max_bytes=max_bytes,
            n_ctx=n_ctx,
            tokens=tokens,
            heldout_tokens=heldout_tokens,
            error=error,
            purpose=purpose,
        )
        if n_ctx > gguf.max_positions:
            raise error(f"n_ctx {n_ctx} exceeds the model's training context ({gguf.max_positions} tokens)")
        path = Path(out) if out else sidecar_path(model_path, create=True)
        if path.is_dir():
            raise error(f"--out {path} is a folder; give the sidecar's file name")
        if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
            raise error(f"cannot write the sidecar into {path.parent} (missing or not writable)")
        return cls(
            model_path,
            text_path,
            gguf,
            text_bytes,
            head,
            held,
            n_ctx,
            offset_bytes,
            model_fingerprint(model_path),
            sha256_bytes(text_bytes),
            path,
        )

    @contextmanager
    def context(self, n_threads: Optional[int]) -> Iterator[Any]:
        """A NativeContext of ``n_ctx`` (batch ``n_ctx``) on the model, closed with its model;
        the model's dense products in row groups, as ``Llama`` runs them on the CPU."""
        from ..engine.native import NativeContext, NativeModel, default_threads

        model = NativeModel(self.gguf)
        try:
            model.repack()
            ctx = NativeContext(model, n_ctx=self.n_ctx, n_batch=self.n_ctx, n_threads=n_threads or default_threads())
            try:
                yield ctx
            finally:
                ctx.close()
        finally:
            model.close()

    def down_t(self, progress: bool) -> np.ndarray:
        """Every layer's transposed ``ffn_down`` (the down cache, built first if missing)."""
        from ..engine.down_cache import build_down_cache, down_t_dtype, load_down_cache

        dtype = down_t_dtype(self.gguf)
        build_down_cache(self.model_path, self.gguf, dtype, progress=progress)
        return load_down_cache(self.model_path, dtype)

    def speed(
        self, ctx, set_dense: Callable[[], None], set_sparse: Callable[[], None], *, steps: int = 32, repeats: int = 5
    ) -> dict:
        """Decode speedup of ``set_sparse`` over ``set_dense`` on the held-out tokens
        (:func:`~powerinfer_backend.sparsity.speed.measure_speedup`), within the context's room."""
        from .speed import measure_speedup

        room = min(ctx.n_ctx, len(self.held))
        prompt = min(16, max(1, room // 4))
        speed = measure_speedup(
            ctx,
            set_dense,
            set_sparse,
            self.held,
            prompt_tokens=prompt,
            steps=max(1, min(steps, room - prompt)),
            repeats=repeats,
        )
        # what the dense side ran on: a speedup measured against the file's rows is stale
        # where Llama runs row groups (sparsity.modes)
        return dict(speed, dense_layout="row groups" if ctx.model.repacked_bytes else "rows")

    def provenance(self) -> dict:
        """The sidecar keys naming the model, the text slice and the context length."""
        return {
            "model_sha256": self.model_sha,
            "model_file": os.path.basename(self.model_path),
            "model_size": os.path.getsize(self.model_path),
            "text_sha256": self.text_sha,
            "text_file": os.path.basename(self.text_path),
            "offset_bytes": self.offset_bytes,
            "text_bytes": len(self.text_bytes),
            "n_ctx": self.n_ctx,
            "created": time.time(),
        }

    def write(self, prof) -> Path:
        """Write ``prof`` (a SparsityProfile) to the sidecar, atomically; -> its path."""
        from .sidecar import write_sidecar

        return write_sidecar(self.path, prof)
