"""Thin owning wrappers over the C model and context (the middle layer between the
raw binding in ``_native`` and the high-level :class:`powerinfer_backend.Llama`)."""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any

import numpy as np

from .._native import check, ffi, lib
from ..loader import GGUFModel
from .tensors import _fill_tensor, _layer_array, _pred_tensor, _token_ids

#: Bins per neuron of the calibration histograms (see NativeContext.set_ffn_hist).
FFN_HIST_BINS = lib.PI_FFN_HIST_BINS
#: log2 of the lower edge of the first log-spaced bin.
FFN_HIST_MIN_EXP = lib.PI_FFN_HIST_MIN_EXP

_ROPE = {"none": lib.PI_ROPE_NONE, "norm": lib.PI_ROPE_NORM, "neox": lib.PI_ROPE_NEOX}
_ACT = {"silu": lib.PI_ACT_SILU, "gelu": lib.PI_ACT_GELU, "relu": lib.PI_ACT_RELU, "drelu": lib.PI_ACT_DRELU}


def default_threads() -> int:
    """Threads used when none are asked for: the physical cores among the CPUs this
    process may run on (llama.cpp's own default), counting SMT siblings (hyperthreads)
    of one core once: a second thread on a core's sibling mostly competes for the same
    execution units. Falls back to the CPU count where the topology is not readable."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


class NativeModel:
    """A model in the C library over the (memory-mapped) tensors of a loaded GGUF.

    Holds a reference to ``gguf`` so the mapped bytes outlive the C model.

    Raises:
        ValueError: a tensor's type, shape or size does not fit the hyper-parameters.
    """

    def __init__(self, gguf: GGUFModel):
        self.gguf = gguf
        hp = gguf.hparams
        p = ffi.new("pi_model_params *")
        for name in (
            "n_vocab",
            "n_embd",
            "n_layer",
            "n_ff",
            "n_head",
            "n_head_kv",
            "n_embd_head",
            "n_rot",
            "n_ctx_train",
            "rms_eps",
            "rope_freq_base",
            "rope_freq_scale",
            "embd_scale",
            "attn_scale",
            "n_swa",
            "swa_pattern",
            "rope_freq_base_swa",
            "rope_freq_scale_swa",
            "layer_norm",
            "parallel_residual",
            "pos_offset",
        ):
            setattr(p, name, getattr(hp, name))
        p.rope_type = _ROPE[hp.rope_type] if isinstance(hp.rope_type, str) else hp.rope_type
        p.act = _ACT[hp.act] if isinstance(hp.act, str) else hp.act
        for field, view in gguf.global_tensors().items():  # slot names = pi_model_params fields
            _fill_tensor(getattr(p, field), view)
        layers = ffi.new("pi_tensor[]", hp.n_layer * lib.PI_L_COUNT)
        for i in range(hp.n_layer):
            for s, view in enumerate(gguf.layer_tensors(i)):
                _fill_tensor(layers[i * lib.PI_L_COUNT + s], view)
        p.layers = layers
        out = ffi.new("pi_model **")
        check(lib.pi_model_create(p, out), f"{gguf.path}")
        self._ptr = out[0]
        self._contexts: weakref.WeakSet = weakref.WeakSet()  # contexts point into the C model: it must outlive them
        #: bytes :meth:`repack` copied into row groups so far
        self.repacked_bytes = 0
        self._close_requested = False

    @property
    def ptr(self):
        return self._ptr

    #: the matrix slots of a layer the dense products read (enum pi_layer_slot)
    _PRODUCT_SLOTS = ("ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_OUT", "FFN_GATE", "FFN_UP", "FFN_DOWN")

    def repack(self, row_layers: frozenset[int] | set[int] = frozenset()) -> int:
        """Give the dense products their own copy of the weights in row groups (16 rows
        interleaved, as llama.cpp's repacked CPU buffers; ``pi_model_repack``): the Q4_0,
        Q5_0, Q8_0, Q4_K, Q5_K and Q6_K matrices of the attention, the FFN and the output head.
        Their float order is then one rounding per block and row, on every instruction
        set, in decode and in batches alike. The file's pages of each copied tensor are released, so the
        process holds one copy of it (RSS).

        Args:
            row_layers: layers whose ``ffn_gate`` / ``ffn_up`` rows the sparse FFN gathers:
                left in the file's layout (they are read there anyway).

        Returns:
            bytes repacked (0 where no matrix has such a layout: Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K with
            a multiple of 16 rows).

        Raises:
            MemoryError: the copy does not fit. RuntimeError: a context of this model is
            evaluating (the matrices change under it; call before evaluating).
        """
        hp = self.gguf.hparams
        every = sum(1 << getattr(lib, f"PI_L_{s}") for s in self._PRODUCT_SLOTS)
        rows = (1 << lib.PI_L_FFN_GATE) | (1 << lib.PI_L_FFN_UP)
        slots = ffi.new("uint32_t[]", [every & ~rows if i in row_layers else every for i in range(hp.n_layer)])
        mm = getattr(self.gguf, "_mm", None)
        lo = ffi.cast("const void *", mm.ctypes.data) if mm is not None else ffi.NULL
        hi = ffi.cast("const void *", mm.ctypes.data + mm.nbytes) if mm is not None else ffi.NULL
        done = ffi.new("int64_t *")
        with contextlib.ExitStack() as held:  # no context of this model evaluates meanwhile
            for c in [c for c in self._contexts if c.is_open]:
                if not c._busy.acquire(blocking=False):
                    raise RuntimeError(f"{self.gguf.path}: cannot repack while a context of the model is evaluating")
                held.callback(c._busy.release)
            check(lib.pi_model_repack(self._ptr, slots, 1, lo, hi, done), f"{self.gguf.path}: repacking")
        self.repacked_bytes += int(done[0])
        return int(done[0])

    def ffn_repackable(self) -> bool:
        """Whether :meth:`repack` would copy an FFN matrix (``ffn_gate`` / ``ffn_up`` /
        ``ffn_down`` in a type with a row-group layout and a multiple of 16 rows): then the
        dense FFN, the baseline a sparse FFN's speedup is measured against, runs faster."""
        ffn = [lib.PI_L_FFN_GATE, lib.PI_L_FFN_UP, lib.PI_L_FFN_DOWN]
        views = [self.gguf.layer_tensors(i)[s] for i in range(self.gguf.hparams.n_layer) for s in ffn]
        return any(
            v is not None and len(v.ne) == 2 and lib.pi_repack_size(v.type, int(v.ne[1]), int(v.ne[0])) > 0
            for v in views
        )

    def close(self) -> None:
        """Free the C model once no open context uses it (until then the free is deferred)."""
        self._close_requested = True
        if getattr(self, "_ptr", None) is not None and not any(c.is_open for c in self._contexts):
            lib.pi_model_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()


def _require_out_array(a, dtype, shape: tuple, what: str) -> None:
    """Raises ValueError unless ``a`` is a writable C-contiguous ndarray of ``dtype`` and ``shape``
    (an array the C library writes into while it is set)."""
    if (
        not isinstance(a, np.ndarray)
        or a.dtype != dtype
        or a.shape != shape
        or not a.flags.c_contiguous
        or not a.flags.writeable
    ):
        raise ValueError(f"{what} must be a writable C-contiguous {np.dtype(dtype).name} array of shape {shape}")


class NativeContext:
    """A KV cache and compute buffers for ``n_seq_max`` sequences (slots).

    Sequence ``s`` owns cells ``[s * n_ctx_seq, (s + 1) * n_ctx_seq)`` of every layer's cache
    (each slot padded to 64 cells); :meth:`eval_seqs` decodes tokens of several sequences in one
    batched pass (docs/architecture.md, "Sequences"). :meth:`eval`, :attr:`n_past` and
    :meth:`truncate` work on sequence 0.

    Args:
        model: the :class:`NativeModel` (kept alive by the context).
        n_ctx: KV cache length in tokens, all sequences together.
        n_batch: most tokens per native call; longer inputs are split.
        n_threads: compute threads, the calling thread included.
        kv_f16: store K/V as F16 (llama.cpp's default) rather than F32.
        n_seq_max: sequences the context holds, in [1, 256] and <= n_ctx; each gets
            ``n_ctx // n_seq_max`` positions (llama-server's convention).

    Raises:
        ValueError: bad sizes (naming n_ctx, n_batch or n_seq_max). MemoryError: the KV cache does not fit.
    """

    def __init__(
        self, model: NativeModel, *, n_ctx: int, n_batch: int, n_threads: int, kv_f16: bool = True, n_seq_max: int = 1
    ):
        if model.ptr is None:
            raise ValueError("NativeContext: the model is closed")
        self.model = model
        for name, v in (
            ("n_ctx", n_ctx),
            ("n_batch", n_batch),
            ("n_threads", n_threads),
        ):  # the C ints; it checks ranges
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -(2**31) <= v < 2**31:
                raise ValueError(f"NativeContext: {name} must be an integer (int32), got {v!r}")
        self.n_ctx, self.n_batch, self.n_threads = int(n_ctx), int(n_batch), int(n_threads)
        if (
            isinstance(n_seq_max, bool)
            or not isinstance(n_seq_max, (int, np.integer))
            or not 1 <= n_seq_max <= min(lib.PI_SEQ_MAX, self.n_ctx)
        ):
            raise ValueError(
                f"n_seq_max must be an int in [1, min({lib.PI_SEQ_MAX}, n_ctx {self.n_ctx})], got {n_seq_max!r}"
            )
        self.n_vocab = model.gguf.hparams.n_vocab
        self.n_embd = model.gguf.hparams.n_embd
        cp = ffi.new(
            "pi_context_params *",
            {
                "n_ctx": self.n_ctx,
                "n_batch": self.n_batch,
                "n_threads": self.n_threads,
                "kv_type": lib.PI_TYPE_F16 if kv_f16 else lib.PI_TYPE_F32,
                "n_seq_max": int(n_seq_max),
            },
        )
        out = ffi.new("pi_context **")
        check(lib.pi_context_create(model.ptr, cp, out), "creating the context")
        self._raw = out[0]
        self.n_seq_max = int(n_seq_max)
        #: the ggml type of the KV cache (F16 = 1, F32 = 0)
        self.kv_type = int(lib.PI_TYPE_F16 if kv_f16 else lib.PI_TYPE_F32)
        #: positions each sequence holds: n_ctx // n_seq_max
        self.n_ctx_seq = int(lib.pi_n_ctx_seq(self._ptr))
        self._busy = threading.Lock()
        self._down_t: dict[int, Any] = {}  # layer -> transposed down array the C context points into
        self._ffn_thr: dict[int, Any] = {}  # layer -> the threshold set with it
        self._down_dense: set[int] = set()  # layers whose sparse FFN sums down over the GGUF ffn_down
        self._hist: tuple = ()  # the calibration histograms the C context writes into
        self._pred: dict[int, Any] = {}  # layer -> predictor arrays the C context points into
        self._on_gate = False  # set_ffn_threshold_on("gate")
        self._device: Any = None  # the device the C context computes on, kept alive with it
        model._contexts.add(self)
        # the last-token logits buffer never moves (powerinfer.h), so one view serves every eval
        self._last_view = np.frombuffer(
            ffi.buffer(lib.pi_get_logits_buffer(self._ptr), self.n_vocab * 4), dtype=np.float32
        ).reshape(1, self.n_vocab)

    @contextlib.contextmanager
    def _exclusive(self):
        """One native call at a time: a context (KV cache, buffers) is not shareable."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this context is already in use by another thread; use one Llama per thread or serialize the calls"
            )
        try:
            yield
        finally:
            self._busy.release()

    @property
    def n_past(self) -> int:
        """Number of cached positions of sequence 0 (tokens 0..n_past-1 are in the KV cache)."""
        return lib.pi_kv_used(self._ptr)

    def truncate(self, n_keep: int) -> None:
        """Forget sequence 0's cached positions >= n_keep (0 clears it)."""
        with self._exclusive():
            check(lib.pi_kv_truncate(self._ptr, int(n_keep)), "truncating the KV cache")

    def _seq_id(self, seq, what: str) -> int:
        if not isinstance(seq, (int, np.integer)) or isinstance(seq, bool) or not 0 <= seq < self.n_seq_max:
            raise ValueError(f"{what}: seq {seq!r} is outside [0, {self.n_seq_max}) (n_seq_max)")
        return int(seq)

    def seq_n_past(self, seq: int) -> int:
        """Tokens sequence ``seq`` holds (its positions 0..n-1 are cached). Raises ValueError: seq out of range."""
        return int(lib.pi_seq_used(self._ptr, self._seq_id(seq, "seq_n_past")))

    def seq_truncate(self, seq: int, n_keep: int) -> None:
        """Keep the first ``n_keep`` tokens of sequence ``seq`` (0 frees its slot).

        Raises:
            ValueError: seq out of range, n_keep < 0.
        """
        seq = self._seq_id(seq, "seq_truncate")
        with self._exclusive():
            check(lib.pi_seq_truncate(self._ptr, seq, int(n_keep)), "seq_truncate")

    def eval_seqs(self, items, logits_all: bool = False) -> list[np.ndarray]:
        """One batched forward pass over several sequences' new tokens.

        Args:
            items: ``(seq, tokens)`` pairs: ``tokens`` (a non-empty sequence of ids) are appended
                to sequence ``seq`` at its positions ``seq_n_past(seq)``, ... — a prompt chunk or
                one decode token. Each seq at most once; all tokens together at most n_batch.

            logits_all: return every token's logits, not only each item's last.

        Returns:
            per item, in order, a float32 copy of the logits of its last token, shape (n_vocab,);
            with ``logits_all`` of each of its tokens, shape (len(tokens), n_vocab). A sequence's
            logits are bit for bit those it gets evaluated alone.

        Raises:
            ValueError: no items, seq id out of range (n_seq_max), a seq twice, an empty or
                non-integer token list, a token id outside [0, n_vocab), more than n_batch tokens
                in all, or a sequence past n_ctx_seq tokens (slot full). Nothing is evaluated then.
            RuntimeError: the context is in use by another thread.
        """
        items = list(items)
        if not items:
            raise ValueError("eval_seqs: items must hold at least one (seq, tokens) pair")
        seqs, counts, chunks = [], [], []
        seen: dict[int, int] = {}
        for i, item in enumerate(items):
            try:
                seq, tokens = item
            except (TypeError, ValueError):
                raise ValueError(f"eval_seqs: items[{i}] must be a (seq, tokens) pair, got {item!r}") from None
            seq = self._seq_id(seq, f"eval_seqs: items[{i}]")
            if seq in seen:
                raise ValueError(
                    f"eval_seqs: seq {seq} appears in items[{seen[seq]}] and items[{i}] "
                    "(each seq at most once per call)"
                )
            seen[seq] = i
            ids = _token_ids(tokens, f"eval_seqs: items[{i}]", self.n_vocab)
            n_have = int(lib.pi_seq_used(self._ptr, seq))
            if n_have + ids.size > self.n_ctx_seq:
                raise ValueError(
                    f"eval_seqs: items[{i}]: seq {seq} would hold {n_have + ids.size} tokens, more than "
                    f"n_ctx_seq {self.n_ctx_seq} (n_ctx {self.n_ctx} / n_seq_max {self.n_seq_max}); "
                    "the slot is full"
                )
            seqs.append(seq)
            counts.append(ids.size)
            chunks.append(ids)
        total = sum(counts)
        if total > self.n_batch:
            raise ValueError(f"eval_seqs: {total} tokens in all exceed n_batch {self.n_batch}")
        toks = np.concatenate(chunks).astype(np.int32)
        seq_a, cnt_a = np.asarray(seqs, np.int32), np.asarray(counts, np.int32)
        with self._exclusive():
            check(
                lib.pi_eval_seqs(
                    self._ptr,
                    ffi.from_buffer("int32_t[]", toks),
                    ffi.from_buffer("int32_t[]", seq_a),
                    ffi.from_buffer("int32_t[]", cnt_a),
                    len(items),
                    int(bool(logits_all)),
                ),
                "eval_seqs",
            )
            rows = self._logits_view().copy()
        return np.split(rows, np.cumsum(counts)[:-1]) if logits_all else list(rows)

    def set_profile(self, on: bool) -> None:
        """Turn the per-op timer on (counters zeroed) or off. Off by default; while off it
        costs one predictable branch per op (powerinfer.h, ``pi_context_set_profile``).

        Raises:
            MemoryError: its counters cannot be allocated.
        """
        check(lib.pi_context_set_profile(self._ptr, 1 if on else 0), "set_profile")

    def profile(self, reset: bool = False) -> dict[str, tuple[float, int]] | None:
        """Per op kind (``_native.enums.ProfOp`` names, lower case: ``"qkv"``, ``"attn"``,
        ``"ffn_gate_up"``, ...), (milliseconds, calls) of the host forward pass since
        :meth:`set_profile` or the last ``reset``; every layer and token summed. None while
        the timer is off."""
        from .._native.enums import ProfOp

        n = int(ProfOp.COUNT)
        ns, calls = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
        if lib.pi_context_profile(self._ptr, ns, calls, n, 1 if reset else 0) < 0:
            return None
        return {op.name.lower(): (ns[op] / 1e6, int(calls[op])) for op in ProfOp if op is not ProfOp.COUNT}

    def matmul_calls(self, reset: bool = False) -> int:
        """Weight-matrix passes of the host forward pass since creation or the last ``reset``: a
        batched product counts once per weight matrix however many tokens (of however many
        sequences) it serves; a ggml device's passes are not counted (powerinfer.h)."""
        return int(lib.pi_context_matmul_calls(self._ptr, 1 if reset else 0))

    def eval(self, tokens, *, logits_all: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` at positions n_past, n_past+1, ...

        Returns:
            float32 logits, shape (len(tokens), n_vocab) with ``logits_all``, else
            (1, n_vocab) for the last token. Without ``logits_all`` the array is a view of the C
            last-token buffer (no copy): its memory stays valid, its content changes with
            the next eval. With ``logits_all`` it is a copy.

        Raises:
            ValueError: empty input, token id out of range, or context full.
            RuntimeError: the context is in use by another thread.
        """
        with self._exclusive():
            return self._eval(tokens, logits_all)

    def _eval(self, tokens, logits_all: bool) -> np.ndarray:
        toks = _token_ids(tokens, "eval", self.n_vocab)
        if self.n_past + toks.size > self.n_ctx_seq:
            raise ValueError(f"Requested tokens ({self.n_past + toks.size}) exceed context window of {self.n_ctx_seq}")
        rows = []
        for start in range(0, toks.size, self.n_batch):
            chunk = toks[start : start + self.n_batch]
            pos = np.arange(self.n_past, self.n_past + chunk.size, dtype=np.int32)
            last = start + self.n_batch >= toks.size
            mode = 1 if logits_all else 0 if last else -1  # -1: no logits for an earlier prompt chunk
            check(
                lib.pi_eval(
                    self._ptr, ffi.from_buffer("int32_t[]", chunk), ffi.from_buffer("int32_t[]", pos), chunk.size, mode
                ),
                "eval",
            )
            if logits_all:  # copied: a later eval with more rows may reallocate that buffer
                rows.append(self._logits_view().copy())
        if not logits_all:
            return self._last_view
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def _logits_view(self) -> np.ndarray:
        n_out = lib.pi_n_outputs(self._ptr)
        buf = ffi.buffer(lib.pi_get_logits(self._ptr), n_out * self.n_vocab * 4)
        return np.frombuffer(buf, dtype=np.float32).reshape(n_out, self.n_vocab)

    def embeddings(self) -> np.ndarray:
        """Final-norm hidden states of the last eval's output rows, (n_out, n_embd) float32 copy."""
        n_out = lib.pi_n_outputs(self._ptr)
        buf = ffi.buffer(lib.pi_get_embeddings(self._ptr), n_out * self.n_embd * 4)
        return np.frombuffer(buf, dtype=np.float32).reshape(n_out, self.n_embd).copy()

    def set_ffn_sparsity(self, layer: int, down_t, threshold: float = 0.0) -> None:
        """Make layer ``layer``'s FFN sparse in the down-only form: gate and up stay
        dense; the down projection runs over ``down_t`` (the layer's ffn_down
        transposed, shape (n_ff, n_embd): a float32 or float16 ndarray, or a TensorView
        of ne (n_embd, n_ff) in F32, F16, Q8_0 or Q4_0, e.g. a Q8_0 ``transposed_down``) and skips
        neurons with |h| < ``threshold`` (CATS / TEAL-style thresholding; docs/sparsity.md).
        ``down_t=None`` makes the layer dense again. The array is kept alive here.

        Raises:
            ValueError: bad layer, shape or threshold. NotImplementedError: unsupported dtype.
        """
        layer = int(layer)
        keep = self._down_t
        if down_t is None:
            with self._exclusive():
                check(
                    lib.pi_context_set_ffn_sparsity(self._ptr, layer, ffi.NULL, float(threshold)),
                    f"blk.{layer}: dense FFN",
                )
            keep.pop(layer, None)
            self._ffn_thr.pop(layer, None)
            return
        if not isinstance(down_t, np.ndarray):  # a TensorView (e.g. a PowerInfer ffn_down_t)
            t, keep_obj = _pred_tensor(down_t, f"blk.{layer}.ffn_down_t.weight")
            with self._exclusive():
                check(
                    lib.pi_context_set_ffn_sparsity(self._ptr, layer, t, float(threshold)), f"blk.{layer}: sparse FFN"
                )
            keep[layer] = keep_obj
            self._ffn_thr[layer] = float(threshold)
            return
        arr = np.ascontiguousarray(down_t)
        types = {np.dtype(np.float32): lib.PI_TYPE_F32, np.dtype(np.float16): lib.PI_TYPE_F16}
        if arr.dtype not in types:
            raise NotImplementedError(f"blk.{layer}: down_t dtype {arr.dtype}; expected float32 or float16")
        if arr.ndim != 2:
            raise ValueError(f"blk.{layer}: down_t must be 2-D (n_ff, n_embd), got shape {arr.shape}")
        t = ffi.new("pi_tensor *")
        t.data = ffi.from_buffer(arr)
        t.type = types[arr.dtype]
        t.n_dims = 2
        t.ne[0], t.ne[1], t.ne[2], t.ne[3] = arr.shape[1], arr.shape[0], 1, 1
        t.nbytes = arr.nbytes
        with self._exclusive():
            check(lib.pi_context_set_ffn_sparsity(self._ptr, layer, t, float(threshold)), f"blk.{layer}: sparse FFN")
        keep[layer] = arr
        self._ffn_thr[layer] = float(threshold)

    def ffn_down_t_types(self) -> dict:
        """layer -> ggml type name ("F32", "F16", "Q8_0", ...) of the down_t each sparse
        layer runs over (:meth:`set_ffn_sparsity`); dense layers are absent."""
        names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
        return {
            layer: names[v.dtype] if isinstance(v, np.ndarray) else v.type_name
            for layer, v in sorted(self._down_t.items())
        }

    def set_ffn_down_dense(self, layer: int, on: bool) -> None:
        """Sparse layer ``layer`` keeps skipping its skipped neurons' gate/up work, but
        (``on``) its down product is the dense one over the GGUF ffn_down with those
        neurons' h set to 0, instead of the kept rows of down_t: fewer bytes when the
        density times a down_t row exceeds an ffn_down column
        (:func:`~powerinfer_backend.engine.down_cache.dense_down_cheaper`).

        Raises:
            ValueError: bad layer. MemoryError: the h rows cannot be allocated.
        """
        layer = int(layer)
        with self._exclusive():
            check(lib.pi_context_set_ffn_down_dense(self._ptr, layer, 1 if on else 0), f"blk.{layer}: dense down")
        if on:
            self._down_dense.add(layer)
        else:
            self._down_dense.discard(layer)

    def ffn_down_dense_layers(self) -> list:
        """The layers :meth:`set_ffn_down_dense` switched on, increasing."""
        return sorted(self._down_dense)

    def ffn_threshold(self, layer: int) -> float | None:
        """The threshold layer ``layer``'s sparse FFN was set with; None when it is dense."""
        return self._ffn_thr.get(int(layer))

    def ffn_predictor_bytes(self) -> int:
        """Bytes the largest layer's predictor (fc1 + fc2, :meth:`set_ffn_predictor`) reads per
        token; 0 when no layer has one."""
        return max(
            (int(t1.nbytes) + int(t2.nbytes) for _, _, t1, t2 in self.__dict__.get("_pred", {}).values()), default=0
        )

    @property
    def gathered_layers(self) -> frozenset[int]:
        """Layers whose sparse FFN gathers ``ffn_gate`` / ``ffn_up`` rows per token: those with a
        predictor, and the sparse layers of the gate form (:meth:`set_ffn_threshold_on`), of the
        ReLU family and of ungated FFNs. The product form of a gated SwiGLU / GeGLU layer reads every
        row through the dense products instead (``blocks/ffn.c``)."""
        g = self.model.gguf
        every_row = not self._on_gate and g.hparams.act_name in ("silu", "gelu")
        return frozenset(
            i for i in self._down_t if not (every_row and f"blk.{i}.ffn_gate.weight" in g.tensors)
        ) | frozenset(self._pred)

    def has_ffn_sparsity(self, layer: int) -> bool:
        """Whether layer ``layer`` has a sparse FFN (a down_t set by :meth:`set_ffn_sparsity`)."""
        return layer in self._down_t

    @property
    def device(self):
        """The ggml device this context is placed on (:meth:`set_ggml_device`), or None."""
        return self._device

    def hold_device(self, device) -> None:
        """Keep ``device`` alive as long as this context."""
        self._device = device

    def ggml_compute_bytes(self, dev) -> int:
        """Bytes of the compute buffer a placement on ``dev`` (a :class:`~powerinfer_backend.engine.ggml.GgmlDevice`)
        reserves: ggml-alloc's size of the worst-case graphs (n_batch tokens over one slot's cells, every
        layer's attention and an FFN with all n_ff neurons hot, the output block); a constant of (model,
        n_ctx, n_batch, n_seq_max, device)."""
        out = ffi.new("int64_t *")
        check(lib.pi_context_ggml_compute_bytes(self._ptr, dev._live(), out), "ggml compute buffer")
        return int(out[0])

    def set_ggml_device(
        self, dev, layers, output_on_device: bool, budget_bytes: int, *, device_skips: bool = False
    ) -> None:
        """Place ``layers`` (per layer an object with ``attn_on_device`` and ``hot_ids``, e.g. a plan's
        LayerPlan list) and the output block (``output_on_device``) on the ggml device ``dev``: copies now
        into three ggml buffers (:meth:`ggml_buffers`); from then on each eval runs the placed attention
        blocks and output block on ``dev`` and splits hot layers' FFNs (the device's hot neurons on its
        thread, the cold ones here at once). Hot layers need :meth:`set_ffn_sparsity` first. Once per
        context; ``dev`` is kept alive with the context.

        Raises:
            MemoryError: weights + kv + compute exceed ``budget_bytes`` or the device's free memory (both
                counts named; nothing is allocated). ValueError: bad layers or hot ids, no down_t.
            NotImplementedError: what cannot be placed (ungated layers, a fused attn_qkv).

        With ``n_seq_max`` > 1 the device's KV holds every slot and each device step runs once per
        sequence of the batch: a sequence gets the bits it gets alone (a context of n_ctx_seq with
        the same placement, device and threads).

        With ``device_skips``, a split layer (some of its neurons on each side) that has its
        predictor (:meth:`set_ffn_predictor`, set before placing) scores every neuron before the
        device starts, and the device computes only the hot neurons the predictor selects: a
        token alone reads only their gate and up rows (``ggml_mul_mat_id``), a batch reads every
        row once and zeroes the others' h; the layer then computes what the CPU engine with that
        predictor computes (PowerInfer, SOSP'24, section 5: GPU neurons are predicted too). Without
        it the device computes every hot neuron and the predictor only picks cold ones.
        """
        arr, _keep = _layer_array(layers, device_skips)
        if len(layers) != self.model.gguf.hparams.n_layer:
            raise ValueError(f"set_ggml_device: {len(layers)} layers, the model has {self.model.gguf.hparams.n_layer}")
        with self._exclusive():
            check(
                lib.pi_context_set_ggml_device(
                    self._ptr, dev._live(), arr, int(bool(output_on_device)), int(budget_bytes)
                ),
                f"placing the model on ggml device {dev.name}",
            )
        self._device = dev
        dev._contexts.add(self)

    def ggml_buffers(self) -> dict[str, int]:
        """Bytes of the ggml buffers the placement allocated: ``weights``, ``kv``, ``compute``."""
        out = ffi.new("pi_gdev_buffers *")
        check(lib.pi_context_ggml_buffers(self._ptr, out), "ggml buffers")
        return {"weights": int(out.weights), "kv": int(out.kv), "compute": int(out.compute)}

    def set_ffn_predictor(self, layer: int, fc1, fc2=None, threshold: float = 0.0) -> None:
        """Give layer ``layer`` an activation predictor (docs/predictors.md): only
        neurons with ``fc2 . relu(fc1 . x) >= threshold`` are computed. ``fc1``/``fc2``:
        float32/float16 ndarrays of shapes (rank, n_embd) and (n_ff, rank), or
        :class:`~powerinfer_backend.loader.TensorView` (any kernel type). The layer
        must also be made sparse with :meth:`set_ffn_sparsity` (the down_t). ``fc1=None``
        removes the predictor. The arrays are kept alive here.

        Raises:
            ValueError: bad layer, shape, rank or threshold (naming ``blk.N.fc1.weight``
                or ``blk.N.fc2.weight``).
        """
        layer = int(layer)
        keep = self.__dict__.setdefault("_pred", {})
        if fc1 is None:
            with self._exclusive():
                check(
                    lib.pi_context_set_ffn_predictor(self._ptr, layer, ffi.NULL, ffi.NULL, 0.0),
                    f"blk.{layer}: predictor",
                )
            keep.pop(layer, None)
            return
        t1, a1 = _pred_tensor(fc1, f"blk.{layer}.fc1.weight")
        t2, a2 = _pred_tensor(fc2, f"blk.{layer}.fc2.weight")
        with self._exclusive():
            check(
                lib.pi_context_set_ffn_predictor(self._ptr, layer, t1, t2, float(threshold)), f"blk.{layer}: predictor"
            )
        keep[layer] = (a1, a2, t1, t2)

    def set_ffn_capture(self, buf) -> None:
        """Start (``None``: stop) copying every layer's normed FFN input rows into
        ``buf``, a writable C-contiguous float32 array of shape (n_layer, n_batch, n_embd)
        kept alive here: after an eval of n tokens, ``buf[:, :n]`` holds them."""
        if buf is None:
            with self._exclusive():
                check(lib.pi_context_set_ffn_capture(self._ptr, ffi.NULL), "ffn_capture")
            self._capture = None
            return
        hp = self.model.gguf.hparams
        _require_out_array(buf, np.float32, (hp.n_layer, self.n_batch, hp.n_embd), "ffn capture buffer")
        with self._exclusive():
            check(lib.pi_context_set_ffn_capture(self._ptr, ffi.cast("float *", ffi.from_buffer(buf))), "ffn_capture")
        self._capture = buf

    def predictor_stats(self, reset: bool = False) -> dict:
        """Per-layer int64 arrays since the last reset: ``predicted`` (neurons
        predicted active, summed over tokens), ``pred_ns`` (time in the predictor),
        ``ffn_ns`` (time in the sparse FFN of predictor layers, predictor included)."""
        n = self.model.gguf.hparams.n_layer
        out = {k: np.zeros(n, np.int64) for k in ("predicted", "pred_ns", "ffn_ns")}
        check(
            lib.pi_context_predictor_stats(
                self._ptr,
                *(ffi.from_buffer("int64_t[]", out[k]) for k in ("predicted", "pred_ns", "ffn_ns")),
                1 if reset else 0,
            ),
            "predictor_stats",
        )
        return out

    def set_ffn_threshold_on(self, target: str) -> None:
        """What every layer's sparse-FFN threshold compares against: ``"product"``
        (default; |h| = |act(gate x) * up x|, the down-only form) or ``"gate"``
        (|act(gate x)|, CATS: a neuron below it skips its up row too). Also what
        :meth:`set_ffn_hist` records. Raises ValueError for another value."""
        if target not in ("product", "gate"):
            raise ValueError(f"threshold target must be 'product' or 'gate', got {target!r}")
        with self._exclusive():
            check(
                lib.pi_context_set_ffn_threshold_on(
                    self._ptr, lib.PI_FFN_ON_GATE if target == "gate" else lib.PI_FFN_ON_PRODUCT
                ),
                "threshold target",
            )
        self._on_gate = target == "gate"

    def set_ffn_hist(self, hist) -> None:
        """Start (or with ``None`` stop) collecting per-neuron |h| histograms for
        calibration (``pi_context_set_ffn_hist``): every dense FFN layer adds each
        evaluated token's activation magnitudes to ``hist``, a C-contiguous uint32
        ndarray of shape (n_layer, n_ff, FFN_HIST_BINS) that this context keeps
        alive while set. Bin edges: :func:`powerinfer_backend.sparsity.calibrate.hist_edges`.

        Raises:
            ValueError: wrong shape, dtype or layout.
        """
        self._set_hists(lib.pi_context_set_ffn_hist, hist)

    def set_ffn_hists(self, product, gate) -> None:
        """Collect both forms' histograms in one pass (``pi_context_set_ffn_hist2``):
        |h| into ``product`` and |act(gate x)| into ``gate``, whatever
        :meth:`set_ffn_threshold_on` says; either may be ``None``, both ``None`` stops.
        Same arrays and errors as :meth:`set_ffn_hist`, which this replaces (and which
        replaces this)."""
        self._set_hists(lib.pi_context_set_ffn_hist2, product, gate)

    def _set_hists(self, fn, *hists) -> None:
        hp = self.model.gguf.hparams
        for hist in hists:
            if hist is not None:
                _require_out_array(hist, np.uint32, (hp.n_layer, hp.n_ff, FFN_HIST_BINS), "ffn hist")
        ptrs = [ffi.NULL if h is None else ffi.from_buffer("uint32_t[]", h) for h in hists]
        with self._exclusive():
            check(fn(self._ptr, *ptrs), "ffn_hist")
        self._hist = tuple(hists)  # kept alive while the context may write them

    def ffn_stats(self, reset: bool = False, per_layer: bool = False) -> tuple:
        """Neurons used in sparse down projections and neurons those layers have,
        summed over tokens since the last reset: ``(used, total)`` as ints, or with
        ``per_layer`` two int64 ndarrays of shape (n_layer,). Dense layers count 0/0."""
        n = self.model.gguf.hparams.n_layer
        used, total = np.zeros(n, np.int64), np.zeros(n, np.int64)
        check(
            lib.pi_context_ffn_stats(
                self._ptr, ffi.from_buffer("int64_t[]", used), ffi.from_buffer("int64_t[]", total), 1 if reset else 0
            ),
            "ffn_stats",
        )
        return (used, total) if per_layer else (int(used.sum()), int(total.sum()))

    @property
    def is_open(self) -> bool:
        return self.__dict__.get("_raw") is not None

    @property
    def _ptr(self):
        """The C context; RuntimeError once closed (a call would otherwise pass NULL)."""
        p = self.__dict__.get("_raw")
        if p is None:
            raise RuntimeError(
                "NativeContext: the context is closed (close() was called, or the Llama that owned it was closed "
                "or garbage-collected)"
            )
        return p

    def close(self) -> None:
        """Free the context; waits for an eval running in another thread to finish."""
        if not self.is_open:
            return
        with self._busy:
            lib.pi_context_free(self._raw)
            self._raw = None
        if self.model._close_requested:
            self.model.close()
        if getattr(self._device, "_close_requested", False):  # a ggml device closed while placed here
            self._device.close()

    def __del__(self):
        self.close()
