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


def _checkout_adapters() -> None:
    """From a source checkout (``PYTHONPATH=.``, no install), ``powerinfer_backend.adapters``
    is the top-level ``adapters/`` folder, as an install maps it (setup.py)."""
    import importlib.util
    import os
    import sys

    name = __name__ + ".adapters"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    init = os.path.join(root, "adapters", "__init__.py")
    if name in sys.modules or os.path.isdir(os.path.join(os.path.dirname(__file__), "adapters")):
        return
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            ours = 'name = "powerinfer_backend"' in f.read()
    except OSError:
        ours = False
    if not ours or not os.path.isfile(init):
        return  # installed: the package-dir mapping provides it
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    globals()["adapters"] = module


_checkout_adapters()
