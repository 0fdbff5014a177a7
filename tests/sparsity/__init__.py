"""Tests of ``powerinfer_backend.sparsity``: calibration, predictors and their training."""
