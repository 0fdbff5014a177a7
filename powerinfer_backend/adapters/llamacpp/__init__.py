"""llama-cpp drop-in: make ``llama_cpp.Llama`` powerinfer_backend's ``Llama``.

Code that does ``from llama_cpp import Llama`` (or ``llama_cpp.Llama(...)``) — llama-cpp-python's
own server, LangChain's ``LlamaCpp``, LlamaIndex, ... — gets our engine after::

    from powerinfer_backend.adapters import llamacpp
    llamacpp.install(vram_budget=4)      # before the other library creates its model
    ...
    llamacpp.uninstall()                 # optional: put llama.cpp's class back

``install(**defaults)`` replaces the attribute ``Llama`` of the ``llama_cpp`` package with a
subclass of our ``Llama`` whose keyword defaults are
``defaults`` (e.g. ``vram_budget``, ``sparse``, ``n_threads``); an explicit keyword of the
caller wins. Modules that already did ``from llama_cpp import Llama`` keep the name they
bound: install first, or pass ``also=[module, ...]`` to patch their ``Llama`` too. The
swap is explicit on purpose: importing powerinfer_backend never changes llama_cpp.
``llama_cpp.llama.Llama`` (the defining module's global) stays llama.cpp's: llama-cpp-python's
own code refers to it by that global name.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Optional

_lock = threading.Lock()
_saved: Optional[dict] = None  # {(module, attribute): original}


def _dropin_class(defaults: dict):
    from powerinfer_backend.llama import Llama as _Ours

    class Llama(_Ours):  # the name llama_cpp's class has, as code printing it expects
        """powerinfer_backend's ``Llama`` standing in for ``llama_cpp.Llama``
        (installed by ``powerinfer_backend.adapters.llamacpp.install``)."""

        _dropin_defaults = dict(defaults)

        def __init__(self, model_path: str, *args: Any, **kwargs: Any):
            if args:  # llama_cpp.Llama's parameters are keyword-only after model_path
                raise TypeError("Llama() takes model_path and keyword arguments only")
            super().__init__(model_path, **{**self._dropin_defaults, **kwargs})

    Llama.__module__ = "powerinfer_backend.adapters.llamacpp"
    Llama.__qualname__ = "Llama"
    return Llama


def install(*, also: Iterable[Any] = (), **defaults: Any):
    """Make ``llama_cpp.Llama`` powerinfer_backend's
    ``Llama`` with ``defaults`` as keyword defaults; returns the installed class.
    ``also``: further modules whose ``Llama`` attribute to replace (they imported the
    name before). Installing again replaces the defaults."""
    global _saved
    import llama_cpp

    with _lock:
        if _saved is None:
            _saved = {}
        cls = _dropin_class(defaults)
        name = "Llama"  # the key holds the name: uninstall sets back by it
        for mod in (llama_cpp, *also):
            key = (mod, name)
            if key not in _saved:
                _saved[key] = getattr(mod, name)
            setattr(mod, name, cls)
    return cls


def uninstall() -> None:
    """Put back every ``Llama`` attribute :func:`install` replaced."""
    global _saved
    with _lock:
        if _saved is None:
            return
        for (mod, name), original in _saved.items():
            setattr(mod, name, original)
        _saved = None


def installed() -> bool:
    """Whether ``llama_cpp.Llama`` is currently ours."""
    import llama_cpp

    from powerinfer_backend.llama import Llama

    return isinstance(llama_cpp.Llama, type) and issubclass(llama_cpp.Llama, Llama)


def original_llama():
    """llama-cpp-python's own ``Llama`` class, installed or not."""
    import llama_cpp

    with _lock:
        if _saved is not None:
            return _saved[(llama_cpp, "Llama")]
    return llama_cpp.Llama


__all__ = ["install", "uninstall", "installed", "original_llama"]
