"""The ``sparsity`` layer (above ``text``): FFN activation sparsity on the CPU
(docs/sparsity.md).

Owns the sparse modes of a context (``modes``: ``sparse="auto|off|threshold|predictor"``),
the sidecar GGUF (``sidecar``), threshold calibration (``calibrate``), chunked perplexity
(``perplexity``), activation predictors (``predictors``) and their training (``train``), and
the measure-choose-write skeleton calibration and training share (``sidecar_run``)."""
