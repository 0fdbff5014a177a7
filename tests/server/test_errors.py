"""Server errors stay what they are: an internal failure is a 500 (``server_error``),
never passed off as the caller's 400; what llama-cpp-python refuses (``ValueError``)
is a 400. Internal failures are injected by replacing a real method of ``Llama`` (the
class: the worker's slots are ``Llama`` s over the served one) or one the handler calls on
the served ``Llama`` on the event loop. The server's log: a client's mistake is one
WARNING line, a fault an ERROR with its traceback (uvicorn on loopback)."""

from __future__ import annotations

import json
import logging
import time

import pytest

pytest.importorskip("fastapi")

from powerinfer_backend.server.errors import APIError, error_from_exception


def _raise(exc):
    def boom(*args, **kwargs):
        raise exc

    return boom


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("injected"),
        TypeError("injected"),
        KeyError("injected"),
        IndexError("injected"),
        AttributeError("injected"),
    ],
)
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


def test_echo_of_a_token_prompt_is_refused(tiny_client):
    r = tiny_client.post("/v1/completions", json={"prompt": [1], "echo": True, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
    assert tiny_client.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code == 200


def test_error_from_exception():
    assert (
        error_from_exception(ValueError("Requested tokens (9) exceed context window of 8")).type
        == "exceed_context_size_error"
    )
    assert error_from_exception(NotImplementedError("x")).status == 400
    assert error_from_exception(RuntimeError("generate: empty prompt")).status == 400
    for e in (RuntimeError("x"), TypeError("x"), KeyError("x"), RecursionError("x"), OSError("x")):
        assert error_from_exception(e).status == 500
    e = APIError(503, "busy", "server_busy", param="x")
    assert error_from_exception(e) is e
    assert e.body() == {"error": {"message": "busy", "type": "server_busy", "param": "x", "code": 503}}


# what clients get wrong beyond the declared schemas: token ids out of the vocabulary (the
# prompt of /completion), and text that is no UTF-8 (a lone surrogate: valid JSON, valid
# for Python's str, refused by every encoder), in each field that reaches the tokenizer
CLIENT_MISTAKES = [
    ("/completion", {"prompt": [999999999]}),
    ("/completion", {"prompt": [-1]}),
    ("/completion", {"prompt": ["hi", 999999999]}),
    ("/completion", {"prompt": "\ud800"}),
    ("/completion", {"prompt": "hi", "n_predict": 1, "logit_bias": [["\ud800", 1.0]]}),
    ("/tokenize", {"content": "\ud800"}),
    ("/v1/completions", {"prompt": "\ud800", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 1}),
    ("/v1/embeddings", {"input": "\ud800"}),
]


def _post(url: str, path: str, body: dict):
    import httpx

    # json.dumps escapes the surrogate as JSON allows; httpx's own encoder would refuse it
    return httpx.post(url + path, content=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=60)


def _records_after(records: list, start: int, settle: float = 0.3) -> list:
    """The log records from index ``start`` once ``settle`` seconds pass without a new
    one (uvicorn logs an exception that escaped the app after the response is sent)."""
    n = -1
    while n != len(records):
        n = len(records)
        time.sleep(settle)
    return records[start:]


def _text(record) -> str:
    return logging.Formatter("%(levelname)s %(message)s").format(record)


@pytest.mark.parametrize("path,body", CLIENT_MISTAKES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CLIENT_MISTAKES)])
def test_client_mistake_is_one_log_line(tiny_http, path, body):
    start = len(tiny_http.records)
    r = _post(tiny_http.url, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error", err
    logged = _records_after(tiny_http.records, start)
    assert len(logged) == 1, [_text(x) for x in logged]
    line = _text(logged[0])
    assert logged[0].levelno == logging.WARNING and line == f"WARNING POST {path}: 400 {err['message']}", line
    assert "Traceback" not in line and "\n" not in line


@pytest.mark.parametrize(
    "where,exc",
    [("handler", KeyError("injected")), ("handler", RuntimeError("injected")), ("worker", KeyError("injected"))],
)
def test_fault_logs_its_traceback_and_answers_500(tiny_app, tiny_http, monkeypatch, where, exc):
    """A RuntimeError is a fault unless it is one of the refusals error_from_exception
    knows: it passes the client-error handler on to the 500."""
    llm = tiny_app.state.serve.llm
    if where == "handler":  # on the event loop: escapes the app, uvicorn logs it
        monkeypatch.setattr(llm, "tokenize", _raise(exc))
        path, body = "/tokenize", {"content": "hi"}
    else:  # in a slot of the worker: answered by the app, which logs it
        monkeypatch.setattr(type(llm), "create_completion", _raise(exc))
        path, body = "/v1/completions", {"prompt": "hi", "max_tokens": 2}
    start = len(tiny_http.records)
    r = _post(tiny_http.url, path, body)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
    logged = _records_after(tiny_http.records, start)
    assert len(logged) == 1, [_text(x) for x in logged]
    text = _text(logged[0])
    assert logged[0].levelno == logging.ERROR and "Traceback (most recent call last)" in text, text
    assert f"{type(exc).__name__}: {exc}" in text and "in boom" in text, text  # the fault's own frame
