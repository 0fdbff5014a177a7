"""Layer 2, ``loader``: pure Python reading of model files, no native code.

Owns the architecture table (``arch``), GGUF reading with the ``gguf`` package
(memory-mapped tensor views, validation, hyper-parameters, type conversion), PowerInfer's
files as raw tensors (``pwri``), the per-model artifact folders (``artifacts``) and the
embedded default model's location (``models``). Imports nothing above itself."""
