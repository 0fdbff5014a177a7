"""The ``server`` layer (above ``llama.py``): the OpenAI- and llama-server-compatible HTTP
server (FastAPI, docs/serving.md) and its command-line options. Needs the ``[server]``
extra.

``create_app`` and ``serve`` (:mod:`.app`) are exported lazily: importing this package,
or :mod:`.options`, does not need FastAPI."""

__all__ = ["create_app", "serve"]


def __getattr__(name):
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
