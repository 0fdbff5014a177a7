"""Raw request bodies before validation: the nesting depth scan (against a reference on
random JSON), the depth and size limits and standard JSON, through the real app."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from hypothesis import given, settings
from hypothesis import strategies as st

from powerinfer_backend.server.body import MAX_DEPTH, json_depth


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


# strings full of what a bracket counter could trip on
_tricky = st.text(alphabet='[]{}"\\,:x é', max_size=8)
_json = st.recursive(
    st.none() | st.integers() | _tricky,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky, inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_json_depth_matches_the_parsed_depth(value, ascii_only):
    assert json_depth(json.dumps(value, ensure_ascii=ascii_only).encode()) == _depth(value)


def _nested(depth: int):
    v = 1
    for _ in range(depth):
        v = [v]
    return v


def test_depth_limit(tiny_client):
    ok = {"content": "hi", "x": _nested(MAX_DEPTH - 1)}  # MAX_DEPTH deep with the body itself
    assert tiny_client.post("/tokenize", json=ok).status_code == 200
    for depth in (MAX_DEPTH, 5000, 30_000):  # past Python's recursion limit (the body limit here: 64 KiB)
        raw = b'{"content": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"
        r = tiny_client.post("/tokenize", content=raw)
        assert r.status_code == 400 and "nests" in r.json()["error"]["message"], r.text
    r = tiny_client.post("/completion", content=b"[" * 50_000)  # not even JSON: still the depth answer
    assert r.status_code == 400


def test_size_limit(tiny_app, tiny_client):
    limit = tiny_app.state.max_body_bytes
    body = {"content": "x" * (limit - 100)}
    assert tiny_client.post("/tokenize", json=body).status_code == 200
    r = tiny_client.post("/tokenize", json={"content": "x" * limit})
    assert r.status_code == 413 and str(limit) in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit holds while reading
        yield b'{"content": "'
        for _ in range(limit // 1000 + 1):
            yield b"x" * 1000
        yield b'"}'

    assert tiny_client.post("/tokenize", content=chunks()).status_code == 413


@pytest.mark.parametrize(
    "raw",
    [
        b'{"content": "x", "y": NaN}',
        b'{"content": "x", "y": -Infinity}',
        b'{"content": "x"',
        b'{"content": "x"}}',
        b"\xff\xfe{}",
        b"{'content': 'x'}",
    ],
)
def test_not_standard_json(tiny_client, raw):
    r = tiny_client.post("/tokenize", content=raw)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text


def test_api_key_checked_before_the_body_is_read(tmp_path):
    from fastapi.testclient import TestClient

    from powerinfer_backend import Llama
    from powerinfer_backend.server.app import create_app
    from tests.fixtures.server import write_server_model

    with Llama(write_server_model(tmp_path / "m.gguf"), n_ctx=64, n_threads=1, verbose=False) as llm:
        app = create_app(llm, api_key="k", max_body_bytes=1000)
        try:
            with TestClient(app, raise_server_exceptions=False) as c:
                for raw in (b"x" * 2000, b"[" * 500, b"{bad"):
                    assert c.post("/tokenize", content=raw).status_code == 401
                    assert c.post("/tokenize", content=raw, headers={"Authorization": "Bearer k"}).status_code in (
                        400,
                        413,
                    )
                assert c.post("/tokenize", json={"content": "hi"}, headers={"x-api-key": "k"}).status_code == 200
        finally:
            app.state.serve.worker.stop()
