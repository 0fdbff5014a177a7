"""The declared request bodies: in the OpenAPI document, strict where OpenAI is strict
(each refusal a 400 in OpenAI's shape naming the field), tolerant where OpenAI and
llama-server are (unknown fields, tool-call turns without content, llama-server's
logit_bias shapes). In-process app over a tiny model (tests/server/conftest.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

USER = [{"role": "user", "content": "hi"}]
CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]

BODIES = {
    "/v1/completions": "CompletionBody",
    "/v1/chat/completions": "ChatBody",
    "/v1/embeddings": "EmbeddingBody",
    "/tokenize": "TokenizeBody",
    "/detokenize": "DetokenizeBody",
    "/completion": "LlamaCompletionBody",
}


def test_openapi_declares_every_request_body(tiny_app):
    doc = tiny_app.openapi()
    posts = {p: ops["post"] for p, ops in doc["paths"].items() if "post" in ops}
    assert len(posts) == 12
    for path, op in posts.items():
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        name = ref.rsplit("/", 1)[1]
        assert name in BODIES.values(), (path, ref)
        assert doc["components"]["schemas"][name]["additionalProperties"] is True  # unknown fields tolerated
    for path, name in BODIES.items():
        assert posts[path]["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + name)
    chat = doc["components"]["schemas"]["ChatBody"]["properties"]["messages"]["items"]
    assert set(chat["discriminator"]["mapping"]) == {"system", "developer", "user", "assistant", "tool", "function"}


REFUSED = [
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, "max_tokens"),  # not coerced
    ("/v1/completions", {"prompt": "x", "max_tokens": 5.0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream": "true"}, "stream"),
    ("/v1/completions", {"prompt": "x", "echo": 1}, "echo"),
    ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}, "seed"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2]]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].user.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages[0].user.content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": 5}]}, "messages[0].system.content"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant"}]}, "messages[0].assistant"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None}]}, "messages[0].assistant"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool.tool_call_id"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].user.content",
    ),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": -1}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function"),
    ("/v1/chat/completions", {"messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    (
        "/v1/chat/completions",
        {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {}}},
        "response_format.json_schema.name",
    ),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": [1, 2]}, "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/completion", {"prompt": "x", "logit_bias": [["x"]]}, "logit_bias"),
    ("/completion", {"prompt": "x", "logit_bias": [[1, "high"]]}, "logit_bias"),
    ("/completion", {"prompt": "x", "logit_bias": [[1, True]]}, "logit_bias"),
    ("/completion", {"prompt": "x", "n_predict": -3}, "n_predict"),
    ("/completion", {"prompt": "x", "n_predict": "5"}, "n_predict"),
    ("/completion", {"prompt": "x", "n_probs": -1}, "n_probs"),
    ("/completion", {"prompt": "x", "top_k": 2**40}, "top_k"),
    ("/completion", {"prompt": {"multimodal_data": []}}, "prompt"),  # the message names prompt.prompt_string
    ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
    ("/detokenize", {"tokens": ["1"]}, "tokens[0]"),
]


@pytest.mark.parametrize("path,body,param", REFUSED, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(REFUSED)])
def test_refused_with_the_field_named(tiny_client, path, body, param):
    r = tiny_client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and err["param"].startswith(param), err
    assert err["param"] in err["message"], err


ACCEPTED = [
    # unknown fields, as OpenAI's and llama-server's clients send them
    (
        "/v1/completions",
        {
            "prompt": "hi",
            "max_tokens": 1,
            "user": "u",
            "best_of": 1,
            "foo": [1, {"a": None}],
            "stream_options": {"include_usage": True},
        },
    ),
    ("/v1/chat/completions", {"messages": [{"role": "developer", "content": "Be brief."}] + USER, "max_tokens": 1}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 1},
    ),
    # an assistant turn that only calls tools may leave content out (or null), then the tool's answer
    (
        "/v1/chat/completions",
        {
            "messages": USER
            + [{"role": "assistant", "tool_calls": CALL}, {"role": "tool", "tool_call_id": "c1", "content": "42"}],
            "max_tokens": 1,
        },
    ),
    (
        "/v1/chat/completions",
        {"messages": USER + [{"role": "assistant", "content": None, "tool_calls": CALL}], "max_tokens": 1},
    ),
    # a tool without parameters (OpenAI: no parameters), chosen by name
    (
        "/v1/chat/completions",
        {
            "messages": USER,
            "max_tokens": 2,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
    ),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "response_format": {"type": "json_object"}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "temperature": 0, "top_p": 1}),  # ints where numbers go
    # llama-server's logit_bias: [[id or text, bias or false], ...] or {"id or text": bias}
    ("/completion", {"prompt": "hi", "n_predict": 2, "logit_bias": [[5, 1.0], ["he", False]]}),
    ("/completion", {"prompt": "hi", "n_predict": 2, "logit_bias": {"5": -1, "he": False}}),
    ("/completion", {"prompt": {"prompt_string": "hi"}, "n_predict": 1}),
    ("/completion", {"prompt": ["hi", 5], "n_predict": 1, "samplers": ["top_k"], "dry_multiplier": 0}),
    ("/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}),
]


@pytest.mark.parametrize("path,body", ACCEPTED, ids=[f"{p}-{i}" for i, (p, _) in enumerate(ACCEPTED)])
def test_accepted(tiny_client, path, body):
    r = tiny_client.post(path, json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_body_is_json_whatever_the_content_type(tiny_client, content_type):
    """``curl -d`` sends form-urlencoded; llama-server reads JSON anyway, and so do we."""
    headers = {"content-type": content_type} if content_type else {}
    r = tiny_client.post("/tokenize", content=json.dumps({"content": "hi"}), headers=headers)
    assert r.status_code == 200 and r.json() == {"tokens": [105, 106]}
    r = tiny_client.post("/tokenize", content=b"", headers=headers)  # empty: {}
    assert r.status_code == 400 and r.json()["error"]["param"] == "content"


def test_max_tokens_zero_means_no_limit(tiny_app, tiny_client):
    """``max_tokens: 0`` on both OpenAI endpoints means what it means to llama-cpp-python's
    ``Llama`` (and its server): no limit, generation runs to EOS or the full context; the
    served answer equals the ``Llama`` API's."""
    from powerinfer_backend import Llama

    served = tiny_app.state.serve
    with Llama(served.llm.model_path, n_ctx=served.n_ctx_slot, n_threads=1, verbose=False) as llm:
        ref = llm.create_completion("hi", max_tokens=0, temperature=0)
        # the random tiny model never ends: the context does (the default would stop at 16)
        assert ref["usage"]["total_tokens"] == served.n_ctx_slot and ref["choices"][0]["finish_reason"] == "length"
        assert (
            llm.create_completion("hi", max_tokens=None, temperature=0)["choices"][0]["text"]
            == ref["choices"][0]["text"]
        )
        chat_ref = llm.create_chat_completion(USER, max_tokens=0, temperature=0)["choices"][0]["message"]
    for body in ({"max_tokens": 0}, {"max_tokens": None}):
        r = tiny_client.post("/v1/completions", json=dict(body, prompt="hi", temperature=0)).json()
        assert r["choices"][0]["text"] == ref["choices"][0]["text"] and r["usage"] == ref["usage"], r
    for body in ({"max_tokens": 0}, {"max_completion_tokens": 0}, {}):
        r = tiny_client.post("/v1/chat/completions", json=dict(body, messages=USER, temperature=0))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == chat_ref["content"]
