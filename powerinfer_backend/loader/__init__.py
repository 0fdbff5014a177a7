"""The ``loader`` layer (above ``_native``): pure Python reading of model files, no native
code.

Owns the architecture table (``arch``) and GGUF reading: GGUF/ggml type facts and tensor
views (``types``), the guarded header parse straight from the memory map (``gguf_meta``: the
one GGUF reader; the ``gguf`` package writes files and is the tests' reference), the parsed
header as the model keeps it and as plain values and arrays for small files (``reader``),
hyper-parameters (``hparams``), conversion of types the kernels lack (``convert``) and the
validated, memory-mapped model (``load``: ``load_gguf``); llama.cpp's vocabulary rules,
checked before a file reaches llama.cpp (``vocab``: ``check_vocab``, over ``gguf_meta``'s metadata, with
``vocab_texts`` and ``ugm_charsmap``). Also PowerInfer's files as raw tensors
(``pwri``), the per-model artifact folders (``artifacts``) and the embedded default
model's location (``models``). Imports nothing above itself."""

from .arch import ArchSpec, TensorSpec, layer_tensor_names
from .hparams import HParams
from .load import PWRI_LAYER_TENSORS, GGUFModel, load_gguf
from .types import GGUF_MAGIC, KERNEL_TYPES, PWRI_MAGIC, TensorView, UnsupportedTensorTypeWarning
from .vocab import check_vocab

__all__ = [
    "GGUF_MAGIC",
    "PWRI_MAGIC",
    "PWRI_LAYER_TENSORS",
    "ArchSpec",
    "GGUFModel",
    "HParams",
    "KERNEL_TYPES",
    "TensorSpec",
    "TensorView",
    "UnsupportedTensorTypeWarning",
    "check_vocab",
    "layer_tensor_names",
    "load_gguf",
]
