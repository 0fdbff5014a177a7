"""Byte arithmetic of placement: a model's tensor sizes in their stored types
(:class:`ModelSizes`, :class:`TensorSize`) and the exact device bytes of every block a
plan may put on the device, by a *sizer* (:class:`Sizer`): the rule of the device's
ggml buffer type for one tensor's bytes and its alignment, and the compute buffer a
context reserves there.

The device memory layout counted here is the one the ggml device allocates
(docs/placement.md, "Byte accounting"), three ggml buffers:

* ``weights``: per layer with its attention block on the device, every tensor of the
  layer except ffn_gate/ffn_up/ffn_down, in its GGUF type and shape; per layer with
  n_hot > 0, the hot gate rows [n_embd, n_hot] and up rows [n_embd, n_hot] in their
  GGUF types and the hot down columns (:func:`down_cols`: Q8_0 [n_hot rounded up to 32,
  n_embd] for a quantized ffn_down, F16 [n_hot, n_embd] for an unquantized one; with every
  neuron hot, a whole layer, ffn_down [n_ff, n_embd] in its GGUF type; none for a layer whose
  whole down product the host sums, :meth:`ModelSizes.host_down`); with the output block,
  output_norm and the output matrix (tok_embd when tied);
* ``kv``: per layer with its attention block on the device, K and V caches of
  [n_embd_kv, n_cells] in the context's KV type (``ModelSizes.kv_type``: F16 by default, F32
  for a context made with ``kv_f16=False``; n_cells = n_ctx rounded up to :data:`KV_PAD`; with
  ``n_seq_max`` > 1 sequences, n_seq_max slots of n_ctx // n_seq_max cells each rounded up,
  :func:`kv_cells`, as the sizer of a context says);
* ``compute``: the context's compute buffer (graph scratch) on that device.

Each tensor takes ``align_up(sizer.tensor_bytes(type, ne0, rows), sizer.alignment)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Mapping, Protocol

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = [
    "KiB",
    "MiB",
    "GiB",
    "TiB",
    "NEURON_GROUP",
    "KV_PAD",
    "KV_TYPE",
    "KV_ELEM_BYTES",
    "ACT_BYTES",
    "CPU_ALIGN",
    "Sizer",
    "BufferRule",
    "CPU_BUFT",
    "TensorSize",
    "ModelSizes",
    "align_up",
    "row_bytes",
    "tensor_device_bytes",
    "compute_bytes",
    "scratch_bytes",
    "kv_bytes_per_layer",
    "dense_weight_bytes",
    "attn_block_bytes",
    "output_block_bytes",
    "neuron_bytes",
    "down_cols",
    "hot_bytes",
    "layer_bytes",
    "full_device_bytes",
    "kv_cells",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
#: Neurons per knapsack group (one quantization block's worth of rows).
NEURON_GROUP = 32
#: The KV cache holds a multiple of this many positions (PI_KV_PAD in native/src/pi_internal.h).
KV_PAD = 64

_T = GGMLQuantizationType
_F32 = int(_T.F32)
_F16 = int(_T.F16)
_Q8_0 = int(_T.Q8_0)
_UNQUANTIZED = {_F32, _F16, int(_T.BF16)}
#: the KV cache's element type of a context by default (``ModelSizes.kv_type``)
KV_TYPE = _F16
#: ggml's CPU buffer type alignment (TENSOR_ALIGNMENT; ggml_backend_buft_get_alignment of
#: ggml_backend_cpu_buffer_type() on llama-cpp-python 0.3.36 / ggml 0.25.3)
CPU_ALIGN = 32
#: Bytes per KV cache element of the default type (F16) and per F32 activation element
#: (the plan counts the KV through a sizer, in ``ModelSizes.kv_type``).
KV_ELEM_BYTES = 2
ACT_BYTES = 4
#: Per-layer slots placed neuron by neuron (hot rows), not as part of the dense block.
_FFN_ROW_SLOTS = ("ffn_gate", "ffn_up", "ffn_down")


def align_up(n: int, align: int) -> int:
    """``n`` bytes rounded up to a multiple of ``align`` (0 stays 0)."""
    return -(-int(n) // align) * align


@functools.lru_cache(maxsize=4096)  # the planners ask for the same few (type, n) many times
def row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of ``n`` elements of ggml type ``ggml_type`` (whole blocks).

    Raises:
        ValueError: unknown type, or ``n`` not a multiple of the type's block size.
    """
    try:
        block, size = GGML_QUANT_SIZES[_T(int(ggml_type))]
    except (ValueError, KeyError) as e:
        raise ValueError(f"unknown ggml type id {ggml_type}") from e
    if n % block:
        raise ValueError(f"{n} elements are not a whole number of {_T(int(ggml_type)).name} blocks of {block}")
    return n // block * size


