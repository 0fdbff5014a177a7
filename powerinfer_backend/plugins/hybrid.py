"""The built-in ``"hybrid"`` backend: the native engine over a memory-mapped GGUF.
Registered through the ``powerinfer_backend`` entry-point group like any third-party
backend. With a device (``vram_budget``, ``device``) part of the model runs there under a
placement plan (:mod:`powerinfer_backend.hybrid.offload`)."""

from __future__ import annotations

import sys

import numpy as np

from ..hybrid import offload as offload_mod
from ..sparsity import modes as sparsity
from ..engine.native import NativeContext, NativeModel, default_threads
from ..loader import load_gguf
from .hookspecs import hookimpl


class HybridBackend:
    """Native engine (see hookspecs for the interface): ``eval`` / ``truncate`` / ``n_past`` on
    sequence 0 of a context of ``n_seq_max`` sequences (:attr:`native_context`); the device
    options are :func:`powerinfer_backend.hybrid.offload.offload`'s."""

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_threads=None,
        vram_budget=None,
        verbose: bool = True,
        sparse="auto",
        n_gpu_layers=None,
        device=None,
        placement: str = "auto",
        device_threads: int = 1,
        reset_gpu_index: bool = False,
        disable_gpu_index: bool = False,
        n_seq_max: int = 1,
        device_bandwidth=None,
        device_skips=None,
        repack: bool = True,
        **_ignored,
    ):
        self.gguf = load_gguf(model_path, verbose=verbose)
        hp = self.gguf.hparams
        self.n_vocab, self.n_embd, self.n_ctx_train = hp.n_vocab, hp.n_embd, hp.n_ctx_train
        self.metadata = dict(self.gguf.metadata)
        self.notices: list[str] = []  # warnings Llama raises at the caller's line
        self.max_positions = self.gguf.max_positions
        self.n_ctx = int(n_ctx) if n_ctx else self.max_positions
        if self.n_ctx > self.max_positions and self.gguf.global_tensors().get("pos_embd") is not None:
            # learned absolute positions (OPT) end with the table: no position past it exists
            self.notices.append(
                f"n_ctx {self.n_ctx} exceeds the model's {self.max_positions} learned positions "
                f"(position_embd.weight); using n_ctx {self.max_positions}"
            )
            self.n_ctx = self.max_positions
        self.n_threads = int(n_threads) if n_threads else default_threads()
        self.model = NativeModel(self.gguf)
        self.ctx = NativeContext(
            self.model,
            n_ctx=self.n_ctx,
            n_batch=max(1, min(int(n_batch), self.n_ctx)),
            n_threads=self.n_threads,
            n_seq_max=n_seq_max,
        )
        self.n_ctx_seq = self.ctx.n_ctx_seq  # sequence 0's window: eval / truncate / n_past
        try:
            # row groups (below) unless a device takes the model; known after the placement,
            # so "auto" assumes them wherever they would make the dense FFN faster
            self.sparse = sparsity.configure(
                self.ctx, self.gguf, model_path, sparse, row_groups=repack and self.model.ffn_repackable()
            )
            self.notices += self.sparse.notices
            # the hot neurons ranked by the sidecar the sparse FFN runs (a PowerInfer file's
            # own predictors name the model itself: then the files beside it, as by default)
            sc = self.sparse.sidecar
            ranking = sc if sc is not None and sc not in (model_path, self.gguf.path) else "auto"
            self.offload = offload_mod.offload(
                self.ctx,
                model_path,
                vram_budget=vram_budget,
                n_gpu_layers=n_gpu_layers,
                device=device,
                placement=placement,
                device_threads=device_threads,
                reset_gpu_index=reset_gpu_index,
                disable_gpu_index=disable_gpu_index,
                device_bandwidth=device_bandwidth,
                sparsity_sidecar=ranking,
                device_skips=device_skips,
                verbose=verbose,
            )
            self.notices += self.offload.notices
            # the dense products in row groups where their types have them (CPU only: a device
            # reads the file's rows)
            self.repacked = self.model.repack(self.ctx.gathered_layers) if repack and self.offload.device is None else 0
            if self.offload.plan is not None and self.sparse.mode == "dense":
                # the split computes every FFN over the transposed down: say so in stats()
                self.sparse = sparsity.SparseState("exact", np.zeros(hp.n_layer, np.float32))
        except BaseException:
            self.close()
            raise
        if verbose:
            from .._native import isa_name

            print(
                f"powerinfer_backend: n_ctx {self.n_ctx}, n_threads {self.n_threads}, kernels {isa_name()}"
                f"{f' (repacked {self.repacked / 2**20:.0f} MiB)' if self.repacked else ''}; "
                f"{self.sparse.summary()}; {self.offload.summary()}",
                file=sys.stderr,
            )

    def stats(self, reset: bool = False) -> dict:
        """Measured FFN sparsity since the last reset (:func:`powerinfer_backend.sparsity.modes.stats`),
        and with a device its memory under ``"device"``
        (:meth:`powerinfer_backend.hybrid.offload.Offload.stats`: kind, name, reserved, used,
        high_water, buffers)."""
        out = sparsity.stats(self.ctx, self.sparse, reset=reset)
        if self.offload.device is not None:
            out["device"] = self.offload.stats()
        return out

    @property
    def native_context(self) -> NativeContext:
        """The context (its ``eval_seqs`` serves several sequences; Llama.native_context)."""
        return self.ctx

    @property
    def n_past(self) -> int:
        return self.ctx.n_past

    def eval(self, tokens, logits_all: bool = False):
        return self.ctx.eval(tokens, logits_all=logits_all)

    def embeddings(self):
        return self.ctx.embeddings()

    def truncate(self, n_keep: int) -> None:
        self.ctx.truncate(n_keep)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
        off = getattr(self, "offload", None)
        if off is not None:
            off.close()  # the device after the context placed on it


@hookimpl
def powerinfer_backend_register():
    return {"hybrid": HybridBackend}
