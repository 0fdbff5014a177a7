"""powerinfer_backend: local LLM inference exploiting FFN activation sparsity, with a
llama-cpp-python compatible ``Llama`` class (``vram_budget`` in GiB instead of
``n_gpu_layers``)."""

__version__ = "0.1.0"

from .llama import Llama  # noqa: E402

__all__ = ["Llama", "__version__"]
