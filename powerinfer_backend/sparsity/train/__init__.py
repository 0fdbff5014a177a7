"""Training activation predictors (``powerinfer-backend train-predictor``; docs/predictors.md).
This package owns the training: ``capture`` (FFN inputs and labels), ``fit`` (the
fitting loops and losses), ``allocate`` (per-layer densities and thresholds under the
perplexity budget) and ``command`` (:func:`train_predictors`, the sidecar it writes).

PowerInfer ships predictors but not the code that trains them; this is ours.

1. **Data.** The text (after ``--offset-bytes``/``--max-bytes``) is tokenized; its last
   ``heldout_tokens`` (whole chunks) are held out for the perplexity budget, the first
   ``tokens`` are run densely through the engine while ``pi_context_set_ffn_capture``
   copies every layer's normed FFN input x (stored as float16). The FFN activation
   ``h = act(gate.x) * (up.x)`` is recomputed from x with the dequantized gate/up
   weights (float32), so no (n_tok x n_ff) activations are stored.
2. **Labels.** Per layer, a neuron is "active" when ``|h| >= t_l``, t_l the
   ``label_sparsity``-quantile of the layer's |h| (for SwiGLU/GeGLU the product, not
   the gate alone). ``label_sparsity`` defaults to 0.5.
3. **Loss.** ``loss="mse"`` (default): the score ``fc2.relu(fc1.x)`` regresses onto each
   neuron's importance ``|h_j| * ||down_j|| / m_l`` (m_l the layer's mean), so the
   predictor ranks neurons by what they add to the FFN output. ``loss="bce"``: binary
   cross-entropy on the labels with every positive weighted by
   ``pos_weight * clip(|h| * ||down_j|| / m_l, 0.25, cap)`` (the earlier scheme). fc1 is
   initialised from the top right singular vectors of the gate weights, in +/- pairs.
   Adam, cosine learning rate. torch when installed (the ``[train]`` extra), else the
   same model and losses in numpy (slower; exact gradients written out).
4. **Thresholds.** On a validation slice (the last 10% of the captured tokens) every
   layer gets an error curve: per density d the score threshold keeping a fraction d and
   the relative FFN output error (:func:`error_curve`). ``select="density"`` (default):
   a mean density D is split over the layers by :func:`allocate_densities`, on the
   error curves scaled by each layer's measured NLL rise at ``probe_density``
   (``allocate="sensitivity"``), on the raw curves (``"error"``) or evenly
   (``"uniform"``); ``density`` fixes D, otherwise D is the lowest grid value whose
   held-out perplexity is within ``margin * max_ppl_increase`` of dense.
   ``select="recall"`` (or ``recall=R``): every layer keeps a fraction R of its
   labelled-active neurons. A layer above ``max_density`` gets no predictor.
5. **Output.** The predictors (``blk.N.fc1.weight`` / ``blk.N.fc2.weight``, float16 or
   ``quantize="q8_0"``),
   thresholds and per-layer precision / recall / predicted density go into the
   sparsity sidecar (created if missing, its calibration kept otherwise).
"""

from __future__ import annotations

from .allocate import (
    DENSITY_GRID,
    LAYER_DENSITIES,
    RECALL_GRID,
    allocate_densities,
    error_curve,
    layer_metrics,
    threshold_for_recall,
)
from .capture import layer_h
from .command import TrainError, format_table, train_predictors
from .fit import have_torch

__all__ = [
    "train_predictors",
    "TrainError",
    "have_torch",
    "RECALL_GRID",
    "DENSITY_GRID",
    "LAYER_DENSITIES",
    "format_table",
    "error_curve",
    "allocate_densities",
    "layer_metrics",
    "threshold_for_recall",
    "layer_h",
]
