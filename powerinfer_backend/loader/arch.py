"""Per-architecture facts used by the GGUF loader: metadata key names, defaults,
tensor names, slot order and expected tensor shapes.

Everything the loader needs to know about a model family lives in one
:class:`ArchSpec` entry of :data:`ARCHITECTURES`; the loader itself
(:mod:`powerinfer_backend.loader`) is architecture-neutral.

Conventions
-----------
* Metadata key templates contain ``{arch}``, replaced by the value of
  ``general.architecture`` (e.g. ``"{arch}.block_count"`` -> ``"llama.block_count"``).
* Tensor shapes are in GGUF/ggml ``ne`` order: ``ne[0]`` is the contiguous row
  length (the input dimension of a weight), ``ne[1]`` the number of rows.
  A weight of ne ``[n_in, n_out]`` maps ``n_in -> n_out``.
* Shapes are written with symbolic dimension names (see :data:`DIM_NAMES`),
  resolved against the model's hyper-parameters by :func:`resolve_shape`.
* The per-layer tensor order is the C enum ``pi_layer_slot`` in
  ``native/include/powerinfer.h``; keep both in sync.

Architectures (docs/architecture.md has the table of what runs dense, sparse and
hybrid, and how each was verified):

* ``llama``, ``gemma3``, ``qwen2``: RMSNorm, gated FFN (SwiGLU / GeGLU), RoPE.
* ``falcon``: LayerNorm with bias, fused q/k/v (multi-query), parallel residual
  (attention and MLP both read the layer input), ungated MLP ``down(act(up x))``
  with GELU, NEOX RoPE. PowerInfer's ReluFalcon uses ReLU there; see
  :data:`FFN_ACT_KEY` and :data:`POWERINFER_THRESHOLD_KEY` for how it is recognised.
* ``opt`` (PowerInfer's llama.cpp fork): LayerNorm with bias, q/k/v/output and
  FFN biases, ungated ReLU FFN, learned absolute positions (row ``pos + 2`` of
  ``position_embd.weight``, as the fork adds 2 to every position), no RoPE,
  output tied to the token embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .._native.enums import Act, LayerSlot, RopeType

# ---- enum values: generated from native/include/powerinfer.h (_native.enums) ----

ROPE_NONE = int(RopeType.NONE)  #: no rotary embedding (OPT)
ROPE_NORM = int(RopeType.NORM)  #: consecutive pairs rotated
ROPE_NEOX = int(RopeType.NEOX)  #: halves rotated

ACT_SILU = int(Act.SILU)
ACT_GELU = int(Act.GELU)
ACT_RELU = int(Act.RELU)  #: relu(gate) * up
ACT_DRELU = int(Act.DRELU)  #: relu(gate) * relu(up) (dReLU, TurboSparse / Bamboo)

#: activation name -> enum pi_act value
ACT_IDS: Mapping[str, int] = {a.name.lower(): int(a) for a in Act}

#: GGUF key that overrides an architecture's FFN activation (values: the names of
#: :data:`ACT_IDS`). Written by our tools and tests for ReLU-fied llama files
#: (ReluLLaMA, ProSparse: "relu"; Bamboo: "drelu") and ReluFalcon files; docs/sparsity.md.
#: In an ungated FFN (Falcon, OPT) the activation applies to ``up x + bias``.
FFN_ACT_KEY = "powerinfer.ffn_act"
#: PowerInfer's converted (sparse) files carry this key; its llama and falcon files
#: are all ReLU models (ReluLLaMA, ProSparse, ReluFalcon), so a file of an
#: architecture with :attr:`ArchSpec.powerinfer_relu` that has this key and no
#: :data:`FFN_ACT_KEY` is read as "relu".
POWERINFER_THRESHOLD_KEY = "powerinfer.sparse_threshold"

#: Per-layer slot names, in the order of enum pi_layer_slot (``PI_L_ATTN_NORM`` ->
#: "attn_norm"). Slots after ffn_down are optional: empty unless the architecture has them.
LAYER_SLOTS: tuple[str, ...] = tuple(s.name.lower() for s in LayerSlot if s is not LayerSlot.COUNT)
N_LAYER_SLOTS = len(LAYER_SLOTS)  #: PI_L_COUNT

#: Global tensor slots, in the order of the pi_model_params fields.
GLOBAL_SLOTS: tuple[str, ...] = ("tok_embd", "output_norm", "output", "rope_freqs", "output_norm_b", "pos_embd")

#: Symbolic dimension names allowed in tensor shapes, and their meaning.
DIM_NAMES: Mapping[str, str] = {
    "n_vocab": "vocabulary size",
    "n_embd": "hidden size",
    "n_ff": "feed-forward inner size",
    "n_embd_q": "n_head * n_embd_head (query projection width)",
    "n_embd_kv": "n_head_kv * n_embd_head (key/value projection width)",
    "n_embd_qkv": "n_embd_q + 2 * n_embd_kv (fused q/k/v projection width)",
    "n_ctx_train": "training context length (rows of a learned position table)",
    "n_rot_half": "n_rot / 2 (number of rotary frequencies)",
    "n_embd_head": "head dimension (key length)",
}

# Tensor kinds: how the loader treats a tensor's type.
KIND_MATRIX = "matrix"  #: weight matrix: any kernel type; others are converted
KIND_F32 = "f32"  #: vector that the kernels read as F32 (norm weights, rope_freqs)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor an architecture uses.

    Attributes:
        slot: slot name (an entry of :data:`GLOBAL_SLOTS` or :data:`LAYER_SLOTS`).
        name: GGUF tensor name; per-layer names contain ``{i}`` (the layer index).
            Empty for a slot the architecture does not have (see :func:`_layers`).
        shape: expected ne, as symbolic dimension names from :data:`DIM_NAMES`.
        kind: :data:`KIND_MATRIX` or :data:`KIND_F32`.
        required: False for optional tensors (absent -> the slot is empty).
        fallback: GGUF name of the tensor that fills the slot when the file has
            no tensor of ``name``'s stem (``blk.N.attn_norm_2.*`` for
            ``blk.N.attn_norm_2.weight``): Falcon 7B's one norm serves both
            blocks where Falcon 40B has two. "" = none.
    """

    slot: str
    name: str
    shape: tuple[str, ...]
    kind: str = KIND_MATRIX
    required: bool = True
    fallback: str = ""


