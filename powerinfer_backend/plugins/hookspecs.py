"""The pluggy seam: every hook a backend plugin may implement (all specs live here).

A backend plugin is a module or object with a ``powerinfer_backend_register``
hook implementation, published under the entry-point group ``powerinfer_backend``.
The built-in native engine registers itself as ``"hybrid"`` exactly that way.
"""

from __future__ import annotations

import pluggy

PROJECT = "powerinfer_backend"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def powerinfer_backend_register() -> dict:
    """Return ``{name: factory}``; ``factory(model_path, **options)`` builds a backend.

    A backend object provides: ``n_vocab``, ``n_embd``, ``n_ctx`` (int),
    ``n_ctx_train`` (int), ``metadata`` (dict[str, str]), ``n_past`` (cached
    positions), ``eval(tokens, logits_all=False) -> float32 ndarray (rows, n_vocab)``,
    ``embeddings() -> float32 ndarray (rows, n_embd)``, ``truncate(n_keep)``, ``close()``.
    Options passed by :class:`powerinfer_backend.Llama`: ``n_ctx`` (tokens, 0 = the
    model's training context), ``n_batch``, ``n_threads``, ``vram_budget`` (GiB or
    None), ``verbose``, ``sparse`` ("auto", "off", "threshold", "predictor" or a
    sidecar path; :mod:`powerinfer_backend.sparsity.modes`), and ``n_seq_max`` only when not 1
    (``Llama(n_seq_max=...)``). Optional: ``stats(reset=False) -> dict`` (measured sparsity;
    ``Llama.stats()`` returns it), ``n_ctx_seq`` (sequence 0's window when ``n_ctx`` is a
    total over several sequences), ``native_context`` (``Llama.native_context``).
    """
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations


@hookspec(firstresult=True)
def powerinfer_backend_select(model_path: str, options: dict):
    """Name of the backend for ``Llama(model_path, backend="auto")`` (the default), or
    None to leave the choice to other plugins. The first non-None answer wins; when no
    plugin answers, the native ``"hybrid"`` engine is used, and ``"llama_cpp"`` for an
    architecture it does not run. ``options``: what the backend factory will receive.
    """


@hookspec
def powerinfer_backend_model_loaded(llama, backend_name: str) -> None:
    """Called once a :class:`powerinfer_backend.Llama` is ready (backend and tokenizer
    loaded); ``backend_name`` is the backend chosen."""


@hookspec
def powerinfer_backend_model_unloaded(llama) -> None:
    """Called when a :class:`powerinfer_backend.Llama` is closed (once, before its
    backend is freed)."""
