"""The server app in-process over a tiny random model (FastAPI's TestClient, no socket;
or uvicorn in a thread on loopback): fast enough for the schema fuzz, and a real
``create_app`` over a real ``Llama``."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

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


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def tiny_http(tiny_app):
    """``tiny_app`` served by uvicorn on a loopback port in a thread: real HTTP, and
    uvicorn's own handling of what escapes the app. ``.url``; ``.records``: what the
    server's log (the ``uvicorn.error`` logger, INFO and up) received."""
    import uvicorn

    from powerinfer_backend.server.app import bind_socket

    logger = logging.getLogger("uvicorn.error")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(tiny_app, log_config=None, log_level="info"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield SimpleNamespace(url=f"http://127.0.0.1:{sock.getsockname()[1]}", records=handler.records)
    server.should_exit = True
    thread.join(30)
    sock.close()
    logger.removeHandler(handler)
    logger.setLevel(level)
