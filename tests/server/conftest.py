"""The server app in-process (FastAPI's TestClient, no socket) over a tiny random model:
fast enough for the schema fuzz, and a real ``create_app`` over a real ``Llama``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("sse_starlette")
    from powerinfer_backend import Llama
    from powerinfer_backend.server.app import create_app
    from tests.fixtures.server import write_server_model

    path = write_server_model(tmp_path_factory.mktemp("server") / "tiny.gguf")
    llm = Llama(path, n_ctx=256, n_threads=1, embedding=True, verbose=False)
    app = create_app(llm, max_body_bytes=64 << 10)
    yield app
    app.state.serve.worker.stop()
    llm.close()


@pytest.fixture(scope="module")
def tiny_client(tiny_app):
    """A TestClient that answers server errors as responses (500), not exceptions."""
    from fastapi.testclient import TestClient

    with TestClient(tiny_app, raise_server_exceptions=False) as c:
        yield c
