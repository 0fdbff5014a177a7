"""Hyper-parameters (:class:`HParams`) read from a GGUF's metadata for an
:class:`~powerinfer_backend.loader.arch.ArchSpec`: typed, range-checked keys with the
architecture's defaults, the sources of the tensor dimensions (for shape error messages)
and the FFN activation decision (:func:`_ffn_act`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import arch as _arch
from .arch import ArchSpec
from .reader import _TensorInfo
from .types import _FLOAT_TYPES, _INT_TYPES, _V, _vtype_name

# Sanity bounds for hyper-parameters ("absurd dimension" guard).
_MAX_N_EMBD = 1 << 20
_MAX_N_FF = 1 << 22
_MAX_N_LAYER = 1 << 12
_MAX_N_HEAD = 1 << 14
_MAX_N_VOCAB = 1 << 24
_MAX_N_CTX = 1 << 30


@dataclass(frozen=True)
class HParams:
    """Model hyper-parameters, validated (all sizes > 0, divisibility holds).

    Attributes:
        n_vocab: vocabulary size (rows of the token embedding).
        n_embd: hidden size.
        n_layer: number of transformer blocks.
        n_ff: feed-forward inner size.
        n_head: query heads.
        n_head_kv: key/value heads (divides n_head; < n_head means GQA).
        n_embd_head: head dimension.
        n_rot: rotated dimensions per head (even, <= n_embd_head).
        n_ctx_train: training context length in tokens.
        rms_eps: norm epsilon (RMSNorm, or LayerNorm when ``layer_norm``).
        rope_freq_base: RoPE base frequency (theta).
        rope_freq_scale: RoPE position multiplier, 1 / linear scaling factor.
        rope_type: enum pi_rope_type (:data:`arch.ROPE_NORM` for llama,
            :data:`arch.ROPE_NONE` for OPT).
        act: enum pi_act of the FFN gate activation (:data:`arch.ACT_SILU`).
        embd_scale: token embeddings multiplied by this (0 = not scaled;
            Gemma: sqrt(n_embd) as float32).
        attn_scale: 0 = attention scores scaled by 1/sqrt(n_embd_head); else
            queries are multiplied by it before attention (Gemma).
        n_swa: sliding window of the local layers in tokens (0 = none).
        swa_pattern: layer l is local when ``l % swa_pattern < swa_pattern - 1``
            (0 = all layers local when n_swa > 0).
        rope_freq_base_swa, rope_freq_scale_swa: RoPE of the local layers.
        layer_norm: 1 = LayerNorm with bias (Falcon, OPT), 0 = RMSNorm.
        parallel_residual: 1 = attention and FFN both read the layer input (Falcon).
        pos_offset: row of position 0 in ``position_embd.weight`` (OPT: 2).
    """

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head: int
    n_rot: int
    n_ctx_train: int
    rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    rope_type: int
    act: int
    embd_scale: float = 0.0
    attn_scale: float = 0.0
    n_swa: int = 0
    swa_pattern: int = 0
    rope_freq_base_swa: float = 0.0
    rope_freq_scale_swa: float = 0.0
    layer_norm: int = 0
    parallel_residual: int = 0
    pos_offset: int = 0

    def is_swa(self, layer: int) -> bool:
        """True when ``layer`` is a sliding-window (local) layer."""
        p = self.swa_pattern
        return self.n_swa > 0 and (p == 0 or layer % p < p - 1)

    @property
    def n_embd_q(self) -> int:
        """Query projection width, n_head * n_embd_head."""
        return self.n_head * self.n_embd_head

    @property
    def n_embd_kv(self) -> int:
        """Key/value projection width, n_head_kv * n_embd_head."""
        return self.n_head_kv * self.n_embd_head

    @property
    def n_gqa(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_head_kv

    @property
    def act_name(self) -> str:
        """Activation name ("silu", "gelu" or "relu")."""
        return {v: k for k, v in _arch.ACT_IDS.items()}[self.act]

    def dims(self) -> dict[str, int]:
        """Symbolic dimension name -> size, for :func:`arch.resolve_shape`."""
        return {
            "n_vocab": self.n_vocab,
            "n_embd": self.n_embd,
            "n_ff": self.n_ff,
            "n_embd_q": self.n_embd_q,
            "n_embd_kv": self.n_embd_kv,
            "n_embd_qkv": self.n_embd_q + 2 * self.n_embd_kv,
            "n_ctx_train": self.n_ctx_train,
            "n_rot_half": self.n_rot // 2,
            "n_embd_head": self.n_embd_head,
        }


_MISSING = object()  # the default of a required key


class _KVAccess:
    def __init__(self, path: str, kv: dict[str, tuple[int, Any]]):
        self.path = path
        self.kv = kv

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"{self.path}: {msg}")

    def _raw(self, key: str, default: Any) -> tuple[int, Any] | None:
        if key not in self.kv:
            if default is _MISSING:
                raise self.fail(f"missing required metadata key '{key}'")
            return None
        vtype, value = self.kv[key]
        if vtype == _V.ARRAY:
            raise self.fail(f"key '{key}' is an array; per-layer values are not supported")
        return vtype, value

    def get_int(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype not in _INT_TYPES:
            raise self.fail(f"key '{key}' has type {_vtype_name(vtype)}, expected an integer")
        if not lo <= value <= hi:
            raise self.fail(f"key '{key}' = {value} is out of range [{lo}, {hi}]")
        return value

    def get_float(self, key: str, lo: float, hi: float, default: Any = _MISSING, lo_inclusive: bool = False) -> float:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype not in _FLOAT_TYPES and vtype not in _INT_TYPES:
            raise self.fail(f"key '{key}' has type {_vtype_name(vtype)}, expected a number")
        value = float(value)
        ok_lo = value >= lo if lo_inclusive else value > lo
        if not (math.isfinite(value) and ok_lo and value <= hi):
            raise self.fail(f"key '{key}' = {value} is out of range ({lo}, {hi}]")
        return value

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype != _V.STRING:
            raise self.fail(f"key '{key}' has type {_vtype_name(vtype)}, expected a string")
        return value


def _read_hparams(path: str, spec: ArchSpec, kv: dict, infos: dict[str, _TensorInfo]):
    """Returns (HParams, {dimension name: where its value came from})."""
    a = _KVAccess(path, kv)
    key = spec.key
    src: dict[str, str] = {}

    n_expert = a.get_int(key("n_expert"), 0, 1 << 16, default=0)
    if n_expert > 0:
        raise a.fail(f"key '{key('n_expert')}' = {n_expert}: mixture-of-experts models are not supported")

    n_layer = a.get_int(key("n_layer"), 1, _MAX_N_LAYER)
    n_embd = a.get_int(key("n_embd"), 1, _MAX_N_EMBD)
    n_ff = a.get_int(key("n_ff"), 1, _MAX_N_FF)
    n_head = a.get_int(key("n_head"), 1, _MAX_N_HEAD)
    n_head_kv = a.get_int(key("n_head_kv"), 1, n_head, default=n_head)
    if n_head % n_head_kv:
        raise a.fail(f"key '{key('n_head')}' = {n_head} is not a multiple of '{key('n_head_kv')}' = {n_head_kv}")
    n_ctx_train = a.get_int(key("n_ctx_train"), 1, _MAX_N_CTX)
    if key("n_embd_head") in kv:
        n_embd_head = a.get_int(key("n_embd_head"), 1, _MAX_N_HEAD)
        src["n_embd_head"] = key("n_embd_head")
    else:
        if n_embd % n_head:
            raise a.fail(
                f"key '{key('n_embd')}' = {n_embd} is not a multiple of "
                f"'{key('n_head')}' = {n_head} (and '{key('n_embd_head')}' is absent)"
            )
        n_embd_head = n_embd // n_head
        src["n_embd_head"] = f"{key('n_embd')} / {key('n_head')}"
    n_embd_head_v = a.get_int(key("n_embd_head_v"), 1, _MAX_N_HEAD, default=n_embd_head)
    if n_embd_head_v != n_embd_head:
        raise a.fail(
            f"key '{key('n_embd_head_v')}' = {n_embd_head_v} differs from the key length "
            f"{n_embd_head}; unequal key/value head sizes are not supported"
        )
    n_rot = a.get_int(key("n_rot"), 1, n_embd_head, default=n_embd_head)
    if n_rot % 2:
        raise a.fail(f"key '{key('n_rot')}' = {n_rot} must be even")

    # (Falcon requires its layer_norm_epsilon, as llama.cpp does; OPT files have none: HF's 1e-5)
    rms_eps = a.get_float(
        key("rms_eps"), 0.0, 1.0, default=_MISSING if "rms_eps" in spec.required_keys else _arch.DEFAULT_RMS_EPS
    )
    rope_freq_base = a.get_float(key("rope_freq_base"), 0.0, 1e12, default=_arch.DEFAULT_ROPE_FREQ_BASE)
    scaling = a.get_str(key("rope_scaling_type"), default="none")
    if scaling not in spec.rope_scaling_types:
        raise a.fail(
            f"key '{key('rope_scaling_type')}' = {scaling!r} is not supported "
            f"(supported: {', '.join(spec.rope_scaling_types)})"
        )
    # As llama.cpp: the factor applies whenever given (0 = none); the legacy
    # key name is the fallback.
    factor = 0.0
    for name in ("rope_scaling_factor", "rope_scale_linear"):
        if key(name) in kv:
            factor = a.get_float(key(name), 0.0, 1e6, lo_inclusive=True)
            break
    rope_freq_scale = 1.0 if factor == 0.0 else 1.0 / factor

    # vocabulary size: explicit key, else the token list, else the embedding
    if key("n_vocab") in kv:
        n_vocab = a.get_int(key("n_vocab"), 1, _MAX_N_VOCAB)
        src["n_vocab"] = key("n_vocab")
    elif _arch.TOKENS_KEY in kv and kv[_arch.TOKENS_KEY][0] == _V.ARRAY:
        n_vocab = len(kv[_arch.TOKENS_KEY][1])
        if not 1 <= n_vocab <= _MAX_N_VOCAB:
            raise a.fail(f"key '{_arch.TOKENS_KEY}' has {n_vocab} entries (expected 1 to {_MAX_N_VOCAB})")
        src["n_vocab"] = f"length of {_arch.TOKENS_KEY}"
    else:
        emb = infos.get(spec.global_tensors[0].name)
        if emb is None or len(emb.ne) < 2:
            raise a.fail(
                f"cannot tell the vocabulary size: no '{key('n_vocab')}' key, no "
                f"'{_arch.TOKENS_KEY}' array and no usable '{spec.global_tensors[0].name}'"
            )
        n_vocab = emb.ne[1]
        if not 1 <= n_vocab <= _MAX_N_VOCAB:
            raise a.fail(f"tensor '{emb.name}' implies an absurd vocabulary size {n_vocab}")
        src["n_vocab"] = f"tensor {emb.name}"

    def origin(name: str, default: str) -> str:
        return key(name) if key(name) in kv else default

    src.update(
        n_embd=key("n_embd"),
        n_ff=key("n_ff"),
        n_embd_q=f"n_head {n_head} * head dim {n_embd_head}",
        n_embd_kv=(f"n_head_kv {n_head_kv} ({origin('n_head_kv', 'default = n_head')}) * head dim {n_embd_head}"),
        n_rot_half=f"n_rot {n_rot} ({origin('n_rot', 'default = head dim')}) / 2",
        n_embd_head=src["n_embd_head"],
        n_embd_qkv=f"(n_head {n_head} + 2 * n_head_kv {n_head_kv}) * head dim {n_embd_head}",
        n_ctx_train=key("n_ctx_train"),
    )
    # sliding window (Gemma 3, Mistral): local layers by pattern, their own RoPE base
    n_swa = a.get_int(key("n_swa"), 0, _MAX_N_CTX, default=0) if spec.sliding_window else 0
    swa_pattern = a.get_int(key("swa_pattern"), 0, _MAX_N_LAYER, default=spec.swa_pattern) if n_swa else 0
    rope_freq_base_swa = 0.0
    if n_swa:
        rope_freq_base_swa = a.get_float(
            key("rope_freq_base_swa"), 0.0, 1e12, default=spec.rope_freq_base_swa or rope_freq_base
        )
    hp = HParams(
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head=n_embd_head,
        n_rot=n_rot,
        n_ctx_train=n_ctx_train,
        rms_eps=rms_eps,
        rope_freq_base=rope_freq_base,
        rope_freq_scale=rope_freq_scale,
        rope_type=spec.rope_type,
        act=_ffn_act(a, spec),
        embd_scale=float(np.sqrt(np.float32(n_embd))) if spec.embd_scale_sqrt else 0.0,
        attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(n_embd_head))) if spec.q_pre_scale else 0.0,
        n_swa=n_swa,
        swa_pattern=swa_pattern,
        rope_freq_base_swa=rope_freq_base_swa,
        rope_freq_scale_swa=1.0 if n_swa else 0.0,
        layer_norm=int(spec.layer_norm),
        parallel_residual=int(spec.parallel_residual),
        pos_offset=spec.pos_offset,
    )
    return hp, src


def _ffn_act(a, spec) -> int:
    """The FFN activation: :data:`arch.FFN_ACT_KEY` when present, "relu" for a
    PowerInfer-converted llama or falcon file (:data:`arch.POWERINFER_THRESHOLD_KEY`),
    else the architecture's own."""
    name = a.get_str(_arch.FFN_ACT_KEY, None)
    if name is None:
        relu_file = spec.powerinfer_relu and _arch.POWERINFER_THRESHOLD_KEY in a.kv
        return _arch.ACT_IDS["relu" if relu_file else spec.act]
    if name not in _arch.ACT_IDS:
        raise a.fail(f"key '{_arch.FFN_ACT_KEY}' = {name!r}; supported: {sorted(_arch.ACT_IDS)}")
    gated = any(t.slot == "ffn_gate" and t.name for t in spec.layer_tensors)
    if name == "drelu" and not gated:  # relu(gate) * relu(up) needs a gate
        raise a.fail(
            f"key '{_arch.FFN_ACT_KEY}' = 'drelu' needs a gated FFN; this architecture's FFN has no gate "
            f"(use 'relu' or 'gelu')"
        )
    return _arch.ACT_IDS[name]