class Sizer(Protocol):
    """How many bytes a device's ggml buffers take (see the module docstring).

    Attributes:
        name: the buffer rule's name, part of the plan cache key (the ggml device's name
            for a device, ``"ggml-cpu-buft"`` for :data:`CPU_BUFT`).
        alignment: bytes every tensor of a buffer is rounded up to.
        exact: the compute bytes are the device's own count (False: an estimate).
    """

    # read-only properties, so a frozen dataclass (BufferRule) is a Sizer too
    @property
    def name(self) -> str: ...

    @property
    def alignment(self) -> int: ...

    @property
    def exact(self) -> bool: ...

    def tensor_bytes(self, ggml_type: int, ne0: int, ne1: int = 1) -> int:
        """Bytes the buffer type allocates for a [ne0, ne1] tensor (before alignment)."""

    def compute_bytes(self, sizes: "ModelSizes", n_ctx: int, n_batch: int) -> int:
        """The context's compute buffer on the device (bytes)."""


@dataclass(frozen=True)
class BufferRule:
    """The pure-Python sizer: ggml's CPU buffer type rule (a tensor takes ggml_nbytes,
    no row padding; alignment :data:`CPU_ALIGN`), for planning without a device
    (``powerinfer-backend plan`` without a GPU). Its compute bytes are an estimate (the
    F32 activations of the worst-case graph); a plan run on a device is made with that
    device's sizer (:class:`powerinfer_backend.hybrid.devices.select.DeviceSizer`)."""

    name: str = "ggml-cpu-buft"
    alignment: int = CPU_ALIGN
    exact: bool = False

    def tensor_bytes(self, ggml_type: int, ne0: int, ne1: int = 1) -> int:
        return row_bytes(ggml_type, int(ne0)) * int(ne1)

    def compute_bytes(self, s: "ModelSizes", n_ctx: int, n_batch: int) -> int:
        """Estimate: per token F32 x, residual and norm output (n_embd), q and the attention
        output (n_embd_q), k and v (n_embd_kv), gate and up of n_ff neurons, the scores and
        softmax of n_head x n_cells, and the logits (n_vocab)."""
        per_tok = (
            3 * s.n_embd + 2 * s.n_embd_q + 2 * s.n_embd_kv + 2 * s.n_ff + 2 * s.n_head * _n_cells(n_ctx) + s.n_vocab
        )
        return align_up(4 * int(n_batch) * per_tok, self.alignment)


#: the default sizer (ggml's CPU buffer type, estimated compute bytes)
CPU_BUFT = BufferRule()


@dataclass(frozen=True)
class TensorSize:
    """One tensor's stored type and shape.

    Attributes:
        type: ggml type id as held in memory (after any load-time conversion).
        ne: elements per dimension, GGUF order (``ne[0]`` = row length).
    """

    type: int
    ne: tuple[int, ...]

    @property
    def rows(self) -> int:
        return math.prod(self.ne[1:])

    @property
    def nbytes(self) -> int:
        """Bytes in the stored type: rows x :func:`row_bytes`."""
        return row_bytes(self.type, self.ne[0]) * self.rows


def tensor_device_bytes(t: TensorSize, sizer: Sizer = CPU_BUFT) -> int:
    """Bytes ``t`` takes in a device buffer: the buffer type's size, aligned."""
    return align_up(sizer.tensor_bytes(t.type, t.ne[0], t.rows), sizer.alignment)


