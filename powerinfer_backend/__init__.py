"""powerinfer_backend: local LLM inference exploiting FFN activation sparsity, with a
llama-cpp-python compatible ``Llama`` class (``vram_budget`` in GiB instead of
``n_gpu_layers``)."""

__version__ = "0.1.0"

import os as _os

# Before anything here loads llama.cpp: on an abort ggml otherwise starts gdb for a
# backtrace (and installs a terminate handler doing so at library load), which stalls.
_os.environ.setdefault("GGML_NO_BACKTRACE", "1")

from .llama import Llama

__all__ = ["Llama", "__version__"]