@dataclass(frozen=True)
class ArchSpec:
    """Facts about one architecture (one value of ``general.architecture``).

    Attributes:
        name: the ``general.architecture`` value.
        keys: hyper-parameter name -> metadata key template (with ``{arch}``).
            Names: ``n_layer``, ``n_embd``, ``n_ff``, ``n_head``, ``n_head_kv``,
            ``n_ctx_train``, ``n_embd_head`` (key length), ``n_embd_head_v``
            (value length), ``n_rot``, ``rms_eps``, ``rope_freq_base``,
            ``rope_scaling_type``, ``rope_scaling_factor``, ``rope_scale_linear``
            (legacy name of the factor), ``n_vocab``, ``n_expert``.
        required_keys: names in ``keys`` that must be present.
        rope_type: enum pi_rope_type value.
        act: FFN gate activation name (a key of :data:`ACT_IDS`).
        rope_scaling_types: ``{arch}.rope.scaling.type`` values the engine runs.
        global_tensors: model-wide tensors, in :data:`GLOBAL_SLOTS` order.
        layer_tensors: per-layer tensors, in :data:`LAYER_SLOTS` order.
        tied_output_slot: the slot whose tensor stands in for an absent
            ``output`` tensor (tied embeddings).
        embd_scale_sqrt: token embeddings are multiplied by sqrt(n_embd) (Gemma).
        q_pre_scale: queries are multiplied by 1/sqrt(head dim) before
            attention and the scores are left unscaled (Gemma; same values,
            llama.cpp's rounding).
        sliding_window: the architecture reads ``{arch}.attention.sliding_window``
            (as llama.cpp: Gemma 3 does; llama-family files such as Mistral's
            run without a window there, and so here).
        swa_pattern: with a sliding window (key ``sliding_window``), layer l is
            local when ``l % swa_pattern < swa_pattern - 1``; 0 = every layer
            local. An architecture constant (Gemma 3: 6), overridable by the key
            ``{arch}.attention.sliding_window_pattern``.
        rope_freq_base_swa: RoPE base of the local layers (Gemma 3: 10000),
            overridable by ``{arch}.rope.freq_base_swa``; 0 = the global base.
        layer_norm: every norm is a LayerNorm (with the optional bias slots)
            rather than RMSNorm; its epsilon is key ``norm_eps`` (Falcon, OPT).
        parallel_residual: attention and FFN both read the layer input,
            x + attn(attn_norm(x)) + ffn(ffn_norm(x)) (Falcon).
        pos_offset: with a ``pos_embd`` tensor, position p uses row p + pos_offset
            (OPT: 2).
        powerinfer_relu: a file with :data:`POWERINFER_THRESHOLD_KEY` is a ReLU
            model (PowerInfer's llama and falcon conversions).
        llamacpp_loads: llama.cpp proper loads the architecture (False for
            OPT: its vocabulary is read from a metadata copy labelled llama,
            :func:`powerinfer_backend.loader.pwri.vocab_path`).
    """

    name: str
    keys: Mapping[str, str]
    required_keys: tuple[str, ...]
    rope_type: int
    act: str
    rope_scaling_types: tuple[str, ...]
    global_tensors: tuple[TensorSpec, ...]
    layer_tensors: tuple[TensorSpec, ...]
    tied_output_slot: str = "tok_embd"
    embd_scale_sqrt: bool = False
    q_pre_scale: bool = False
    sliding_window: bool = False
    swa_pattern: int = 0
    rope_freq_base_swa: float = 0.0
    layer_norm: bool = False
    parallel_residual: bool = False
    pos_offset: int = 0
    powerinfer_relu: bool = False
    llamacpp_loads: bool = True

    def key(self, param: str) -> str:
        """Metadata key for hyper-parameter ``param`` (e.g. ``"n_layer"`` ->
        ``"llama.block_count"``). Raises KeyError for an unknown name."""
        return self.keys[param].format(arch=self.name)

    def layer_tensor_names(self, i: int) -> list[str | None]:
        """GGUF names of layer ``i``'s tensors, in :data:`LAYER_SLOTS` order
        (one entry per slot; None for slots the architecture does not have).
        A slot with a fallback gives its primary name."""
        return [t.name.format(i=i) if t.name else None for t in self.layer_tensors]

    def global_tensor_names(self) -> list[str]:
        """GGUF names of the model-wide tensors, in :data:`GLOBAL_SLOTS` order."""
        return [t.name for t in self.global_tensors]