@dataclass(frozen=True)
class ModelSizes:
    """What placement needs to know about a model: dimensions and tensor sizes.

    Attributes:
        n_layer, n_embd, n_ff, n_head, n_head_kv, n_embd_head, n_vocab: hyper-parameters.
        layers: per layer, slot name (:data:`arch.LAYER_SLOTS`) -> :class:`TensorSize`.
        output_norm: F32 [n_embd].
        output: the output projection [n_embd, n_vocab] (the token embedding when tied).
        down_t_type: the type of the CPU's transposed down cache in a device split: the
            CPU-only engine's (:func:`powerinfer_backend.engine.down_cache.down_t_dtype`;
            "" when constructed: ``cpu_down_t_type``), so a split layer's host reads no more
            than CPU-only's; ``down_t_row_bytes`` gives a neuron's row.
        cpu_down_t_type: the down_t type of the CPU-only engine's sparse modes
            (``down_t_dtype(model)``: Q8_0 for quantized files), which a layer with no
            neuron on the device keeps under a placement.
        kv_type: the ggml type of the context's KV cache (:data:`KV_TYPE`, F16; F32 for a
            context made with ``kv_f16=False``: :meth:`of_context`).
        host_down_from: per layer, the fewest cold neurons at which a layer with neurons on
            the device sums its whole down product on the host, over the GGUF ffn_down, the
            device giving only its hot neurons' gate and up products (:meth:`host_down`). By
            default (a layer the engine runs dense) where the cold neurons' down_t rows
            (``down_t_type``) would read more bytes than ffn_down: ffn_down bytes // down_t
            row + 1. :meth:`of_context`: 0 for a layer a sparse mode set to a dense down
            (``set_ffn_down_dense``), n_ff + 1 (never) for another sparse layer.
    """

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head: int
    n_vocab: int
    layers: tuple[Mapping[str, TensorSize], ...]
    output_norm: TensorSize
    output: TensorSize
    down_t_type: str = ""
    cpu_down_t_type: str = "f16"
    kv_type: int = KV_TYPE
    host_down_from: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.down_t_type:  # the split's host rows are the CPU-only engine's
            object.__setattr__(self, "down_t_type", self.cpu_down_t_type)
        if not self.host_down_from:
            object.__setattr__(self, "host_down_from", tuple(self.dense_host_down_from(i) for i in range(self.n_layer)))
        if len(self.host_down_from) != self.n_layer:
            raise ValueError(f"host_down_from has {len(self.host_down_from)} layers, the model {self.n_layer}")

    def dense_host_down_from(self, i: int) -> int:
        """Layer ``i``'s :attr:`host_down_from` where the engine runs it dense: the fewest cold
        neurons whose down_t rows read more bytes than the GGUF ffn_down."""
        from ...engine.down_cache import down_t_row_bytes

        return self.layers[i]["ffn_down"].nbytes // down_t_row_bytes(self.down_t_type, self.n_embd) + 1

    def sparse_ffn(self) -> "ModelSizes":
        """These sizes with every layer's FFN sparse over its down_t, as a sparse mode (relu,
        threshold, predictor) runs them: no split layer's down summed on the host."""
        return replace(self, host_down_from=(self.n_ff + 1,) * self.n_layer)

    def for_mode(self, mode: str) -> "ModelSizes":
        """These sizes as the engine runs the cost model's ``mode``: "dense" as they are, a
        sparse mode (relu, threshold, predictor) with every FFN sparse (:meth:`sparse_ffn`)."""
        return self if mode == "dense" else self.sparse_ffn()

    def host_down(self, i: int, n_hot: int) -> bool:
        """Whether layer ``i`` with ``n_hot`` neurons on the device sums its whole down product
        on the host (its device holds no down columns; :attr:`host_down_from`)."""
        return 0 < n_hot and self.n_ff - n_hot >= self.host_down_from[i]

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.n_embd_head

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.n_embd_head

    @classmethod
    def from_gguf(cls, model, down_t_type: str | None = None) -> "ModelSizes":
        """Sizes of a :class:`powerinfer_backend.loader.GGUFModel` (types as loaded);
        ``down_t_type`` None: the CPU-only engine's (``down_t_dtype(model)``)."""
        from ...engine.down_cache import down_t_dtype
        from ...loader.arch import LAYER_SLOTS

        hp = model.hparams
        layers = []
        for i in range(hp.n_layer):
            layers.append(
                {
                    slot: TensorSize(int(t.type), tuple(int(x) for x in t.ne))
                    for slot, t in zip(LAYER_SLOTS, model.layer_tensors(i))
                    if t is not None
                }
            )  # optional slots an architecture lacks
        g = model.global_tensors()
        out = g["output"] if g["output"] is not None else g["tok_embd"]
        return cls(
            n_layer=hp.n_layer,
            n_embd=hp.n_embd,
            n_ff=hp.n_ff,
            n_head=hp.n_head,
            n_head_kv=hp.n_head_kv,
            n_embd_head=hp.n_embd_head,
            n_vocab=hp.n_vocab,
            layers=tuple(layers),
            output_norm=TensorSize(int(g["output_norm"].type), tuple(g["output_norm"].ne)),
            output=TensorSize(int(out.type), tuple(int(x) for x in out.ne)),
            down_t_type=down_t_type or "",
            cpu_down_t_type=down_t_dtype(model),
        )

    @classmethod
    def of_context(cls, ctx) -> "ModelSizes":
        """Sizes of the model of ``ctx`` (a :class:`powerinfer_backend.engine.native.NativeContext`)
        as that context holds it: its KV type, and which layers' down the host sums once split
        (:attr:`host_down_from`, from the FFN modes set on ``ctx``)."""
        s = cls.from_gguf(ctx.model.gguf)
        dense = set(ctx.ffn_down_dense_layers())
        never = s.n_ff + 1
        host_down_from = tuple(
            0 if i in dense else never if ctx.has_ffn_sparsity(i) else s.host_down_from[i] for i in range(s.n_layer)
        )
        return replace(s, kv_type=int(ctx.kv_type), host_down_from=host_down_from)


