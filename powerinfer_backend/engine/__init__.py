"""The ``engine`` layer (above ``loader``): thin owning wrappers over the C library, and
the only code that calls ``lib.pi_*`` besides ``_native`` itself.

Owns ``NativeModel`` / ``NativeContext`` (``native``: a C model over a loaded GGUF, a
context with its KV cache), the worker pool (``pool``), the device handles (``device``:
``pi_device`` and its FFN halves), the kernel entry points the benchmarks time
(``kernels``), the host's measured roofs (``roofline``: read bandwidth, int8 peak), the transposed ``ffn_down`` cache build (``down_cache``), the C predictor
scores (``scores``), the argument-struct conversions (``tensors``) and the close-once helper
they share (``closing``)."""

from .native import FFN_HIST_BINS, FFN_HIST_MIN_EXP, NativeContext, NativeModel, default_threads  # noqa: F401