# Metadata key templates shared by llama.cpp's decoder-only architectures.
_COMMON_KEYS: Mapping[str, str] = {
    "n_layer": "{arch}.block_count",
    "n_embd": "{arch}.embedding_length",
    "n_ff": "{arch}.feed_forward_length",
    "n_head": "{arch}.attention.head_count",
    "n_head_kv": "{arch}.attention.head_count_kv",  # default n_head
    "n_ctx_train": "{arch}.context_length",
    "n_embd_head": "{arch}.attention.key_length",  # default n_embd / n_head
    "n_embd_head_v": "{arch}.attention.value_length",  # default n_embd_head
    "n_rot": "{arch}.rope.dimension_count",  # default n_embd_head
    "rms_eps": "{arch}.attention.layer_norm_rms_epsilon",  # default 1e-5
    "rope_freq_base": "{arch}.rope.freq_base",  # default 10000
    "rope_scaling_type": "{arch}.rope.scaling.type",  # default "none"
    "rope_scaling_factor": "{arch}.rope.scaling.factor",  # freq_scale = 1/factor
    "rope_scale_linear": "{arch}.rope.scale_linear",  # legacy name of the factor
    "n_vocab": "{arch}.vocab_size",  # else len(tokenizer.ggml.tokens)
    "n_expert": "{arch}.expert_count",  # > 0 means mixture of experts
    "n_swa": "{arch}.attention.sliding_window",  # 0 / absent = no local layers
    "swa_pattern": "{arch}.attention.sliding_window_pattern",  # default ArchSpec.swa_pattern
    "rope_freq_base_swa": "{arch}.rope.freq_base_swa",  # default ArchSpec.rope_freq_base_swa
}

