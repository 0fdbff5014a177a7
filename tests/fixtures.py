"""Test helpers that write tiny random GGUF models (and corrupt them on purpose).

``write_tiny_llama`` produces a small but complete llama-architecture GGUF file
with random weights and a minimal GPT-2 style (byte-level BPE) tokenizer, using
``gguf.GGUFWriter``. Everything is deterministic for a given ``seed``.

``patch_tensor_info`` / ``tensor_info_layout`` rewrite fields of a tensor's
directory entry in place, for bad-file tests.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Mapping, Sequence

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

__all__ = [
    "write_tiny_llama",
    "tiny_tokenizer",
    "random_quantized",
    "finish_gguf",
    "tensor_info_layout",
    "patch_tensor_info",
    "LAYER_ROLES",
]

#: per-layer tensor roles, GGUF name "blk.{i}.<role>.weight"
LAYER_ROLES = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
)
_NORM_ROLES = ("attn_norm", "ffn_norm", "output_norm", "rope_freqs")

# Byte offsets of the fp16 scale fields inside one block of the K-quant types,
# which gguf.quants cannot quantize: random bytes with these fields set to small
# finite values make valid blocks.
_KQUANT_F16_FIELDS = {
    T.Q2_K: (80, 82),  # scales[16] qs[64] d dmin
    T.Q3_K: (108,),  # hmask[32] qs[64] scales[12] d
    T.Q4_K: (0, 2),  # d dmin scales[12] qs[128]
    T.Q5_K: (0, 2),  # d dmin scales[12] qh[32] qs[128]
    T.Q6_K: (208,),  # ql[128] qh[64] scales[16] d
}


def tiny_tokenizer(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """A minimal byte-level BPE vocabulary of exactly ``n_vocab`` (>= 4) tokens.

    Returns (tokens, token_types, merges): token 0 is ``<|endoftext|>``
    (CONTROL), then single characters in GPT-2's byte-to-unicode spelling
    (``Ġ`` = space), then tokens made by the merges ``"a b"`` -> ``"ab"``, each
    merge's parts already in the vocabulary.
    """
    if n_vocab < 4:
        raise ValueError("n_vocab must be >= 4")
    chars = list("Ġetaoinshrdlucmfwypvbgkjqxz.,!?'ETAOINSHRDLUCMFWYPVBGKJQXZ0123456789-:;")
    n_base = min(len(chars), max(2, (n_vocab - 1) * 2 // 3))
    tokens = ["<|endoftext|>"] + chars[:n_base]
    types = [int(gguf.TokenType.CONTROL)] + [int(gguf.TokenType.NORMAL)] * n_base
    merges: list[str] = []
    known = set(tokens)
    parts = list(chars[:n_base])
    i = 0
    while len(tokens) < n_vocab:
        a = parts[i % len(parts)]
        b = chars[(i * 7 + 1) % n_base]
        i += 1
        if a + b in known:
            continue
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(int(gguf.TokenType.NORMAL))
        known.add(a + b)
        parts.append(a + b)
    return tokens, types, merges


def random_quantized(x: np.ndarray, qtype: int, rng: np.random.Generator) -> np.ndarray:
    """Bytes of a tensor of type ``qtype`` with numpy shape ``x.shape`` (ne reversed).

    Types gguf.quants can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, ...)
    quantize ``x``; K-quants (Q2_K..Q6_K) get random blocks with small finite
    scales (``x`` only gives the shape). F32 returns ``x`` as float32.
    Returns float32/float16 arrays for F32/F16, else uint8 of shape
    (..., row bytes).
    """
    qtype = T(qtype)
    if qtype == T.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if qtype == T.F16:
        return np.ascontiguousarray(x, dtype=np.float16)
    if qtype in _KQUANT_F16_FIELDS:
        block, tsize = gguf.GGML_QUANT_SIZES[qtype]
        if x.shape[-1] % block:
            raise ValueError(f"{qtype.name} needs rows that are multiples of {block}")
        n_blocks = x.size // block
        blocks = rng.integers(0, 256, size=(n_blocks, tsize), dtype=np.uint8)
        for off in _KQUANT_F16_FIELDS[qtype]:
            scale = (rng.uniform(0.002, 0.01, size=n_blocks)).astype("<f2")
            blocks[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        return blocks.reshape(*x.shape[:-1], x.shape[-1] // block * tsize)
    return gguf.quants.quantize(np.asarray(x, dtype=np.float32), qtype)


def _kv_type(value: Any) -> V:
    if isinstance(value, bool):
        return V.BOOL
    if isinstance(value, int):
        return V.UINT32 if 0 <= value < 1 << 32 else V.INT64
    if isinstance(value, float):
        return V.FLOAT32
    if isinstance(value, (str, bytes)):
        return V.STRING
    if isinstance(value, (list, tuple)):
        return V.ARRAY
    raise TypeError(f"cannot infer a GGUF type for {value!r}")


def write_tiny_llama(
    path: str | os.PathLike,
    *,
    n_vocab: int = 64,
    n_embd: int = 64,
    n_layer: int = 2,
    n_ff: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ctx_train: int = 256,
    rope_freq_base: float = 10000.0,
    rms_eps: float = 1e-5,
    types: Mapping[str, int] | None = None,
    seed: int = 0,
    tied: bool = True,
    rope_freqs: bool = False,
    extra_kv: Mapping[str, Any] | None = None,
    with_tokenizer: bool = True,
    arch: str = "llama",
    drop_tensors: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    magic: bytes = b"GGUF",
) -> str:
    """Write a tiny llama GGUF file with random weights; returns ``str(path)``.

    Weights are normal with std 1/sqrt(n_in) (norm weights 1 + 0.1 * normal),
    so activations stay O(1) through the layers.

    Args:
        path: output file.
        n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx_train,
        rope_freq_base, rms_eps: hyper-parameters written to the metadata
            (head dim = n_embd / n_head).
        types: ggml type per tensor. Keys are full tensor names
            ("blk.0.ffn_down.weight"), roles ("ffn_down", "token_embd",
            "output", "output_norm", "attn_norm", ...) or the classes "matrix"
            / "norm"; the most specific key wins. Defaults: Q8_0 matrices, F32
            norms and rope_freqs. K-quants get random blocks (see
            :func:`random_quantized`).
        seed: random seed.
        tied: True writes no output.weight (output tied to token_embd).
        rope_freqs: also write a Llama-3 style rope_freqs.weight [head_dim/2].
        extra_kv: metadata overrides, key -> value (type inferred: bool, int ->
            uint32 (int64 if out of range), float -> float32, str, list -> array)
            or (value, gguf.GGUFValueType); value None removes the key.
        with_tokenizer: write tokenizer.ggml.* keys (model "gpt2", tokens,
            token_type, merges, bos/eos ids).
        arch: general.architecture and the key prefix.
        drop_tensors: tensor names to leave out.
        shapes: tensor name -> ne to write instead of the right shape.
        extra_tensors: more tensors (name -> float32/float16 ndarray, numpy order)
            written after the model's, e.g. PowerInfer's ``blk.N.fc1.weight``.
        magic: the first four bytes (``b"PWRI"`` makes a PowerInfer file).
    """
    path = os.fspath(path)
    rng = np.random.default_rng(seed)
    types = dict(types or {})
    shapes = dict(shapes or {})
    head_dim = n_embd // n_head

    kv: dict[str, tuple[Any, V]] = {}

    def put(key: str, value: Any, vtype: V | None = None) -> None:
        kv[key] = (value, vtype or _kv_type(value))

    put("general.architecture", arch)
    put("general.name", "tiny-random-llama")
    put("general.file_type", 7)  # MOSTLY_Q8_0
    put(f"{arch}.context_length", n_ctx_train)
    put(f"{arch}.embedding_length", n_embd)
    put(f"{arch}.block_count", n_layer)
    put(f"{arch}.feed_forward_length", n_ff)
    put(f"{arch}.attention.head_count", n_head)
    put(f"{arch}.attention.head_count_kv", n_head_kv)
    put(f"{arch}.rope.freq_base", float(rope_freq_base))
    put(f"{arch}.attention.layer_norm_rms_epsilon", float(rms_eps))
    put(f"{arch}.rope.dimension_count", head_dim)
    put(f"{arch}.vocab_size", n_vocab)
    if with_tokenizer:
        tokens, token_types, merges = tiny_tokenizer(n_vocab)
        put("tokenizer.ggml.model", "gpt2")
        put("tokenizer.ggml.pre", "default")
        put("tokenizer.ggml.tokens", tokens, V.ARRAY)
        put("tokenizer.ggml.token_type", token_types, V.ARRAY)
        put("tokenizer.ggml.merges", merges, V.ARRAY)
        put("tokenizer.ggml.bos_token_id", 0)
        put("tokenizer.ggml.eos_token_id", 0)
        put("tokenizer.ggml.add_bos_token", False)
    put("general.quantization_version", 2)
    for key, value in (extra_kv or {}).items():
        if value is None:
            kv.pop(key, None)
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], V):
            put(key, value[0], value[1])
        else:
            put(key, value)

    # (name, role, ne) in the order llama.cpp's converter writes them
    specs: list[tuple[str, str, tuple[int, ...]]] = [
        ("token_embd.weight", "token_embd", (n_embd, n_vocab)),
    ]
    if rope_freqs:
        specs.append(("rope_freqs.weight", "rope_freqs", (head_dim // 2,)))
    for i in range(n_layer):
        specs += [
            (f"blk.{i}.attn_norm.weight", "attn_norm", (n_embd,)),
            (f"blk.{i}.attn_q.weight", "attn_q", (n_embd, n_head * head_dim)),
            (f"blk.{i}.attn_k.weight", "attn_k", (n_embd, n_head_kv * head_dim)),
            (f"blk.{i}.attn_v.weight", "attn_v", (n_embd, n_head_kv * head_dim)),
            (f"blk.{i}.attn_output.weight", "attn_output", (n_head * head_dim, n_embd)),
            (f"blk.{i}.ffn_norm.weight", "ffn_norm", (n_embd,)),
            (f"blk.{i}.ffn_gate.weight", "ffn_gate", (n_embd, n_ff)),
            (f"blk.{i}.ffn_up.weight", "ffn_up", (n_embd, n_ff)),
            (f"blk.{i}.ffn_down.weight", "ffn_down", (n_ff, n_embd)),
        ]
    specs.append(("output_norm.weight", "output_norm", (n_embd,)))
    if not tied:
        specs.append(("output.weight", "output", (n_embd, n_vocab)))

    writer = gguf.GGUFWriter(path, arch)
    writer.kv_data[0].clear()  # drop the writer's own general.architecture: kv has it
    for key, (value, vtype) in kv.items():
        writer.add_key_value(key, value, vtype)

    for name, role, ne in specs:
        ne = tuple(shapes.get(name, ne))
        is_norm = role in _NORM_ROLES
        qtype = T(types.get(name, types.get(role, types.get(
            "norm" if is_norm else "matrix", T.F32 if is_norm else T.Q8_0))))
        shape = ne[::-1]  # numpy order: rows first
        if role == "rope_freqs":
            x = np.linspace(1.0, 8.0, num=int(np.prod(ne)), dtype=np.float32).reshape(shape)
        elif is_norm:
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = (rng.standard_normal(shape) / np.sqrt(ne[0])).astype(np.float32)
        if name in drop_tensors:
            continue
        data = random_quantized(x, qtype, rng)
        if qtype in (T.F32, T.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)

    for name, arr in (extra_tensors or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(arr))

    finish_gguf(writer, path, magic)
    return path


def finish_gguf(writer, path: str | os.PathLike, magic: bytes = b"GGUF") -> None:
    """Write a GGUFWriter's header, metadata and tensors, close it, and put ``magic``
    (e.g. b"PWRI": a PowerInfer file) in the first four bytes."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if magic != b"GGUF":
        with open(path, "r+b") as f:
            f.write(magic)


