"""The ``engine`` layer (above ``loader``): thin owning wrappers over the C library, and
the only code that calls ``lib.pi_*`` besides ``_native`` itself.

Owns ``NativeModel`` / ``NativeContext`` (``native``: a C model over a loaded GGUF, a
context with its KV cache), the worker pool (``pool``), the ggml binding and its devices
(``ggml``: :class:`~.ggml.GgmlDevice`, which a context places a plan on), the single
operators the FFN density sweep times (``kernels``), the host's measured roofs
(``roofline``: read bandwidth, int8 peak), the transposed ``ffn_down`` cache build
(``down_cache``), the C predictor scores (``scores``), the argument-struct conversions
(``tensors``), the close-once helper they share (``closing``) and the C library's test hooks
(``testing``: only in a ``POWERINFER_TESTING=1`` build)."""

from .native import FFN_HIST_BINS, FFN_HIST_MIN_EXP, NativeContext, NativeModel, default_threads

__all__ = ["FFN_HIST_BINS", "FFN_HIST_MIN_EXP", "NativeContext", "NativeModel", "default_threads"]
