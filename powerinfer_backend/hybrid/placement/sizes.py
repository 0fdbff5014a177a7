"""Byte arithmetic of placement: a model's tensor sizes in their stored types
(:class:`ModelSizes`, :class:`TensorSize`) and the exact device bytes of every block a
plan may put on the device (scratch, KV cache, attention block, output block, hot
neuron rows, whole layers), each device buffer rounded up to :data:`DEVICE_ALIGN`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["KiB", "MiB", "GiB", "TiB", "DEVICE_ALIGN", "NEURON_GROUP", "KV_PAD", "KV_ELEM_BYTES", "ACT_BYTES",
           "MAP_BYTES", "TensorSize", "ModelSizes", "align_up", "row_bytes", "scratch_bytes", "kv_bytes_per_layer",
           "attn_block_bytes", "output_block_bytes", "neuron_bytes", "hot_bytes", "layer_bytes",
           "full_device_bytes"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
#: Every device buffer starts on, and is rounded up to, this many bytes.
DEVICE_ALIGN = 256
#: Neurons per knapsack group (one quantization block's worth of rows).
NEURON_GROUP = 32
#: The KV cache holds a multiple of this many positions (PI_KV_PAD in native/src/pi_internal.h).
KV_PAD = 64
#: Bytes per KV cache element (F16, the engine's default kv_type).
KV_ELEM_BYTES = 2
#: Bytes per activation element in device scratch (F32).
ACT_BYTES = 4
#: Bytes per row -> neuron map entry (int32).
MAP_BYTES = 4

_T = GGMLQuantizationType
_F32 = int(_T.F32)
_F16 = int(_T.F16)
#: Per-layer slots placed neuron by neuron (hot rows), not as part of the dense block.
_FFN_ROW_SLOTS = ("ffn_gate", "ffn_up", "ffn_down")


def align_up(n: int, align: int = DEVICE_ALIGN) -> int:
    """``n`` bytes rounded up to a multiple of ``align`` (0 stays 0)."""
    return -(-int(n) // align) * align


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
    def nbytes(self) -> int:
        """Bytes in the stored type: rows x :func:`row_bytes`."""
        return row_bytes(self.type, self.ne[0]) * math.prod(self.ne[1:])


@dataclass(frozen=True)
class ModelSizes:
    """What placement needs to know about a model: dimensions and tensor sizes.

    Attributes:
        n_layer, n_embd, n_ff, n_head, n_head_kv, n_embd_head, n_vocab: hyper-parameters.
        layers: per layer, slot name (:data:`arch.LAYER_SLOTS`) -> :class:`TensorSize`.
        output_norm: F32 [n_embd].
        output: the output projection [n_embd, n_vocab] (the token embedding when tied).
        down_t_bytes: bytes per element of the transposed down rows a hot neuron
            keeps on the device (2 = F16; 4 = F32 when every ffn_down is F32), the rule
            of :func:`powerinfer_backend.engine.down_cache.down_t_dtype`.
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
    down_t_bytes: int = 2

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.n_embd_head

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.n_embd_head

    @classmethod
    def from_gguf(cls, model) -> "ModelSizes":
        """Sizes of a :class:`powerinfer_backend.loader.GGUFModel` (types as loaded)."""
        from ...loader.arch import LAYER_SLOTS

        hp = model.hparams
        layers = []
        for i in range(hp.n_layer):
            layers.append({slot: TensorSize(int(t.type), tuple(int(x) for x in t.ne))
                           for slot, t in zip(LAYER_SLOTS, model.layer_tensors(i))
                           if t is not None})  # optional slots an architecture lacks
        g = model.global_tensors()
        out = g["output"] if g["output"] is not None else g["tok_embd"]
        all_f32 = all(layer["ffn_down"].type == _F32 for layer in layers)
        return cls(n_layer=hp.n_layer, n_embd=hp.n_embd, n_ff=hp.n_ff, n_head=hp.n_head,
                   n_head_kv=hp.n_head_kv, n_embd_head=hp.n_embd_head, n_vocab=hp.n_vocab,
                   layers=tuple(layers),
                   output_norm=TensorSize(int(g["output_norm"].type), tuple(g["output_norm"].ne)),
                   output=TensorSize(int(out.type), tuple(int(x) for x in out.ne)),
                   down_t_bytes=4 if all_f32 else 2)


