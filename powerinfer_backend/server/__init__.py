"""The ``server`` layer (above ``llama.py``): the OpenAI- and llama-server-compatible HTTP
server (FastAPI, docs/serving.md) and its command-line options. Needs the ``[server]``
extra.

``create_app`` and ``serve`` (:mod:`.app`) are exported lazily: importing this package,
or :mod:`.options`, does not need FastAPI."""

# name -> module holding it
_LAZY = {"create_app": "app", "serve": "app"}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
