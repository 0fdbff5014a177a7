"""The old path of the GGUF loader, kept until its importers move to
:mod:`powerinfer_backend.loader` (or its modules): ``load`` (:class:`GGUFModel`,
:func:`load_gguf`), ``types`` (:class:`TensorView`, :data:`KERNEL_TYPES`, ...),
``hparams`` (:class:`HParams`), ``reader`` (``_Reader``) and ``convert``."""

from .arch import ArchSpec, TensorSpec, layer_tensor_names  # noqa: F401
from .hparams import HParams  # noqa: F401
from .load import PWRI_LAYER_TENSORS, GGUFModel, load_gguf  # noqa: F401
from .reader import _Reader  # noqa: F401
from .types import GGUF_MAGIC, KERNEL_TYPES, PWRI_MAGIC, TensorView, UnsupportedTensorTypeWarning  # noqa: F401

__all__ = [
    "GGUFModel",
    "HParams",
    "TensorView",
    "UnsupportedTensorTypeWarning",
    "KERNEL_TYPES",
    "load_gguf",
    "layer_tensor_names",
]
