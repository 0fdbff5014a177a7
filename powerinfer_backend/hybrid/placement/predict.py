"""Decode throughput predicted from a plan: bytes each side reads per token, over bandwidths.

Batch-1 decode of a quantized model is memory-bound, so one token costs about the bytes
it reads divided by the bandwidth of the memory they are read from. The model here
(docs/placement.md, "Predicted throughput"):

* **ours** (:func:`predict_ours`, any :class:`Plan`; :func:`layer_time` per layer): per layer,
  serially, the attention block — its weights (every slot but ffn_gate/up/down) and the
  KV cache of ``n_past`` positions (K and V, ``ModelSizes.kv_type``) — from the device when
  the plan put it there, else from the host; then the split FFN, whose two halves run at once:
  ``max(device FFN bytes / device bandwidth, host FFN bytes / host bandwidth)``. The
  device reads its hot neurons' rows (gate row, up row, a Q8_0 down row for a quantized
  file, F16 for an unquantized one); the host reads
  its cold neurons' rows, each row with the probability the FFN mode reads it
  (:data:`ROW_READS`: a row marked "always" is read for every neuron, "freq" only for a
  neuron that fires, with probability its firing frequency). The device reads all its hot
  rows (a ggml ``mul_mat`` over the gathered rows), except with ``device_skips`` in mode
  "predictor", as the ggml device then runs a split layer: the host scores the predictor
  first, then the device reads the gate and up rows of the hot neurons it selects (taken as
  the firing ones) and every down column, while the host reads the selected cold rows:
  ``predictor / host bandwidth + max(device time, the host's other FFN time)``.
  Then the output block (output_norm and the output matrix) where the plan put it,
  plus ``sync_s`` per layer with work on both sides (the round trip of the activations).
  A layer with no neuron on the device runs its FFN as the CPU-only engine does (mode
  "dense": the GGUF tensors as stored; a sparse mode: its rows over the CPU-only down_t,
  in mode "threshold" the GGUF ffn_down instead where the kept rows would read more,
  ``ModelSizes.cpu_down_t_type``); a split layer's host rows use the same down_t
  (``ModelSizes.down_t_type``), their down over the GGUF ffn_down where the cold rows would
  read more (mode "dense": all n_cold; "threshold": by frequency), so a split layer's host
  never reads more than CPU-only's; a layer with every neuron on the device reads its
  FFN tensors as stored there (a whole layer, as llama.cpp's split). Where the host sums a
  layer's whole down (``ModelSizes.host_down``) the device reads no down and the host reads
  ffn_down as stored.
* **llama.cpp's layer split** (:func:`predict_layer_split`): whole layers as stored in
  the GGUF (all tensors plus the KV cache) on the device from the last layer backwards
  while they fit in the budget minus the same scratch our plan reserves, the output block
  too when every layer fits (``-ngl`` counts it as one more layer); each layer and the
  output read densely from where they are; times add up (no overlap).

Not modelled: compute (prefill, or a slow device), the token embedding row (one row),
norms' arithmetic, launch overheads beyond ``sync_s``, the lower efficiency of gathered
rows against streams (docs/sparsity.md measured 15-35% more per byte on the CPU), cache
effects (a model smaller than the last-level cache reads faster than DRAM bandwidth).
Bandwidths are in GB/s (1e9 bytes per second); times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .plan import Plan
from .planners import _check_freq, _check_int
from .sizes import (
    _FFN_ROW_SLOTS,
    ACT_BYTES,
    ModelSizes,
    down_cols,
    kv_bytes_per_layer,
    neuron_bytes,
    row_bytes,
    scratch_bytes,
)

__all__ = [
    "ROW_READS",
    "MODES",
    "LayerTime",
    "LayerBytes",
    "Prediction",
    "default_mode",
    "attn_weight_bytes",
    "ffn_row_bytes",
    "layer_time",
    "split_layer",
    "predict_ours",
    "llama_cpp_offload",
    "predict_layer_split",
    "measure_host_bandwidth",
    "format_predictions",
]

#: Per FFN mode, how each neuron row (gate, up, down) is read: "always" (every neuron)
#: or "freq" (only when the neuron fires: probability = its firing frequency).
#: relu: the gate (the up row of an ungated FFN) decides, the rest only when it fires;
#: threshold: dense gate and up, down rows of the neurons kept; predictor: only the
#: predicted rows (taken as the firing ones).
ROW_READS: dict[str, tuple[str, str, str]] = {
    "dense": ("always", "always", "always"),
    "relu": ("always", "freq", "freq"),
    "threshold": ("always", "always", "freq"),
    "predictor": ("freq", "freq", "freq"),
}
MODES = tuple(ROW_READS)


def default_mode(act: str, *, has_sidecar: bool, has_predictors: bool) -> str:
    """The FFN mode the engine runs by default: "predictor" with trained predictors,
    "relu" for the ReLU activation (exact sparsity), "threshold" with a calibration
    sidecar, else "dense". ``act`` is the FFN activation name ("silu", "gelu", "relu",
    "drelu"); drelu counts as threshold (its up row is always read)."""
    if has_predictors:
        return "predictor"
    if act == "relu":
        return "relu"
    return "threshold" if has_sidecar else "dense"


@dataclass
class LayerTime:
    """One layer's predicted decode cost (bytes per token, seconds per token).

    Attributes:
        layer: index.
        attn_on_device: where the attention block is read from.
        attn_bytes: its weights + the KV cache read.
        device_ffn_bytes, host_ffn_bytes: FFN bytes read on each side.
        t_attn, t_ffn_device, t_ffn_host: seconds for each part.
        t: the layer's seconds: t_attn + the FFN (max of the halves for ours, the sum of
            whatever is on each side for the layer split) + sync.
    """

    layer: int
    attn_on_device: bool
    attn_bytes: int
    device_ffn_bytes: float
    host_ffn_bytes: float
    t_attn: float
    t_ffn_device: float
    t_ffn_host: float
    t: float


@dataclass
class Prediction:
    """Predicted decode throughput of one engine under one placement.

    Attributes:
        engine: "ours" or "llama.cpp layer split".
        device_gbps, host_gbps: the bandwidths used (GB/s).
        layers: one :class:`LayerTime` per layer.
        output_on_device: where the output block is read from.
        output_bytes: output_norm + output matrix bytes.
        t_output: seconds for the output block.
        n_gpu_layers: layers whole on the device (the layer split; None for ours).
        mode: the FFN mode assumed for ours ("dense" for the layer split).
    """

    engine: str
    device_gbps: float
    host_gbps: float
    layers: list[LayerTime]
    output_on_device: bool
    output_bytes: int
    t_output: float
    n_gpu_layers: int | None = None
    mode: str = "dense"
    notes: list[str] = field(default_factory=list)

    @property
    def seconds_per_token(self) -> float:
        return sum(L.t for L in self.layers) + self.t_output

    @property
    def tok_s(self) -> float:
        s = self.seconds_per_token
        return math.inf if s == 0 else 1.0 / s

    @property
    def device_bytes_read(self) -> float:
        """Bytes per token read from device memory."""
        return sum(L.device_ffn_bytes + (L.attn_bytes if L.attn_on_device else 0) for L in self.layers) + (
            self.output_bytes if self.output_on_device else 0
        )

    @property
    def host_bytes_read(self) -> float:
        """Bytes per token read from host memory."""
        return sum(L.host_ffn_bytes + (0 if L.attn_on_device else L.attn_bytes) for L in self.layers) + (
            0 if self.output_on_device else self.output_bytes
        )

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "tok_s": self.tok_s,
            "seconds_per_token": self.seconds_per_token,
            "device_gbps": self.device_gbps,
            "host_gbps": self.host_gbps,
            "mode": self.mode,
            "device_bytes_read": self.device_bytes_read,
            "host_bytes_read": self.host_bytes_read,
            "output_on_device": self.output_on_device,
            "t_output": self.t_output,
            "n_gpu_layers": self.n_gpu_layers,
            "notes": self.notes,
            "layers": [vars(L).copy() for L in self.layers],
        }


def _check_bw(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite bandwidth > 0 in GB/s, got {v!r}")
    return float(v) * 1e9


def attn_weight_bytes(s: ModelSizes, i: int) -> int:
    """Layer ``i``'s dense (non-FFN-row) tensors as stored: attention norms, q/k/v/o,
    biases, ffn_norm and whatever else is not ffn_gate/ffn_up/ffn_down (bytes)."""
    return sum(t.nbytes for slot, t in s.layers[i].items() if slot not in _FFN_ROW_SLOTS)


def ffn_row_bytes(s: ModelSizes, i: int, *, device: bool = False, split: bool = True) -> tuple[int, int, int]:
    """Bytes of one neuron's rows in layer ``i``, as the FFN reads them: gate row (0 for
    an ungated FFN) and up row of n_embd in their GGUF types, the down row of n_embd: on
    the device the gathered down columns' (:func:`~.sizes.down_cols`: Q8_0 for a quantized
    ffn_down, 34 bytes per 32 weights; F16 for an unquantized one); on the host the down_t of a
    split layer (``s.down_t_type``: the CPU-only engine's unless a test pins another), or
    with ``split=False`` the CPU-only engine's (``s.cpu_down_t_type``: Q8_0 for a quantized
    file), which a layer with no neuron on the device keeps."""
    from ...engine.down_cache import down_t_row_bytes

    L = s.layers[i]
    gate = row_bytes(L["ffn_gate"].type, s.n_embd) if "ffn_gate" in L else 0
    if device:
        down = neuron_bytes(s, i)[2]
    else:
        down = down_t_row_bytes(s.down_t_type if split else s.cpu_down_t_type, s.n_embd)
    return gate, row_bytes(L["ffn_up"].type, s.n_embd), down


def _kv_read(s: ModelSizes, n_past: int) -> int:
    return 2 * n_past * row_bytes(s.kv_type, s.n_embd_kv)


def _no_down(rows: tuple, host_down: bool) -> tuple:
    """A neuron's (gate, up, down) rows, the down 0 where the host sums the layer's down."""
    return rows[:2] + (0,) if host_down else rows


def _rows_read(rows: tuple, n: int, fsum: float, how: tuple[str, str, str]) -> float:
    """Expected bytes read for ``n`` neurons whose frequencies sum to ``fsum``: each row
    read for every neuron ("always") or for a firing one ("freq")."""
    return sum(b * (fsum if h == "freq" else n) for b, h in zip(rows, how))


@dataclass(frozen=True)
class LayerBytes:
    """What one layer reads, precomputed for :func:`layer_time` (bytes).

    Attributes:
        attn: the attention weights (:func:`attn_weight_bytes`) + the KV read at n_past.
        host_rows: a neuron's gate, up and down_t rows on the host in a split layer.
        cpu_rows: the same for a layer with no neuron on the device (CPU-only's down_t).
        device_rows: a hot neuron's rows on the device (its down column Q8_0, or F16 for an
            unquantized ffn_down).
        down_block: the device's down columns come in whole blocks of this many neurons
            (32 for Q8_0: zero columns pad the last block, read with it; 1 for F16).
        whole_rows: a neuron's share of the layer's FFN tensors as stored (a whole layer).
        gguf_ffn: the FFN tensors as stored (the dense CPU path).
        gguf_down: ffn_down as stored (the CPU-only threshold mode's down where cheaper).
        host_down_from: the fewest cold neurons at which a layer with neurons on the device
            sums its whole down on the host over ffn_down (``ModelSizes.host_down_from``).
    """

    attn: int
    host_rows: tuple
    cpu_rows: tuple
    device_rows: tuple
    whole_rows: tuple
    gguf_ffn: int
    gguf_down: int
    down_block: int = 1
    host_down_from: int = 1 << 62

    @classmethod
    def of(cls, s: ModelSizes, i: int, n_past: int = 0) -> "LayerBytes":
        L = s.layers[i]
        whole = tuple(L[k].nbytes / s.n_ff if k in L else 0 for k in _FFN_ROW_SLOTS[:2]) + (
            L["ffn_down"].nbytes / s.n_ff,
        )
        return cls(
            attn_weight_bytes(s, i) + _kv_read(s, n_past),
            ffn_row_bytes(s, i),
            ffn_row_bytes(s, i, split=False),
            ffn_row_bytes(s, i, device=True),
            whole,
            sum(L[k].nbytes for k in _FFN_ROW_SLOTS if k in L),
            L["ffn_down"].nbytes,
            down_cols(s, i, 1)[1],
            s.host_down_from[i],
        )


def split_layer(attn_on: bool, n_hot: int, n_ff: int) -> bool:
    """Whether a layer with its attention block on the device or not and ``n_hot`` of its
    ``n_ff`` neurons there has work on both sides: it pays one round trip of its activations
    (``sync_s``)."""
    return (attn_on or n_hot > 0) and (not attn_on or n_hot < n_ff)


def layer_time(
    b: LayerBytes,
    i: int,
    *,
    n_ff: int,
    attn_on: bool,
    n_hot: int,
    hot_fsum: float,
    cold_fsum: float,
    bd: float,
    bh: float,
    mode: str,
    device_skips: bool = False,
    predictor_bytes: int = 0,
    sync_s: float = 0.0,
) -> LayerTime:
    """One layer's predicted decode cost (the model in this module's docstring), with its
    attention block on the device or not and its ``n_hot`` most frequent neurons there
    (frequency sums ``hot_fsum`` / ``cold_fsum``); bd, bh in bytes/s. With no neuron on the
    device the layer's FFN is the CPU-only engine's (dense: the GGUF tensors; sparse: the
    CPU-only down_t; threshold: the GGUF ffn_down where the kept down_t rows read more,
    ``set_ffn_down_dense``); with all of them, the whole FFN as stored on the device. Where
    the host sums the layer's whole down (``n_ff - n_hot >= b.host_down_from``) the device
    reads no down and the host reads ffn_down as stored."""
    how = ROW_READS[mode]
    pred = predictor_bytes if mode == "predictor" else 0
    # the ggml device's skipping (NativeContext.set_ggml_device): a split layer's predictor first
    skips = device_skips and mode == "predictor" and 0 < n_hot < n_ff
    dev_how = ("freq", "freq", "always") if skips else ROW_READS["dense"]
    host_down = 0 < n_hot and n_ff - n_hot >= b.host_down_from
    if n_hot == 0:
        dev = 0.0
        host = float(b.gguf_ffn) if mode == "dense" else _rows_read(b.cpu_rows, n_ff, cold_fsum, how) + pred
        if mode == "threshold":  # the engine's down over ffn_down where the kept rows read more
            host -= max(0.0, b.cpu_rows[2] * cold_fsum - b.gguf_down)
    elif n_hot >= n_ff:
        dev, host = _rows_read(_no_down(b.whole_rows, host_down), n_ff, hot_fsum, dev_how), 0.0
    else:
        dev = _rows_read(_no_down(b.device_rows, host_down), n_hot, hot_fsum, dev_how)
        if not host_down:  # the zero columns of the last down block, read with it
            dev += (-(-n_hot // b.down_block) * b.down_block - n_hot) * b.device_rows[2]
        host = _rows_read(_no_down(b.host_rows, host_down), n_ff - n_hot, cold_fsum, how) + pred
        if not host_down and mode in ("dense", "threshold"):  # the cold rows' down over ffn_down where cheaper
            kept = n_ff - n_hot if mode == "dense" else cold_fsum
            host -= max(0.0, b.host_rows[2] * kept - b.gguf_down)
    if host_down:
        host += b.gguf_down
    t_attn = b.attn / (bd if attn_on else bh)
    td, th = dev / bd, host / bh
    tp = pred / bh if skips else 0.0  # the predictor before the device starts
    both = split_layer(attn_on, n_hot, n_ff)
    t_ffn = tp + max(td, th - tp)
    return LayerTime(i, attn_on, b.attn, dev, host, t_attn, td, th, t_attn + t_ffn + (sync_s if both else 0.0))


def _check_predict_args(device_gbps, host_gbps, mode, n_past, predictor_bytes, sync_s):
    if mode not in ROW_READS:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    bd, bh = _check_bw("device_gbps", device_gbps), _check_bw("host_gbps", host_gbps)
    n_past, predictor_bytes = _check_int("n_past", n_past, 0), _check_int("predictor_bytes", predictor_bytes, 0)
    if not (isinstance(sync_s, (int, float)) and math.isfinite(sync_s) and sync_s >= 0):
        raise ValueError(f"sync_s must be finite seconds >= 0, got {sync_s!r}")
    return bd, bh, n_past, predictor_bytes


def predict_ours(
    sizes: ModelSizes,
    plan: Plan,
    neuron_freq: np.ndarray | None,
    *,
    device_gbps: float,
    host_gbps: float,
    mode: str,
    device_skips: bool = False,
    n_past: int = 0,
    predictor_bytes: int = 0,
    sync_s: float = 0.0,
) -> Prediction:
    """Predicted decode tok/s of our hybrid under ``plan`` (the model in this module's docstring).

    Args:
        sizes: the model's sizes (the ones the plan was made from).
        plan: a placement of ``sizes`` (``plan.layers[i].hot_ids``: device neurons).
        neuron_freq: float (n_layer, n_ff) firing frequencies in [0, 1]; None = all 1.0
            (every neuron fires: no sparsity).
        device_gbps, host_gbps: memory bandwidths in GB/s (> 0).
        mode: one of :data:`MODES` (see :func:`default_mode`).
        device_skips: in mode "predictor", the device computes only the hot neurons the
            predictor selects (the engine's ``device_skips``; else it reads all hot rows).
        n_past: KV positions read per layer (the context length at the token).
        predictor_bytes: bytes of one layer's predictor read on the host per token
            (mode "predictor").
        sync_s: seconds added per layer with work on both sides (the round trip of its
            activations between host and device).

    Returns:
        A :class:`Prediction` (``engine="ours"``).

    Raises:
        ValueError: an unknown mode, a bandwidth <= 0, a negative n_past, predictor_bytes
            or sync_s, a plan whose layer count or n_ff differs from ``sizes``, or a bad
            ``neuron_freq``.
    """
    bd, bh, n_past, predictor_bytes = _check_predict_args(device_gbps, host_gbps, mode, n_past, predictor_bytes, sync_s)
    if len(plan.layers) != sizes.n_layer or plan.n_ff != sizes.n_ff:
        raise ValueError(
            f"plan has {len(plan.layers)} layers of n_ff {plan.n_ff}; the model has {sizes.n_layer} of {sizes.n_ff}"
        )
    freq = _check_freq(sizes, neuron_freq)
    layers = []
    for i, L in enumerate(plan.layers):
        hot = float(freq[i][L.hot_ids].sum())
        layers.append(
            layer_time(
                LayerBytes.of(sizes, i, n_past),
                i,
                n_ff=sizes.n_ff,
                attn_on=L.attn_on_device,
                n_hot=L.n_hot,
                hot_fsum=hot,
                cold_fsum=float(freq[i].sum()) - hot,
                bd=bd,
                bh=bh,
                mode=mode,
                device_skips=device_skips,
                predictor_bytes=predictor_bytes,
                sync_s=sync_s,
            )
        )
    out = sizes.output_norm.nbytes + sizes.output.nbytes
    pred = Prediction(
        "ours",
        device_gbps,
        host_gbps,
        layers,
        plan.output_on_device,
        out,
        out / (bd if plan.output_on_device else bh),
        mode=mode,
    )
    if neuron_freq is None and mode != "dense":
        pred.notes.append("no measured frequencies: every neuron counted as firing")
    return pred


def _gguf_layer_bytes(s: ModelSizes, i: int) -> int:
    return sum(t.nbytes for t in s.layers[i].values())


def llama_cpp_offload(sizes: ModelSizes, vram_budget: int, *, n_ctx: int, n_batch: int) -> tuple[int, bool]:
    """(n_gpu_layers, output_on_device) of llama.cpp's layer split at ``vram_budget`` bytes:
    the last layers whole as stored in the GGUF, each with its KV cache of n_ctx
    positions in ``sizes.kv_type``, the type ours holds (n_ctx rounded up to 64, as ours),
    while they fit in the budget minus our plan's scratch for (n_ctx, n_batch); the output
    block (output_norm + output matrix + n_batch logits) when every layer fits too. No alignment padding: an estimate of
    llama.cpp's own accounting, which reserves its compute buffer as we reserve scratch."""
    left = int(vram_budget) - scratch_bytes(sizes, n_ctx, n_batch)
    n = 0
    for i in reversed(range(sizes.n_layer)):
        b = _gguf_layer_bytes(sizes, i) + kv_bytes_per_layer(sizes, n_ctx)
        if b > left:
            break
        left, n = left - b, n + 1
    out = sizes.output_norm.nbytes + sizes.output.nbytes + n_batch * sizes.n_vocab * ACT_BYTES
    return n, n == sizes.n_layer and out <= left


def predict_layer_split(
    sizes: ModelSizes,
    vram_budget: int,
    *,
    device_gbps: float,
    host_gbps: float,
    n_ctx: int,
    n_batch: int,
    n_past: int = 0,
) -> Prediction:
    """Predicted decode tok/s of llama.cpp with its layer split at ``vram_budget`` bytes
    (:func:`llama_cpp_offload`): every layer read densely as stored, from the device for
    the offloaded ones, else from the host; times add up.

    Raises:
        ValueError: a bandwidth <= 0 or a negative n_past.
    """
    bd, bh = _check_bw("device_gbps", device_gbps), _check_bw("host_gbps", host_gbps)
    n_past = _check_int("n_past", n_past, 0)
    n_gpu, out_on = llama_cpp_offload(sizes, vram_budget, n_ctx=n_ctx, n_batch=n_batch)
    layers = []
    for i in range(sizes.n_layer):
        on = i >= sizes.n_layer - n_gpu
        bw = bd if on else bh
        attn = attn_weight_bytes(sizes, i) + _kv_read(sizes, n_past)
        ffn = float(sum(sizes.layers[i][slot].nbytes for slot in _FFN_ROW_SLOTS if slot in sizes.layers[i]))
        layers.append(
            LayerTime(
                i,
                on,
                attn,
                ffn if on else 0.0,
                0.0 if on else ffn,
                attn / bw,
                ffn / bw if on else 0.0,
                0.0 if on else ffn / bw,
                (attn + ffn) / bw,
            )
        )
    out = sizes.output_norm.nbytes + sizes.output.nbytes
    return Prediction(
        "llama.cpp layer split",
        device_gbps,
        host_gbps,
        layers,
        out_on,
        out,
        out / (bd if out_on else bh),
        n_gpu_layers=n_gpu,
    )


def measure_host_bandwidth(nbytes: int = 256 << 20, n_threads: int = 1, repeats: int = 5) -> float:
    """The host's read bandwidth in GB/s: the best of ``repeats`` passes over a buffer of
    ``nbytes`` (large enough to miss the caches), split over ``n_threads`` threads of the
    engine's pool, as ``bench --roofline`` measures it
    (:func:`powerinfer_backend.engine.roofline.read_bandwidth`). About 0.1-0.5 s.

    Raises:
        ValueError: nbytes < 1 MiB or n_threads < 1.
    """
    if nbytes < (1 << 20) or n_threads < 1:
        raise ValueError(f"nbytes must be >= 1 MiB and n_threads >= 1, got {nbytes}, {n_threads}")
    from ...engine.roofline import read_bandwidth

    return read_bandwidth(n_threads, nbytes, max(1, repeats)) / 1e9


def format_predictions(ours: Prediction, split: Prediction) -> str:
    """Two lines (one per engine: tok/s, bytes read per token on each side) and the ratio."""

    def line(p: Prediction) -> str:
        where = f"n_gpu_layers {p.n_gpu_layers}" if p.n_gpu_layers is not None else f"mode {p.mode}"
        return (
            f"{p.engine:22s} {p.tok_s:10.2f} tok/s   device {p.device_bytes_read / 1e6:10.2f} MB/token   "
            f"host {p.host_bytes_read / 1e6:10.2f} MB/token   ({where})"
        )

    lines = [
        f"predicted decode (device {ours.device_gbps:g} GB/s, host {ours.host_gbps:g} GB/s; memory-bound model, "
        f"docs/placement.md):",
        line(ours),
        line(split),
        f"ratio ours / layer split: {ours.tok_s / split.tok_s:.2f}",
    ]
    lines += [f"note: {n}" for n in ours.notes]
    return "\n".join(lines)
