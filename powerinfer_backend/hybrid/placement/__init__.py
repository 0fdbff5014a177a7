"""VRAM placement: which dense blocks and which FFN neurons live on the device.

A pure function, :func:`plan_placement`, turns

* the model's tensor sizes in their stored types (:class:`ModelSizes`, built from a
  loaded GGUF by :meth:`ModelSizes.from_gguf`),
* per-neuron firing frequencies (float (n_layer, n_ff) in [0, 1], from the
  calibration sidecar's ``neuron_freq``; uniform 1.0 when absent),
* a budget in bytes, ``n_ctx`` and ``n_batch``

into a :class:`Plan` whose byte total (:attr:`Plan.device_bytes`) is exact and never
exceeds the budget. docs/placement.md describes the algorithm and the accounting;
in short, every tensor is counted as the device's ggml buffer type allocates it (a
:class:`Sizer`: its ``tensor_bytes`` rounded up to its ``alignment``), and

* the compute buffer (the graphs' scratch for ``n_batch`` tokens) is reserved first:
  nothing goes to the device unless it fits;
* then the dense blocks, in order: per layer the attention block (attn_norm, q, k, v,
  output, ffn_norm, every other non-FFN tensor of the layer, and its KV cache for
  ``n_ctx`` tokens), layers 0..n-1, then the output block (output_norm, output
  projection or the tied embedding); a block that does not fit is skipped and the
  next one tried;
* then FFN neurons across all layers, a fractional knapsack: neurons of a layer are
  ranked by frequency (ties: lower id first), cut into groups of
  :data:`NEURON_GROUP`, and groups are taken in decreasing frequency per byte
  (ties: lower group rank, then lower layer) while they fit; a group that does not
  fit whole is taken in part (the most its layer can still add) and closes its
  layer.

:func:`plan_for_model` caches the plan beside the model (``placement.json`` in the
artifact folder, :mod:`powerinfer_backend.loader.artifacts`) and reuses it when its inputs
match; :func:`parse_vram_budget` and :func:`resolve_budget` turn user input into bytes.

One concern a module: ``sizes`` (tensor sizes and the byte arithmetic), ``plan``
(:class:`Plan` and its JSON file format), ``planners`` (:func:`plan_placement`,
:func:`plan_layer_split`), ``budget`` (user input to bytes), ``cache`` (the plan stored
beside the model), ``plot`` (:func:`write_plot`) and ``predict`` (decode tok/s predicted
from a plan and bandwidths: :func:`predict_ours`, :func:`predict_layer_split`), ``auto``
(the throughput-aware planner and ``placement="auto"``: :func:`plan_throughput`,
:func:`plan_auto`) and ``bandwidth`` (the device's and the host's GB/s). Every
name is re-exported here, so ``from powerinfer_backend.hybrid import placement``
reaches them all.
"""

from __future__ import annotations

from .auto import POLICIES, device_skips_for, plan_auto, plan_throughput, why_auto_placed_nothing, why_placed_nothing
from .bandwidth import (
    GPU_BANDWIDTH_GBPS,
    GPU_RUNTIME_RESERVE,
    GPU_SYNC_S,
    UNKNOWN_GPU_GBPS,
    budget_after_reserve,
    device_bandwidth,
    device_reserve,
    device_sync,
    gpu_bandwidth,
    host_bandwidth,
)
from .budget import DEFAULT_FREE_MARGIN, BudgetDecision, parse_vram_budget, resolve_budget
from .cache import PLAN_NAME, load_plan, neuron_frequencies, plan_for_model, plan_path
from .plan import FORMAT_VERSION, LayerPlan, Plan
from .planners import plan_layer_split, plan_placement, why_nothing_placed
from .plot import write_plot
from .predict import (
    MODES,
    ROW_READS,
    LayerTime,
    Prediction,
    attn_weight_bytes,
    default_mode,
    ffn_row_bytes,
    format_predictions,
    llama_cpp_offload,
    measure_host_bandwidth,
    predict_layer_split,
    predict_ours,
)
from .sizes import (
    ACT_BYTES,
    CPU_ALIGN,
    CPU_BUFT,
    KV_ELEM_BYTES,
    KV_PAD,
    KV_TYPE,
    NEURON_GROUP,
    BufferRule,
    GiB,
    KiB,
    MiB,
    ModelSizes,
    Sizer,
    TensorSize,
    TiB,
    align_up,
    attn_block_bytes,
    compute_bytes,
    dense_weight_bytes,
    full_device_bytes,
    hot_bytes,
    kv_bytes_per_layer,
    layer_bytes,
    neuron_bytes,
    down_cols,
    output_block_bytes,
    row_bytes,
    scratch_bytes,
    tensor_device_bytes,
)

__all__ = [
    "KiB",
    "MiB",
    "GiB",
    "TiB",
    "CPU_ALIGN",
    "NEURON_GROUP",
    "KV_PAD",
    "KV_TYPE",
    "KV_ELEM_BYTES",
    "ACT_BYTES",
    "DEFAULT_FREE_MARGIN",
    "PLAN_NAME",
    "FORMAT_VERSION",
    "Sizer",
    "BufferRule",
    "CPU_BUFT",
    "TensorSize",
    "ModelSizes",
    "LayerPlan",
    "Plan",
    "BudgetDecision",
    "row_bytes",
    "align_up",
    "tensor_device_bytes",
    "compute_bytes",
    "kv_bytes_per_layer",
    "scratch_bytes",
    "dense_weight_bytes",
    "attn_block_bytes",
    "output_block_bytes",
    "hot_bytes",
    "neuron_bytes",
    "down_cols",
    "full_device_bytes",
    "layer_bytes",
    "plan_placement",
    "plan_layer_split",
    "why_nothing_placed",
    "neuron_frequencies",
    "parse_vram_budget",
    "resolve_budget",
    "plan_path",
    "plan_for_model",
    "load_plan",
    "write_plot",
    "MODES",
    "ROW_READS",
    "Prediction",
    "LayerTime",
    "attn_weight_bytes",
    "ffn_row_bytes",
    "predict_ours",
    "predict_layer_split",
    "llama_cpp_offload",
    "measure_host_bandwidth",
    "format_predictions",
    "default_mode",
    "POLICIES",
    "plan_auto",
    "device_skips_for",
    "plan_throughput",
    "why_auto_placed_nothing",
    "why_placed_nothing",
    "GPU_BANDWIDTH_GBPS",
    "UNKNOWN_GPU_GBPS",
    "GPU_SYNC_S",
    "GPU_RUNTIME_RESERVE",
    "device_bandwidth",
    "device_reserve",
    "budget_after_reserve",
    "device_sync",
    "gpu_bandwidth",
    "host_bandwidth",
]
