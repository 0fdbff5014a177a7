"""The plugin manager: finds backends through the ``powerinfer_backend`` entry points,
and chooses one for a model (``Llama(backend=...)``)."""

from __future__ import annotations

import functools
import importlib

import pluggy

from . import hookspecs


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    for name in ("powerinfer_backend.plugins.hybrid", "powerinfer_backend.plugins.llamacpp"):
        if not any(getattr(p, "__name__", "") == name for p in pm.get_plugins()):
            # running from a source tree that was never pip-installed (or installed before
            # this built-in existed): no entry point yet
            pm.register(importlib.import_module(name))
    return pm


def available_backends() -> dict:
    """``{name: factory}`` over every registered plugin (later plugins cannot shadow earlier names)."""
    found: dict = {}
    for result in reversed(plugin_manager().hook.powerinfer_backend_register()):
        for name, factory in result.items():
            found.setdefault(name, factory)
    return found


def create_backend(name: str, model_path: str, **options):
    """Build backend ``name``. Raises ValueError for an unknown name (listing the known ones)."""
    backends = available_backends()
    if name not in backends:
        raise ValueError(f"unknown backend {name!r}; available: {sorted(backends)}")
    return backends[name](model_path, **options)


def select_backend(name: str, model_path: str, options: dict):
    """The backend ``Llama(backend=name)`` runs on: ``(name, backend)``.

    ``"auto"`` asks the plugins first (hook ``powerinfer_backend_select``), then tries the
    native engine (``"hybrid"``), and falls back to llama.cpp (``"llama_cpp"``) only for an
    architecture the native engine does not know.

    Raises:
        ValueError: unknown backend name, or a model neither engine loads (both messages).
    """
    if name == "auto":
        name = plugin_manager().hook.powerinfer_backend_select(model_path=model_path, options=dict(options)) or "auto"
    if name != "auto":
        return name, create_backend(name, model_path, **options)
    try:
        return "hybrid", create_backend("hybrid", model_path, **options)
    except ValueError as e:
        if "unknown model architecture" not in str(e):
            raise
        try:
            return "llama_cpp", create_backend("llama_cpp", model_path, **options)
        except Exception as e2:  # keep our message: it names the architecture and what is supported
            raise ValueError(f"{e}; llama.cpp could not load it either ({e2})") from e2
