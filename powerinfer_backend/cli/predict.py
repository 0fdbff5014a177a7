"""``powerinfer-backend plan --predict``: the plan's predicted decode tok/s, ours and
llama.cpp's layer split at the same budget (the model: hybrid/placement/predict.py,
docs/placement.md "Predicted throughput")."""

from __future__ import annotations

import os
from typing import Any


def _predictor_bytes(prof) -> int:
    """Bytes one layer's predictor reads per token (the largest layer's fc1 + fc2)."""
    ps = getattr(prof, "predictors", None)
    if ps is None or not ps.layers:
        return 0
    return max(int(getattr(ps.fc1[i], "nbytes", 0)) + int(getattr(ps.fc2[i], "nbytes", 0)) for i in ps.layers)


def predict_for_plan(model_path: str | os.PathLike, plan, args) -> dict[str, Any]:
    """Both predictions for ``plan`` of the model at ``model_path``, from the options of
    ``plan --predict`` (``args``: device_bandwidth, host_bandwidth or None = measured,
    mode ("auto" or one of predict.MODES), device_skips, n_past, sync_us, threads,
    sidecar). Returns {"ours", "layer_split", "ratio", "host_bandwidth_measured",
    "text"}; raises ValueError for bad bandwidths, mode or frequencies."""
    from ..hybrid.placement import ModelSizes, neuron_frequencies
    from ..hybrid.placement import predict as pr
    from ..loader import load_gguf

    g = load_gguf(model_path, verbose=False)
    try:
        sizes = ModelSizes.from_gguf(g)
        act = g.hparams.act_name
        freq, source = neuron_frequencies(model_path, model=g, sparsity_sidecar=args.sidecar or "auto")
    finally:
        g.close()
    prof = None
    if source.startswith("sidecar:"):
        from ..sparsity.sidecar import read_sidecar, sidecar_path

        prof = read_sidecar(args.sidecar or sidecar_path(model_path), model_path=model_path)
    mode = args.mode if args.mode != "auto" else pr.default_mode(act, has_sidecar=prof is not None,
                                                                   has_predictors=_predictor_bytes(prof) > 0)
    measured = args.host_bandwidth is None
    host = pr.measure_host_bandwidth(n_threads=max(1, args.threads)) if measured else args.host_bandwidth
    ours = pr.predict_ours(sizes, plan, freq, device_gbps=args.device_bandwidth, host_gbps=host, mode=mode,
                           device_skips=args.device_skips, n_past=args.n_past,
                           predictor_bytes=_predictor_bytes(prof), sync_s=args.sync_us * 1e-6)
    split = pr.predict_layer_split(sizes, plan.budget_bytes, device_gbps=args.device_bandwidth, host_gbps=host,
                                   n_ctx=plan.n_ctx, n_batch=plan.n_batch, n_past=args.n_past)
    ours.notes.append(f"frequencies: {source}; host bandwidth {'measured' if measured else 'given'}")
    if source.startswith("gpuidx:"):
        ours.notes.append("gpuidx ranking: its cold neurons count as never firing (optimistic)")
    return {"ours": ours.to_json(), "layer_split": split.to_json(), "ratio": ours.tok_s / split.tok_s,
            "host_bandwidth_measured": measured, "text": pr.format_predictions(ours, split)}