def _n_cells(n_ctx: int) -> int:
    return -(-n_ctx // KV_PAD) * KV_PAD


def scratch_bytes(s: ModelSizes, n_ctx: int, n_batch: int) -> int:
    """Device activation scratch for ``n_batch`` tokens (bytes): F32 buffers of
    x, xn and the FFN partial sum y (n_embd each), q and the attention output
    (n_embd_q), k and v (n_embd_kv), gate and up of up to n_ff hot rows, the
    attention scores (n_head x n_cells, n_cells = n_ctx rounded up to 64) and the
    quantized matmul input (max(n_embd, n_embd_q) elements at 4 bytes, the widest
    activation type), each rounded up to :data:`DEVICE_ALIGN`."""
    B, a = n_batch, ACT_BYTES
    bufs = [B * s.n_embd * a] * 3 + [B * s.n_embd_q * a] * 2 + [B * s.n_embd_kv * a] * 2 \
        + [B * s.n_ff * a] * 2 + [B * s.n_head * _n_cells(n_ctx) * a, B * max(s.n_embd, s.n_embd_q) * a]
    return sum(align_up(b) for b in bufs)


def kv_bytes_per_layer(s: ModelSizes, n_ctx: int) -> int:
    """One layer's KV cache (bytes): K and V, each n_cells x n_embd_kv F16
    (n_cells = n_ctx rounded up to 64), each rounded up to DEVICE_ALIGN."""
    return 2 * align_up(_n_cells(n_ctx) * s.n_embd_kv * KV_ELEM_BYTES)


def attn_block_bytes(s: ModelSizes, i: int, n_ctx: int) -> int:
    """Layer ``i``'s dense block on the device (bytes): attn_norm, attn_q/k/v,
    attn_output, ffn_norm in their stored types, each aligned, plus its KV cache."""
    dense = [slot for slot in s.layers[i] if slot not in _FFN_ROW_SLOTS]  # incl. optional norms / biases
    return sum(align_up(s.layers[i][slot].nbytes) for slot in dense) + kv_bytes_per_layer(s, n_ctx)


def output_block_bytes(s: ModelSizes, n_batch: int) -> int:
    """The output block (bytes): output_norm, the output projection (the token
    embedding when tied) in its stored type, and F32 logits of n_batch tokens."""
    return (align_up(s.output_norm.nbytes) + align_up(s.output.nbytes)
            + align_up(n_batch * s.n_vocab * ACT_BYTES))


def neuron_bytes(s: ModelSizes, i: int) -> tuple[int, int, int]:
    """Bytes of one hot neuron's rows in layer ``i``: (gate row, up row, down_t row)
    — gate and up rows of n_embd in their stored types (gate 0 without one), the
    down_t row of n_embd at ``s.down_t_bytes`` per element."""
    L = s.layers[i]
    gate = row_bytes(L["ffn_gate"].type, s.n_embd) if "ffn_gate" in L else 0  # ungated FFN (Falcon, OPT)
    return (gate, row_bytes(L["ffn_up"].type, s.n_embd), s.n_embd * s.down_t_bytes)


def hot_bytes(s: ModelSizes, i: int, n_hot: int) -> int:
    """Device bytes of ``n_hot`` compact hot rows in layer ``i``: the gate, up and
    down_t row arrays and the int32 row -> neuron map, each aligned (0 for 0 rows)."""
    g, u, d = neuron_bytes(s, i)
    return (align_up(n_hot * g) + align_up(n_hot * u) + align_up(n_hot * d)
            + align_up(n_hot * MAP_BYTES))


def layer_bytes(s: ModelSizes, i: int, n_ctx: int) -> int:
    """Layer ``i`` whole on the device: its dense block, KV cache and all n_ff neurons."""
    return attn_block_bytes(s, i, n_ctx) + hot_bytes(s, i, s.n_ff)


def full_device_bytes(s: ModelSizes, n_ctx: int, n_batch: int) -> int:
    """Bytes of a plan that puts everything on the device (scratch, every layer
    whole, the output block): the smallest budget at which nothing stays on the CPU."""
    return (scratch_bytes(s, n_ctx, n_batch) + sum(layer_bytes(s, i, n_ctx) for i in range(s.n_layer))
            + output_block_bytes(s, n_batch))
