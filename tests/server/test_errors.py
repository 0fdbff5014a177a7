"""Server errors stay what they are: an internal failure is a 500 (``server_error``),
never passed off as the caller's 400; what llama-cpp-python refuses (``ValueError``)
is a 400. Internal failures are injected by replacing a real method of ``Llama`` (the
class: the worker's slots are ``Llama`` s over the served one) or one the handler calls on
the served ``Llama`` on the event loop."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from powerinfer_backend.server.errors import APIError, error_from_exception  # noqa: E402


def _raise(exc):
    def boom(*args, **kwargs):
        raise exc
    return boom


@pytest.mark.parametrize("exc", [RuntimeError("injected"), TypeError("injected"), KeyError("injected"),
                                 IndexError("injected"), AttributeError("injected")])
@pytest.mark.parametrize("stream", [False, True])
def test_internal_error_in_the_worker_is_500(tiny_app, tiny_client, monkeypatch, exc, stream):
    monkeypatch.setattr(type(tiny_app.state.serve.llm), "create_completion", _raise(exc))
    r = tiny_client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": stream})
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == 500 and type(exc).__name__ in err["message"]


def test_internal_error_in_a_handler_is_500(tiny_app, tiny_client, monkeypatch):
    monkeypatch.setattr(tiny_app.state.serve.llm, "tokenize", _raise(KeyError("injected")))
    r = tiny_client.post("/tokenize", json={"content": "hi"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text


def test_refused_arguments_stay_400(tiny_app, tiny_client, monkeypatch):
    monkeypatch.setattr(type(tiny_app.state.serve.llm), "create_completion", _raise(ValueError("bad value")))
    r = tiny_client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["message"] == "bad value"
    # and the server serves on
    monkeypatch.undo()
    assert tiny_client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_error_from_exception():
    assert error_from_exception(ValueError("Requested tokens (9) exceed context window of 8")).type == \
        "exceed_context_size_error"
    assert error_from_exception(NotImplementedError("x")).status == 400
    assert error_from_exception(RuntimeError("generate: empty prompt")).status == 400
    for e in (RuntimeError("x"), TypeError("x"), KeyError("x"), RecursionError("x"), OSError("x")):
        assert error_from_exception(e).status == 500
    e = APIError(503, "busy", "server_busy", param="x")
    assert error_from_exception(e) is e
    assert e.body() == {"error": {"message": "busy", "type": "server_busy", "param": "x", "code": 503}}