def tensor_info_layout(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """File positions of each tensor directory entry's fields, found with
    gguf.GGUFReader (independent of the loader under test).

    Returns name -> {"n_dims": pos, "dims": pos, "type": pos, "offset": pos,
    "data_start": absolute data offset}.
    """
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        pos = t.field.offset
        layout = {}
        for key, part in zip(("name_len", "name", "n_dims", "dims", "type", "offset"), t.field.parts):
            layout[key] = pos
            pos += int(part.nbytes)
        layout["data_start"] = int(t.data_offset)
        out[t.name] = layout
    return out


def patch_tensor_info(
    path: str | os.PathLike,
    name: str,
    *,
    dims: Sequence[int] | None = None,
    type: int | None = None,
    offset: int | None = None,
) -> None:
    """Overwrite, in place, fields of tensor ``name``'s directory entry: its
    dims (same count as before), ggml type id, or data offset (relative to the
    data section)."""
    layout = tensor_info_layout(path)[name]
    with open(path, "r+b") as f:
        if dims is not None:
            f.seek(layout["dims"])
            f.write(struct.pack(f"<{len(dims)}Q", *dims))
        if type is not None:
            f.seek(layout["type"])
            f.write(struct.pack("<I", type))
        if offset is not None:
            f.seek(layout["offset"])
            f.write(struct.pack("<Q", offset))