# LayerNorm architectures (Falcon, OPT): the norm epsilon has its own key; the
# loader reads it into HParams.rms_eps (the engine's one norm epsilon).
_LAYERNORM_KEYS: Mapping[str, str] = {**_COMMON_KEYS, "rms_eps": "{arch}.attention.layer_norm_epsilon"}

#: Key holding the token list (fallback for the vocabulary size).
TOKENS_KEY = "tokenizer.ggml.tokens"

#: Defaults for optional hyper-parameters that do not depend on others.
DEFAULT_RMS_EPS = 1e-5
DEFAULT_ROPE_FREQ_BASE = 10000.0

_LLAMA_GLOBALS = (
    TensorSpec("tok_embd", "token_embd.weight", ("n_embd", "n_vocab")),
    TensorSpec("output_norm", "output_norm.weight", ("n_embd",), KIND_F32),
    TensorSpec("output", "output.weight", ("n_embd", "n_vocab"), required=False),
    TensorSpec("rope_freqs", "rope_freqs.weight", ("n_rot_half",), KIND_F32, required=False),
    TensorSpec("output_norm_b", "", (), required=False),
    TensorSpec("pos_embd", "", (), required=False),
)

_LLAMA_LAYERS: tuple[TensorSpec, ...] = (
    TensorSpec("attn_norm", "blk.{i}.attn_norm.weight", ("n_embd",), KIND_F32),
    TensorSpec("attn_q", "blk.{i}.attn_q.weight", ("n_embd", "n_embd_q")),
    TensorSpec("attn_k", "blk.{i}.attn_k.weight", ("n_embd", "n_embd_kv")),
    TensorSpec("attn_v", "blk.{i}.attn_v.weight", ("n_embd", "n_embd_kv")),
    TensorSpec("attn_out", "blk.{i}.attn_output.weight", ("n_embd_q", "n_embd")),
    TensorSpec("ffn_norm", "blk.{i}.ffn_norm.weight", ("n_embd",), KIND_F32),
    TensorSpec("ffn_gate", "blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    TensorSpec("ffn_up", "blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    TensorSpec("ffn_down", "blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
)


def _layers(*specs: TensorSpec) -> tuple[TensorSpec, ...]:
    """Per-layer specs in :data:`LAYER_SLOTS` order, slots not given left empty
    (name "", not required)."""
    by_slot = {t.slot: t for t in specs}
    assert set(by_slot) <= set(LAYER_SLOTS), set(by_slot) - set(LAYER_SLOTS)
    return tuple(by_slot.get(slot, TensorSpec(slot, "", (), required=False)) for slot in LAYER_SLOTS)


_LLAMA_LAYERS = _layers(*_LLAMA_LAYERS)

assert tuple(t.slot for t in _LLAMA_GLOBALS) == GLOBAL_SLOTS
assert tuple(t.slot for t in _LLAMA_LAYERS) == LAYER_SLOTS

LLAMA = ArchSpec(
    name="llama",
    powerinfer_relu=True,
    keys=_COMMON_KEYS,
    required_keys=("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train"),
    rope_type=ROPE_NORM,
    act="silu",
    # "llama3" frequency scaling arrives as the rope_freqs.weight tensor, with
    # no scaling type key; "yarn", "longrope", ... are not implemented.
    rope_scaling_types=("none", "linear"),
    global_tensors=_LLAMA_GLOBALS,
    layer_tensors=_LLAMA_LAYERS,
)

# Gemma 3 (llama.cpp's gemma3): GeGLU, q/k RMS norms per head, post-attention and
# post-FFN norms, embeddings scaled by sqrt(n_embd), 5 sliding-window layers to 1
# global, the local layers' RoPE base 10000, NEOX RoPE, head size from key_length.
GEMMA3 = ArchSpec(
    name="gemma3",
    keys=_COMMON_KEYS,
    required_keys=("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train"),
    rope_type=ROPE_NEOX,
    act="gelu",
    rope_scaling_types=("none", "linear"),
    global_tensors=_LLAMA_GLOBALS,
    layer_tensors=_layers(
        *[t for t in _LLAMA_LAYERS if t.name],
        TensorSpec("attn_q_norm", "blk.{i}.attn_q_norm.weight", ("n_embd_head",), KIND_F32),
        TensorSpec("attn_k_norm", "blk.{i}.attn_k_norm.weight", ("n_embd_head",), KIND_F32),
        TensorSpec("attn_post_norm", "blk.{i}.post_attention_norm.weight", ("n_embd",), KIND_F32),
        TensorSpec("ffn_post_norm", "blk.{i}.post_ffw_norm.weight", ("n_embd",), KIND_F32),
    ),
    embd_scale_sqrt=True,
    q_pre_scale=True,
    sliding_window=True,
    swa_pattern=6,
    rope_freq_base_swa=10000.0,
)

# Qwen2 (llama.cpp's qwen2): the llama block with biases on the q/k/v projections
# and NEOX RoPE.
QWEN2 = ArchSpec(
    name="qwen2",
    keys=_COMMON_KEYS,
    required_keys=("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train"),
    rope_type=ROPE_NEOX,
    act="silu",
    rope_scaling_types=("none", "linear"),
    global_tensors=_LLAMA_GLOBALS,
    layer_tensors=_layers(
        *[t for t in _LLAMA_LAYERS if t.name],
        TensorSpec("attn_q_bias", "blk.{i}.attn_q.bias", ("n_embd_q",), KIND_F32, required=False),
        TensorSpec("attn_k_bias", "blk.{i}.attn_k.bias", ("n_embd_kv",), KIND_F32, required=False),
        TensorSpec("attn_v_bias", "blk.{i}.attn_v.bias", ("n_embd_kv",), KIND_F32, required=False),
    ),
)


def _ln(slot: str, stem: str, fallback_stem: str = "") -> tuple[TensorSpec, TensorSpec]:
    """A LayerNorm's weight and bias (F32 [n_embd]) for ``slot`` / ``slot + "_b"``."""
    fb = (f"{fallback_stem}.weight", f"{fallback_stem}.bias") if fallback_stem else ("", "")
    return (
        TensorSpec(slot, f"{stem}.weight", ("n_embd",), KIND_F32, fallback=fb[0]),
        TensorSpec(slot + "_b", f"{stem}.bias", ("n_embd",), KIND_F32, fallback=fb[1]),
    )


_LAYERNORM_GLOBALS = (
    _LLAMA_GLOBALS[0],
    TensorSpec("output_norm", "output_norm.weight", ("n_embd",), KIND_F32),
    _LLAMA_GLOBALS[2],
    _LLAMA_GLOBALS[3],
    TensorSpec("output_norm_b", "output_norm.bias", ("n_embd",), KIND_F32),
    TensorSpec("pos_embd", "", (), required=False),
)

# Falcon (llama.cpp's falcon): LayerNorm with bias; fused q/k/v rows (q heads, then
# the k heads, then the v heads: the converter reorders them so); parallel residual;
# ungated MLP down(gelu(up x)) without biases; NEOX RoPE; multi-query (n_head_kv 1
# in 7B). Falcon 40B has two norms per layer: llama.cpp's attn_norm_2 (HF ln_attn)
# feeds the attention and attn_norm (HF ln_mlp) the MLP; 7B's one attn_norm feeds
# both. PowerInfer's fork stores ffn_down transposed (blk.N.ffn_down_t.weight).
FALCON = ArchSpec(
    name="falcon",
    keys=_LAYERNORM_KEYS,
    required_keys=("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train", "rms_eps"),
    rope_type=ROPE_NEOX,
    act="gelu",
    rope_scaling_types=("none", "linear"),
    global_tensors=_LAYERNORM_GLOBALS,
    layer_tensors=_layers(
        *_ln("attn_norm", "blk.{i}.attn_norm_2", "blk.{i}.attn_norm"),
        *_ln("ffn_norm", "blk.{i}.attn_norm"),
        TensorSpec("attn_qkv", "blk.{i}.attn_qkv.weight", ("n_embd", "n_embd_qkv")),
        TensorSpec("attn_out", "blk.{i}.attn_output.weight", ("n_embd_q", "n_embd")),
        TensorSpec("ffn_up", "blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
        TensorSpec("ffn_down", "blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
    ),
    layer_norm=True,
    parallel_residual=True,
    powerinfer_relu=True,
)

# OPT as PowerInfer's llama.cpp fork defines it (llama.cpp proper has no OPT):
# learned positions (position_embd.weight, n_ctx_train rows; the fork adds 2 to every
# position, HF OPT's offset), LayerNorm with bias, q/k/v/output biases, ungated ReLU
# FFN with biases, no RoPE, output tied to token_embd. The fork's converter writes
# ffn_down transposed with its bias as blk.N.ffn_down_t.bias; a file with
# blk.N.ffn_down.* is read as well.
OPT = ArchSpec(
    name="opt",
    keys=_LAYERNORM_KEYS,
    required_keys=("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train"),
    rope_type=ROPE_NONE,
    act="relu",
    rope_scaling_types=("none",),
    global_tensors=(*_LAYERNORM_GLOBALS[:5], TensorSpec("pos_embd", "position_embd.weight", ("n_embd", "n_ctx_train"))),
    layer_tensors=_layers(
        *_ln("attn_norm", "blk.{i}.attn_norm"),
        *_ln("ffn_norm", "blk.{i}.ffn_norm"),
        *[t for t in _LLAMA_LAYERS if t.slot in ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down")],
        TensorSpec("attn_q_bias", "blk.{i}.attn_q.bias", ("n_embd_q",), KIND_F32),
        TensorSpec("attn_k_bias", "blk.{i}.attn_k.bias", ("n_embd_kv",), KIND_F32),
        TensorSpec("attn_v_bias", "blk.{i}.attn_v.bias", ("n_embd_kv",), KIND_F32),
        TensorSpec("attn_out_bias", "blk.{i}.attn_output.bias", ("n_embd",), KIND_F32),
        TensorSpec("ffn_up_bias", "blk.{i}.ffn_up.bias", ("n_ff",), KIND_F32),
        TensorSpec("ffn_down_bias", "blk.{i}.ffn_down.bias", ("n_embd",), KIND_F32, fallback="blk.{i}.ffn_down_t.bias"),
    ),
    layer_norm=True,
    pos_offset=2,
    llamacpp_loads=False,
)

#: general.architecture value -> its facts
ARCHITECTURES: Mapping[str, ArchSpec] = {"llama": LLAMA, "gemma3": GEMMA3, "qwen2": QWEN2, "falcon": FALCON, "opt": OPT}


def get_arch(name: str) -> ArchSpec:
    """The :class:`ArchSpec` for ``general.architecture == name``.

    Raises:
        KeyError: ``name`` is not a supported architecture.
    """
    return ARCHITECTURES[name]


def layer_tensor_names(arch: str, i: int) -> list[str | None]:
    """GGUF tensor names of layer ``i`` of architecture ``arch``, in
    enum pi_layer_slot order (None for the slots ``arch`` does not have).

    Raises:
        KeyError: unknown architecture.
    """
    return get_arch(arch).layer_tensor_names(i)


def resolve_shape(shape: tuple[str, ...], dims: Mapping[str, int]) -> tuple[int, ...]:
    """Turn a symbolic shape (names from :data:`DIM_NAMES`) into integers using
    ``dims`` (name -> size). Raises KeyError for a name missing from ``dims``."""
    return tuple(int(dims[d]) for d in shape)
