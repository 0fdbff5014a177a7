"""Backend plugins through pluggy: the built-in "hybrid" backend, a third-party plugin
registered at run time (a real backend that wraps HybridBackend and counts calls),
name conflicts, unknown names, and the installed entry point."""

from __future__ import annotations

import importlib.metadata

import pytest

from powerinfer_backend import Llama
from powerinfer_backend.plugins.manager import available_backends, create_backend, plugin_manager
from powerinfer_backend.plugins.hookspecs import PROJECT, hookimpl
from powerinfer_backend.plugins.hybrid import HybridBackend


class CountingBackend:
    """A third-party backend: the native engine, with every eval counted."""

    def __init__(self, model_path, **options):
        self.inner = HybridBackend(model_path, **options)
        self.options = options
        self.eval_calls = []
        for name in ("n_vocab", "n_embd", "n_ctx", "n_ctx_train", "metadata", "n_threads"):
            setattr(self, name, getattr(self.inner, name))

    @property
    def n_past(self):
        return self.inner.n_past

    def eval(self, tokens, logits_all=False):
        self.eval_calls.append(list(tokens))
        return self.inner.eval(tokens, logits_all=logits_all)

    def embeddings(self):
        return self.inner.embeddings()

    def truncate(self, n_keep):
        self.inner.truncate(n_keep)

    def close(self):
        self.inner.close()


class EchoPlugin:
    """Registers "echo"; also tries to take the name "hybrid", which must not win."""

    def __init__(self):
        self.built = []

    @hookimpl
    def powerinfer_backend_register(self):
        def factory(model_path, **options):
            b = CountingBackend(model_path, **options)
            self.built.append(b)
            return b

        return {"echo": factory, "hybrid": factory}


@pytest.fixture
def echo_plugin():
    plugin = EchoPlugin()
    pm = plugin_manager()
    pm.register(plugin, name="test-echo-plugin")
    try:
        yield plugin
    finally:
        pm.unregister(plugin)
    assert "echo" not in available_backends()


def test_hybrid_is_available():
    backends = available_backends()
    assert backends["hybrid"] is HybridBackend


def test_third_party_plugin_backend(model_path, echo_plugin):
    backends = available_backends()
    assert "echo" in backends
    assert backends["hybrid"] is HybridBackend  # a later plugin cannot shadow an earlier name
    with Llama(model_path, n_ctx=64, n_threads=2, backend="echo", verbose=False) as llm:
        assert len(echo_plugin.built) == 1
        be = echo_plugin.built[0]
        assert llm._backend is be
        assert be.options["n_ctx"] == 64 and be.options["n_threads"] == 2 and be.options["verbose"] is False
        prompt = llm.tokenize(b"The capital of France is")
        r = llm(prompt, max_tokens=2, temperature=0)
        assert r["usage"]["completion_tokens"] == 2
        assert be.eval_calls[0] == prompt and len(be.eval_calls) == 2 and len(be.eval_calls[1]) == 1
        assert llm.n_ctx() == 64 and llm.n_vocab() == be.n_vocab


def test_unknown_backend_lists_available(model_path, echo_plugin):
    with pytest.raises(ValueError) as e:
        Llama(model_path, backend="no-such-backend", verbose=False)
    msg = str(e.value)
    assert "no-such-backend" in msg and "'echo'" in msg and "'hybrid'" in msg
    with pytest.raises(ValueError, match=r"unknown backend 'x'; available: \['echo', 'hybrid', 'llama_cpp'\]"):
        create_backend("x", model_path)


def test_entry_point_registers_hybrid():
    try:
        importlib.metadata.distribution("powerinfer_backend")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("powerinfer_backend is not pip-installed (no entry points)")
    eps = importlib.metadata.entry_points(group=PROJECT)
    assert "hybrid" in eps.names
    assert eps["hybrid"].value == "powerinfer_backend.plugins.hybrid"
    assert any(
        getattr(p, "__name__", "") == "powerinfer_backend.plugins.hybrid" for p in plugin_manager().get_plugins()
    )