def _n_cells(n_ctx: int) -> int:
    return -(-int(n_ctx) // KV_PAD) * KV_PAD


def compute_bytes(s: ModelSizes, n_ctx: int, n_batch: int, sizer: Sizer = CPU_BUFT) -> int:
    """The compute buffer on the device (bytes), counted once when anything is placed."""
    return int(sizer.compute_bytes(s, n_ctx, n_batch))


#: the name before issue 14 (device scratch then; the compute buffer now)
scratch_bytes = compute_bytes


def kv_cells(n_ctx: int, n_seq_max: int = 1) -> int:
    """Cells of a context's KV cache: ``n_seq_max`` slots of ``n_ctx // n_seq_max`` positions,
    each rounded up to :data:`KV_PAD` (one sequence: n_ctx rounded up)."""
    return int(n_seq_max) * _n_cells(int(n_ctx) // int(n_seq_max))


def _sizer_cells(n_ctx: int, sizer) -> int:
    """The KV cells a sizer counts for ``n_ctx``: its own ``kv_cells`` (a device sizer knows its
    context's sequences), else one sequence's."""
    own = getattr(sizer, "kv_cells", None)
    return int(own(n_ctx)) if own is not None else _n_cells(n_ctx)


def kv_bytes_per_layer(s: ModelSizes, n_ctx: int, sizer: Sizer = CPU_BUFT) -> int:
    """One layer's KV cache (bytes): K and V, each [n_embd_kv, n_cells] in ``s.kv_type``
    (n_cells: :func:`kv_cells`, of one sequence unless ``sizer`` has a ``kv_cells(n_ctx)`` of
    its own), each aligned."""
    return 2 * align_up(sizer.tensor_bytes(s.kv_type, s.n_embd_kv, _sizer_cells(n_ctx, sizer)), sizer.alignment)


def dense_weight_bytes(s: ModelSizes, i: int, sizer: Sizer = CPU_BUFT) -> int:
    """Layer ``i``'s dense tensors on the device (bytes): every slot the layer has except
    ffn_gate/ffn_up/ffn_down (norms, q/k/v/o, biases, q/k norms, post norms), each aligned."""
    return sum(tensor_device_bytes(t, sizer) for slot, t in s.layers[i].items() if slot not in _FFN_ROW_SLOTS)


def attn_block_bytes(s: ModelSizes, i: int, n_ctx: int, sizer: Sizer = CPU_BUFT) -> int:
    """Layer ``i``'s attention block on the device: its dense tensors and its KV cache."""
    return dense_weight_bytes(s, i, sizer) + kv_bytes_per_layer(s, n_ctx, sizer)


def output_block_bytes(s: ModelSizes, n_batch: int | None = None, sizer: Sizer = CPU_BUFT) -> int:
    """The output block (bytes): output_norm and the output projection (the token
    embedding when tied) in their stored types, each aligned (the logits live in the
    compute buffer; ``n_batch`` is accepted for older callers and unused)."""
    return tensor_device_bytes(s.output_norm, sizer) + tensor_device_bytes(s.output, sizer)


def down_cols(s: ModelSizes, i: int, n_hot: int) -> tuple[int, int]:
    """(ggml type, ne0) of layer ``i``'s gathered hot down columns on the device, a
    [ne0, n_embd] tensor: a quantized ffn_down gives Q8_0 with ne0 = ``n_hot`` rounded up
    to a whole block of 32 (zero columns; the graph pads h with zeros to match), an
    unquantized one F16 with ne0 = ``n_hot`` (a column gather cannot keep the file's
    blocks, which run along n_ff)."""
    if s.layers[i]["ffn_down"].type in _UNQUANTIZED:
        return _F16, int(n_hot)
    return _Q8_0, align_up(n_hot, 32)


def neuron_bytes(s: ModelSizes, i: int) -> tuple[int, int, int]:
    """Bytes of one hot neuron in layer ``i`` before alignment: (gate row, up row, down
    column) — gate and up rows of n_embd in their stored types (gate 0 without one), the
    down column of n_embd in :func:`down_cols`' type (Q8_0: 34 bytes per 32 weights,
    rounded up). The knapsack's cost per neuron."""
    L = s.layers[i]
    gate = row_bytes(L["ffn_gate"].type, s.n_embd) if "ffn_gate" in L else 0  # ungated FFN (Falcon, OPT)
    dt = down_cols(s, i, 1)[0]
    down = row_bytes(_F16, s.n_embd) if dt == _F16 else -(-row_bytes(dt, 32) * s.n_embd // 32)
    return (gate, row_bytes(L["ffn_up"].type, s.n_embd), down)


def hot_bytes(s: ModelSizes, i: int, n_hot: int, sizer: Sizer = CPU_BUFT) -> int:
    """Device bytes of layer ``i``'s ``n_hot`` hot neurons: gate rows [n_embd, n_hot] and up
    rows [n_embd, n_hot] in their stored types, down columns (:func:`down_cols`), each
    aligned (0 for 0 neurons); all n_ff (a whole layer's FFN): the three tensors as stored
    (ffn_down needs no column gather, so it keeps its GGUF type, as llama.cpp's split). No
    down where the host sums the layer's down (:meth:`ModelSizes.host_down`)."""
    if n_hot <= 0:
        return 0
    L, a = s.layers[i], sizer.alignment
    slots = _FFN_ROW_SLOTS[:2] if s.host_down(i, n_hot) else _FFN_ROW_SLOTS
    if n_hot >= s.n_ff:
        return sum(tensor_device_bytes(L[slot], sizer) for slot in slots if slot in L)
    rows = sum(align_up(sizer.tensor_bytes(L[slot].type, s.n_embd, n_hot), a) for slot in slots[:2] if slot in L)
    if len(slots) < 3:
        return rows
    dt, ne0 = down_cols(s, i, n_hot)
    return rows + align_up(sizer.tensor_bytes(dt, ne0, s.n_embd), a)


def layer_bytes(s: ModelSizes, i: int, n_ctx: int, sizer: Sizer = CPU_BUFT) -> int:
    """Layer ``i`` whole on the device: its attention block, KV cache and all n_ff neurons."""
    return attn_block_bytes(s, i, n_ctx, sizer) + hot_bytes(s, i, s.n_ff, sizer)


def full_device_bytes(s: ModelSizes, n_ctx: int, n_batch: int, sizer: Sizer = CPU_BUFT) -> int:
    """Bytes of a plan that puts everything on the device (compute buffer, every layer
    whole, the output block): the smallest budget at which nothing stays on the CPU."""
    return (
        compute_bytes(s, n_ctx, n_batch, sizer)
        + sum(layer_bytes(s, i, n_ctx, sizer) for i in range(s.n_layer))
        + output_block_bytes(s, n_batch, sizer)
    )
