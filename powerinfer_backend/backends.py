"""The plugin manager: finds backends through the ``powerinfer_backend`` entry points."""

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
    for name in ("powerinfer_backend.plugins", "powerinfer_backend.llamacpp_backend"):
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
