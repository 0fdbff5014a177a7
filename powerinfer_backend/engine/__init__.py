"""Layer 3, ``engine``: thin owning wrappers over the C library, and the only code that
calls ``lib.pi_*`` besides ``_native`` itself.

Owns ``NativeModel`` / ``NativeContext`` (a C model over a loaded GGUF, a context with its
KV cache), the native worker pool and device handles, the transposed ``ffn_down`` cache
build (``down_cache``) and the C predictor scores (``scores``)."""

from .native import NativeContext, NativeModel, default_threads  # noqa: F401
