"""``powerinfer-backend plan --predict`` and ``plan --placement auto``: the cost model's
inputs from the model file and the options (:func:`model_inputs`), and the plan's
predicted decode tok/s, ours and llama.cpp's layer split at the same budget
(:func:`predict_for_plan`; the model: hybrid/placement/predict.py, docs/placement.md
"Predicted throughput")."""

from __future__ import annotations

import os
from typing import Any


def _predictor_bytes(ps) -> int:
    """Bytes one layer's predictor (a PredictorSet, or None) reads per token (the largest
    layer's fc1 + fc2)."""
    if ps is None or not ps.layers:
        return 0
    return max(int(getattr(ps.fc1[i], "nbytes", 0)) + int(getattr(ps.fc2[i], "nbytes", 0)) for i in ps.layers)


def file_predictors(g, args):
    """The predictors ``Llama(sparse="auto")`` runs from the model file itself (a PowerInfer
    file's ``blk.N.fc1/fc2.weight``) under ``plan``'s ``--mode`` (auto or predictor), else None
    (a PredictorSet over ``g``'s tensors: valid while ``g`` is open)."""
    from ..loader.pwri import has_predictors
    from ..sparsity.predictors import pwri_predictors

    return pwri_predictors(g) if args.mode in ("auto", "predictor") and has_predictors(g) else None


def model_inputs(model_path: str | os.PathLike, args) -> dict[str, Any]:
    """What the cost model needs of the model at ``model_path`` under ``plan``'s options
    (``args``: host_bandwidth or None = measured now over ``threads``, mode ("auto" or one
    of predict.MODES), sidecar): {"sizes", "freq", "source", "mode", "predictor_bytes",
    "host_gbps", "host_measured"}; "sizes" with every FFN sparse (``ModelSizes.sparse_ffn``) in
    a sparse mode. Raises ValueError for a bad mode or frequencies."""
    from ..hybrid.placement import ModelSizes, neuron_frequencies
    from ..hybrid.placement import predict as pr
    from ..loader import load_gguf

    g = load_gguf(model_path, verbose=False)
    try:
        sizes = ModelSizes.from_gguf(g)
        act = g.hparams.act_name
        freq, source = neuron_frequencies(model_path, model=g, sparsity_sidecar=args.sidecar or "auto")
        own_bytes = _predictor_bytes(file_predictors(g, args))  # the file's own predictors come first
    finally:
        g.close()
    prof = None
    if source.startswith("sidecar:"):
        from ..sparsity.sidecar import read_sidecar, sidecar_path

        prof = read_sidecar(args.sidecar or sidecar_path(model_path), model_path=model_path)
    pred_bytes = own_bytes or _predictor_bytes(getattr(prof, "predictors", None))
    mode = (
        args.mode
        if args.mode != "auto"
        else pr.default_mode(act, has_sidecar=prof is not None, has_predictors=pred_bytes > 0)
    )
    sizes = sizes.for_mode(mode)  # a sparse mode's layers keep their down_t once split
    measured = args.host_bandwidth is None
    host = pr.measure_host_bandwidth(n_threads=max(1, args.threads)) if measured else args.host_bandwidth
    return {
        "sizes": sizes,
        "freq": freq,
        "source": source,
        "mode": mode,
        "predictor_bytes": pred_bytes,
        "host_gbps": host,
        "host_measured": measured,
    }


def predict_for_plan(model_path: str | os.PathLike, plan, args, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both predictions for ``plan`` of the model at ``model_path``, from the options of
    ``plan --predict`` (``args``: device_bandwidth, device_skips, n_past, sync_us and
    :func:`model_inputs`'s; ``inputs``: its result when already made). Returns {"ours",
    "layer_split", "ratio", "host_bandwidth_measured", "choice", "text"}; raises ValueError
    for bad bandwidths, mode or frequencies."""
    from ..hybrid.placement import POLICIES, device_skips_for
    from ..hybrid.placement import predict as pr

    mi = inputs or model_inputs(model_path, args)
    sizes, freq, source, host = mi["sizes"], mi["freq"], mi["source"], mi["host_gbps"]
    skips = device_skips_for(mi["mode"], plan, args.device_skips)  # as the engine runs the plan
    ours = pr.predict_ours(
        sizes,
        plan,
        freq,
        device_gbps=args.device_bandwidth,
        host_gbps=host,
        mode=mi["mode"],
        device_skips=skips,
        n_past=args.n_past,
        predictor_bytes=mi["predictor_bytes"],
        sync_s=args.sync_us / 1e6,
    )
    split = pr.predict_layer_split(
        sizes,
        plan.budget_bytes,
        device_gbps=args.device_bandwidth,
        host_gbps=host,
        n_ctx=plan.n_ctx,
        n_batch=plan.n_batch,
        n_past=args.n_past,
    )
    ours.notes.append(
        f"frequencies: {source}; host bandwidth {'measured' if mi['host_measured'] else 'given'}; "
        f"device round trip {args.sync_us:g} us per split layer"
    )
    if skips:
        ours.notes.append("the device computes only the hot neurons the predictor selects (device_skips)")
    if source.startswith("gpuidx:"):
        ours.notes.append("gpuidx ranking: its cold neurons count as never firing (optimistic)")
    text = pr.format_predictions(ours, split)
    if plan.choice:
        c = plan.choice
        text += (
            f"\nplacement auto chose {c['policy']} (predicted tok/s: "
            + ", ".join(f"{k} {c['tok_s'][k]:.2f}" for k in POLICIES if k in c["tok_s"])
            + ")"
        )
    return {
        "ours": ours.to_json(),
        "layer_split": split.to_json(),
        "ratio": ours.tok_s / split.tok_s,
        "device_skips": skips,
        "host_bandwidth_measured": mi["host_measured"],
        "choice": plan.choice or None,
        "text": text,
    }
