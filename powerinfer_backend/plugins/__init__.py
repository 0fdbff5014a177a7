"""The ``plugins`` layer (above ``hybrid``, below ``llama.py``, which picks its backend
here): the pluggy seam. All hookspecs (``hookspecs``), the plugin manager and backend
selection (``manager``), the built-in backends: ``hybrid`` (the native engine) and
``llama_cpp`` (llama.cpp through llama-cpp-python, ``llamacpp``; also the reference
engine of parity tests and the benchmark, ``reference``)."""
