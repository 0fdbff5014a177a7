"""Backends as seen from ``Llama``: a third-party backend package installed through the
``powerinfer_backend`` entry-point group (a real dist-info on sys.path, found by
pluggy's entry-point loading) that also selects itself and observes load / unload; the
built-in ``"llama_cpp"`` backend (llama.cpp computes, says once that it is not
accelerated); ``sparse=`` and ``stats()``; ``from_pretrained`` offline."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

import pytest

from powerinfer_backend import Llama
from powerinfer_backend.plugins.manager import available_backends, plugin_manager
from powerinfer_backend.plugins.reference import load_reference

from tests.fixtures.tiny_gguf import write_tiny_llama

PROMPT = "The capital of France is"

PLUGIN_SOURCE = '''
"""A third-party powerinfer_backend plugin: the native engine, counting its evals."""
from powerinfer_backend.plugins.hookspecs import hookimpl
from powerinfer_backend.plugins.hybrid import HybridBackend

EVENTS = []


class CountingBackend(HybridBackend):
    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        self.options = options
        self.evals = 0

    def eval(self, tokens, logits_all=False):
        self.evals += 1
        return super().eval(tokens, logits_all=logits_all)

    def stats(self):
        return {"evals": self.evals}


@hookimpl
def powerinfer_backend_register():
    return {"counting": CountingBackend}


@hookimpl
def powerinfer_backend_select(model_path, options):
    return "counting" if options.get("n_ctx") == 96 else None


@hookimpl
def powerinfer_backend_model_loaded(llama, backend_name):
    EVENTS.append(("loaded", backend_name))


@hookimpl
def powerinfer_backend_model_unloaded(llama):
    EVENTS.append(("unloaded", llama.backend))
'''


@pytest.fixture
def installed_plugin(tmp_path):
    """Install a plugin package the way pip would leave it: a module plus a dist-info
    with an entry_points.txt naming it in the ``powerinfer_backend`` group."""
    (tmp_path / "pi_counting_plugin.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    dist = tmp_path / "pi_counting_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pi-counting-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[powerinfer_backend]\ncounting = pi_counting_plugin\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    plugin_manager.cache_clear()  # rebuilt: entry points are read again
    try:
        yield importlib.import_module("pi_counting_plugin")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pi_counting_plugin", None)
        importlib.invalidate_caches()
        plugin_manager.cache_clear()
    assert "counting" not in available_backends()


def test_entry_point_backend_found_selected_and_observed(model_path, installed_plugin):
    plugin = installed_plugin
    assert "counting" in available_backends() and "hybrid" in available_backends()
    with Llama(model_path, n_ctx=64, n_threads=1, backend="counting", verbose=False) as llm:
        assert type(llm._backend).__name__ == "CountingBackend" and llm.backend == "counting"
        r = llm(PROMPT, max_tokens=3, temperature=0)
        assert r["usage"]["completion_tokens"] == 3
        assert llm.stats() == {"evals": 3}  # the prompt, then two single tokens
    assert plugin.EVENTS == [("loaded", "counting"), ("unloaded", "counting")]
    plugin.EVENTS.clear()
    # backend="auto" (the default) asks the select hook; this plugin answers for n_ctx 96
    with Llama(model_path, n_ctx=96, n_threads=1, verbose=False) as llm:
        assert llm.backend == "counting" and llm._backend.options["n_ctx"] == 96
    with Llama(model_path, n_ctx=64, n_threads=1, verbose=False) as llm:
        assert llm.backend == "hybrid" and llm.stats()["mode"] == "dense"
    assert plugin.EVENTS == [
        ("loaded", "counting"),
        ("unloaded", "counting"),
        ("loaded", "hybrid"),
        ("unloaded", "hybrid"),
    ]


def test_llama_cpp_backend(model_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = Llama(model_path, n_ctx=64, n_threads=1, backend="llama_cpp", verbose=False)
    ref = load_reference(model_path, n_ctx=64, n_threads=1, n_threads_batch=1)
    try:
        msgs = [str(w.message) for w in caught]
        assert len(msgs) == 1 and "not accelerated" in msgs[0]
        assert llm.backend == "llama_cpp" and llm.n_ctx() == ref.n_ctx() and llm.n_vocab() == ref.n_vocab()
        a, b = llm(PROMPT, max_tokens=8, temperature=0), ref(PROMPT, max_tokens=8, temperature=0)
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
        # prompt reuse and truncation work on llama.cpp's KV cache too
        a2 = llm(PROMPT + " Paris, and", max_tokens=4, temperature=0)
        b2 = ref(PROMPT + " Paris, and", max_tokens=4, temperature=0)
        assert a2["choices"] == b2["choices"]
    finally:
        llm.close()
        ref.close()


def test_auto_falls_back_to_llama_cpp_for_other_architectures(tmp_path):
    """A llama-like GGUF under an architecture name the native engine does not know
    ("mistral3") still runs: backend="auto" hands it to llama.cpp, with one message."""
    path = write_tiny_llama(tmp_path / "tiny-mistral3.gguf", arch="mistral3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = Llama(path, n_ctx=64, n_threads=1, verbose=False)
    ref = load_reference(path, n_ctx=64, n_threads=1, n_threads_batch=1)
    try:
        assert llm.backend == "llama_cpp"
        msgs = [str(w.message) for w in caught]
        assert len(msgs) == 1 and "not accelerated" in msgs[0] and "tiny-mistral3.gguf" in msgs[0]
        a, b = llm([1, 2, 3], max_tokens=6, temperature=0), ref([1, 2, 3], max_tokens=6, temperature=0)
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    finally:
        llm.close()
        ref.close()
    with pytest.raises(ValueError, match="unknown model architecture 'mistral3'"):
        Llama(path, n_ctx=64, n_threads=1, backend="hybrid", verbose=False)
    # an architecture neither engine knows: our message (naming it and what is supported) survives
    other = write_tiny_llama(tmp_path / "tiny-mamba.gguf", arch="mamba")
    with (
        pytest.raises(
            ValueError,
            match=r"unknown model architecture 'mamba'.*supported: .*llama.*"
            r"llama\.cpp could not load it either",
        ),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        Llama(other, n_ctx=64, n_threads=1, verbose=False)


def test_sparse_keyword_reaches_backend_and_stats(model_path):
    seen = []

    class Probe:
        @staticmethod
        def factory(model_path, **options):
            from powerinfer_backend.plugins.hybrid import HybridBackend

            seen.append(options.get("sparse"))
            return HybridBackend(model_path, **options)

    from powerinfer_backend.plugins.hookspecs import hookimpl

    class Plugin:
        @hookimpl
        def powerinfer_backend_register(self):
            return {"probe": Probe.factory}

    pm = plugin_manager()
    plugin = Plugin()
    pm.register(plugin, name="test-probe")
    try:
        for value in ("off", "auto"):
            with Llama(model_path, n_ctx=32, n_threads=1, backend="probe", sparse=value, verbose=False) as llm:
                assert llm.sparse == value
                assert llm.stats()["mode"] == "dense" and llm.stats(reset=True)["ffn_sparsity"] == 0.0
        with pytest.raises(ValueError, match="sidecar does not exist"):
            Llama(model_path, n_ctx=32, n_threads=1, backend="probe", sparse="/some/calibration.gguf", verbose=False)
        assert seen == ["off", "auto", "/some/calibration.gguf"]
    finally:
        pm.unregister(plugin)


def test_from_pretrained_offline_is_a_clear_error():
    import llama_cpp

    with pytest.raises(Exception) as ours:
        Llama.from_pretrained("someone/some-model-GGUF", "model.gguf")
    with pytest.raises(Exception) as theirs:
        llama_cpp.Llama.from_pretrained("someone/some-model-GGUF", "model.gguf")
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert "huggingface" in str(ours.value).lower()
