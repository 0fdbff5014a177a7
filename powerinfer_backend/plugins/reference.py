"""llama.cpp (through llama-cpp-python) as the reference engine for parity tests and
benchmarks, loaded on the same GGUF and thread count as ours.

llama.cpp's "extra buffer types" (AMX / repacked weights) are turned off: on CPUs that
report AMX inside VMs that do not grant it (this project's CI machines), llama.cpp
crashes in its AMX kernels on the first eval. Plain llama.cpp CPU kernels remain.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def _no_extra_buffer_types():
    import llama_cpp
    import llama_cpp.llama as llama_mod

    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    llama_mod.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        llama_mod.llama_cpp.llama_model_default_params = orig


def load_reference(model_path: str, **kwargs):
    """A ``llama_cpp.Llama`` on ``model_path`` (kwargs as for llama_cpp.Llama), with
    AMX/repack buffers disabled (see module docstring).

    Raises:
        ValueError: the file's vocabulary would abort llama.cpp or it refuses it
            (:func:`powerinfer_backend.loader.vocab.check_vocab`), or llama-cpp-python
            cannot load the file.
    """
    from ..loader.vocab import check_vocab
    from ..text.tokenizer import llama_cpp_class

    check_vocab(model_path)

    kwargs.setdefault("verbose", False)
    with _no_extra_buffer_types():
        return llama_cpp_class()(model_path=model_path, **kwargs)
