"""The schema fuzz: for every POST endpoint, bodies generated from its request schema in
the app's own OpenAPI document, and malformed variants of them
(tests/fixtures/schema_strategies.py), sent to the real app over a tiny model. Any 5xx
fails; every malformed body must get a 4xx in OpenAI's error shape. An endpoint's
aliases (``/v1/completions`` and ``/completions``, ...) share its handler and body
model: their cases alternate between the paths. The number of cases per endpoint (and
path) is printed, and must be >= 200 per endpoint."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jsonschema")
from hypothesis import HealthCheck, Phase, given, settings

from powerinfer_backend.server.body import MAX_DEPTH
from tests.fixtures.schema_strategies import request_cases

#: every POST endpoint, its paths
ENDPOINTS = {
    "completions": ["/v1/completions", "/completions"],
    "chat": ["/v1/chat/completions", "/chat/completions"],
    "embeddings": ["/v1/embeddings", "/embeddings"],
    "tokenize": ["/tokenize", "/extras/tokenize"],
    "detokenize": ["/detokenize", "/extras/detokenize"],
    "llama_completion": ["/completion", "/v1/completion"],
}
# hypothesis examples per endpoint (>= 200 must reach the server); more for a long run
CASES = int(os.environ.get("POWERINFER_SCHEMA_FUZZ_CASES", 210))


def test_fuzz_covers_every_post_route(tiny_app):
    doc = tiny_app.openapi()
    assert sorted(p for p, ops in doc["paths"].items() if "post" in ops) == sorted(sum(ENDPOINTS.values(), []))
    for paths in ENDPOINTS.values():  # aliases: one body schema
        assert len({json.dumps(doc["paths"][p]["post"]["requestBody"]) for p in paths}) == 1


def _check_answer(case, r):
    assert r.status_code < 500, (case, r.status_code, r.text[:2000])
    if case.must_refuse:
        assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:2000])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["code"] == r.status_code and "param" in err, err
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.text.splitlines():  # an error after the first chunk travels in the stream
            if line.startswith("data: {"):
                assert json.loads(line[6:]).get("error", {}).get("code", 200) < 500, line


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_schema_fuzz(tiny_app, tiny_client, endpoint, capsys):
    paths = ENDPOINTS[endpoint]
    doc = tiny_app.openapi()
    ref = doc["paths"][paths[0]]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    stats: Counter = Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(request_cases(doc, ref, MAX_DEPTH, tiny_app.state.max_body_bytes))
    def fuzz(case):
        path = paths[stats["cases"] % len(paths)]
        headers = {"content-type": case.content_type} if case.content_type else {}
        r = tiny_client.post(path, content=case.body, headers=headers)
        stats["cases"] += 1
        stats[path] += 1
        stats[f"{r.status_code // 100}xx"] += 1
        stats["malformed"] += case.must_refuse
        _check_answer(case, r)

    t0 = time.perf_counter()
    fuzz()
    dt = time.perf_counter() - t0
    with capsys.disabled():
        per_path = ", ".join(f"{p} {stats[p]}" for p in paths)
        print(
            f"\nschema fuzz {endpoint}: {stats['cases']} cases ({per_path}): {stats['2xx']} 2xx, {stats['4xx']} 4xx "
            f"({stats['malformed']} malformed, all 4xx), no 5xx, {dt:.1f} s"
        )
    assert stats["cases"] >= min(200, CASES)
    assert stats["2xx"] >= 20 and stats["malformed"] >= 40, stats  # both sides of the schema reached
