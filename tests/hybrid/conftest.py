"""Shared by the placement and predictor tests: the tiny Q8_0 llama their hand-computed
byte counts are worked out for."""

import pytest

from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.loader import load_gguf

from tests.fixtures.tiny_gguf import write_tiny_llama


@pytest.fixture(scope="module")
def tiny_sizes(tmp_path_factory):
    """(path, :class:`ModelSizes`) of a 2-layer tiny llama with n_ff 128 (n_embd 64, 4 heads,
    2 KV heads, tied embedding of 64 tokens; the writer's defaults)."""
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=2, n_ff=128)
    m = load_gguf(path, verbose=False)
    sizes = P.ModelSizes.from_gguf(m)
    m.close()
    return path, sizes
