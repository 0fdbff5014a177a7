"""The ``plugins`` layer (above ``hybrid``, below ``llama.py``, which picks its backend
here): the pluggy seam. All hookspecs (``hookspecs``), the plugin manager and backend
selection (``manager``), the built-in backends: ``hybrid`` (the native engine) and
``llama_cpp`` (llama.cpp through llama-cpp-python, ``llamacpp``; also the reference
engine of parity tests and the benchmark, ``reference``)."""


def __getattr__(name):
    # the old flat plugins module's names, now in plugins.hybrid (lazily: importing the
    # package for its hookspecs loads no engine)
    if name in ("HybridBackend", "powerinfer_backend_register"):
        from . import hybrid

        return getattr(hybrid, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
