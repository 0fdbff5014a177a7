"""``powerinfer-backend serve`` over loopback with real clients: the ``openai`` package,
httpx for the llama-server endpoints, concurrent greedy clients, malformed requests, the
bounded queue (503) and client disconnects."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from powerinfer_backend import Llama

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from tests.fixtures.server import ServerProcess  # noqa: E402 - needs the packages checked above

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
    "Water boils at",
    "My favourite food is",
    "In 1969, the first man on the moon",
    "A haiku about rain:",
]
CHATS = ["What is the capital of Italy?", "Name a fruit.", "Say hello.", "What is 2+2?"]


@pytest.fixture(scope="module")
def server(model_path):
    s = ServerProcess("--model", model_path, "--ctx-size", "1024", "--max-queue", "16", "--api-key", "sk-test")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer sk-test"}, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def local(model_path):
    """The same model in-process: what the server must answer."""
    with Llama(model_path, n_ctx=1024, n_threads=1, verbose=False) as llm:
        yield llm


def test_models_and_health(client, http, server):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].id.endswith(".gguf")
    meta = http.get("/v1/models").json()["data"][0]["meta"]
    assert meta["n_vocab"] == 49152 and meta["n_ctx"] == 1024
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # no key needed


def test_api_key_required(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_completion_stream_equals_local(client, local):
    ref = local.create_completion(PROMPTS[0], max_tokens=12, temperature=0)["choices"][0]["text"]
    r = client.completions.create(model="x", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert r.choices[0].text == ref and r.usage.completion_tokens == 12
    chunks = list(client.completions.create(model="x", prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True))
    assert len(chunks) >= 12
    assert "".join(c.choices[0].text for c in chunks) == ref
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_equals_local(client, local):
    msgs = [{"role": "user", "content": CHATS[0]}]
    ref = local.create_chat_completion(msgs, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == ref and r.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == ref and text


def test_chat_tools_and_json(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    r = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=32,
        temperature=0,
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    r = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        max_tokens=32,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "p",
                "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            },
        },
    )
    assert isinstance(json.loads(r.choices[0].message.content)["name"], str)


def test_embeddings(client):
    r = client.embeddings.create(model="x", input=["hello world", "goodbye"])
    assert len(r.data) == 2 and len(r.data[0].embedding) == 576
    assert abs(sum(x * x for x in r.data[0].embedding) - 1) < 1e-3
    assert r.data[0].embedding != r.data[1].embedding


def _solo(client, i):
    if i < len(PROMPTS):
        return client.completions.create(model="x", prompt=PROMPTS[i], max_tokens=16, temperature=0).choices[0].text
    msgs = [{"role": "user", "content": CHATS[i - len(PROMPTS)]}]
    return (
        client.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0)
        .choices[0]
        .message.content
    )


def test_concurrent_greedy_clients_get_solo_text(client, server):
    """8 completion clients (and 4 chat clients, streaming or not) at once: each gets
    exactly the text it gets alone."""
    n = len(PROMPTS) + len(CHATS)
    solo = [_solo(client, i) for i in range(n)]
    assert len(set(solo)) == n

    def concurrent(i):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0, timeout=300)
        if i % 2:  # half of them stream
            if i < len(PROMPTS):
                s = c.completions.create(model="x", prompt=PROMPTS[i], max_tokens=16, temperature=0, stream=True)
                return "".join(ch.choices[0].text for ch in s)
            s = c.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": CHATS[i - len(PROMPTS)]}],
                max_tokens=16,
                temperature=0,
                stream=True,
            )
            return "".join(ch.choices[0].delta.content or "" for ch in s)
        return _solo(c, i)

    order = [3, 0, 9, 5, 11, 1, 7, 2, 10, 6, 4, 8]  # interleave kinds
    with ThreadPoolExecutor(n) as ex:
        got = dict(zip(order, ex.map(concurrent, order)))
    assert [got[i] for i in range(n)] == solo


BAD = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", json.dumps({"prompt": 3}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "many"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}).encode()),
    ("/v1/completions", json.dumps({"prompt": [99999999]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "logit_bias": {"abc": 1}}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "grammar": "root ::= ("}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "n": 3}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x" * 6000, "max_tokens": 4}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "logprobs": 2}).encode()),  # needs --logits-all
    ("/v1/chat/completions", json.dumps({"messages": []}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"content": "no role"}]}).encode()),
    (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}).encode(),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "x" * 6000}], "stream": True}).encode(),
    ),
    ("/v1/embeddings", json.dumps({}).encode()),
    ("/tokenize", json.dumps({"content": 5}).encode()),
    ("/detokenize", json.dumps({"tokens": [-1]}).encode()),
    ("/completion", json.dumps({"prompt": ""}).encode()),
    ("/completion", json.dumps({"prompt": "x" * 6000}).encode()),
    ("/completion", json.dumps({"prompt": "x", "n_probs": -1}).encode()),
]


@pytest.mark.parametrize("path,body", BAD, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BAD)])
def test_malformed_request_gets_4xx_json(http, path, body):
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and err["code"] == r.status_code


def test_server_survives_malformed_requests(http, server):
    assert http.post("/v1/completions", json={"prompt": "x" * 6000}).status_code == 400
    assert http.get("/nope").status_code == 404
    assert http.get("/health").status_code == 200 and server.alive()
    r = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_client_mistakes_log_one_line_each(http, server):
    """What the real ``serve`` prints for a client's mistake: one WARNING line naming the
    endpoint and the message, no traceback (tests/server/test_errors.py: every such path,
    and a fault's traceback)."""
    for path, body in [
        ("/completion", {"prompt": [999999999]}),
        ("/completion", {"prompt": [-1]}),
        ("/tokenize", {"content": "\ud800"}),
    ]:
        before = server.log()
        r = http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        time.sleep(0.3)  # uvicorn would log an escaped exception after the response
        new = server.log()[len(before) :]
        assert new == f"WARNING:  POST {path}: 400 {r.json()['error']['message']}\n", new


# ---- llama-server endpoints --------------------------------------------------------------


def test_tokenize_detokenize(http, local):
    toks = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert toks == local.tokenize(b"Hello world", add_bos=False, special=True)
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == toks and "".join(p["piece"] for p in pieces) == "Hello world"
    assert http.post("/detokenize", json={"tokens": toks}).json() == {"content": "Hello world"}


def test_props(http):
    p = http.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == 1024
    assert p["total_slots"] == 1 and "chat_template" in p and p["eos_token"] == "<|im_end|>"
    assert "ffn_sparsity" in p["stats"] and p["sparse"] == "auto"
    s = http.get("/stats").json()
    assert "ffn_sparsity" in s["sparsity"] and s["served"] >= 0


def test_llama_completion(http, local):
    ref = local.create_completion(PROMPTS[2], max_tokens=10, temperature=0)["choices"][0]["text"]
    r = http.post("/completion", json={"prompt": PROMPTS[2], "n_predict": 10, "temperature": 0}).json()
    assert r["content"] == ref and r["stop"] is True and r["tokens_predicted"] == 10 and r["stop_type"] == "limit"
    # streaming, as text-generation-webui reads it: "data: {...}" lines, stop=true at the end
    toks = local.tokenize(PROMPTS[2].encode(), add_bos=False)
    text, last = "", None
    with http.stream(
        "POST",
        "/completion",
        json={
            "prompt": toks,
            "n_predict": 10,
            "temperature": 0,
            "stream": True,
            "cache_prompt": True,
            "samplers": ["top_k"],
        },
    ) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                text += last["content"]
    assert text == ref and last["stop"] is True
    # stop words, probabilities, n_predict=0
    r = http.post(
        "/completion",
        json={"prompt": PROMPTS[2], "n_predict": 10, "temperature": 0, "stop": [ref.split()[2]], "n_probs": 3},
    ).json()
    assert r["stop_type"] == "word" and ref.startswith(r["content"]) and len(r["content"]) < len(ref)
    top = r["completion_probabilities"][0]["top_logprobs"]
    assert len(top) == 3 and top[0]["logprob"] >= top[1]["logprob"]
    assert r["completion_probabilities"][0]["id"] == top[0]["id"]  # greedy took the most likely
    r = http.post("/completion", json={"prompt": toks, "n_predict": 0, "n_probs": 5, "post_sampling_probs": True})
    probs = r.json()["completion_probabilities"][0]["top_probs"]
    assert len(probs) == 5 and 0 < probs[0]["prob"] <= 1


# ---- queue and disconnects ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server(model_path):
    s = ServerProcess("--model", model_path, "--ctx-size", "2048", "--max-queue", "1", "--dense")
    yield s
    s.close()


def _stats(url):
    return httpx.get(url + "/stats", timeout=30).json()


def test_dense_flag_reaches_llama(small_server):
    p = httpx.get(small_server.url + "/props", timeout=30).json()
    assert p["sparse"] == "off" and p["stats"]["mode"] == "dense"


def test_queue_full_503_and_disconnect_stops_generation(small_server):
    url = small_server.url
    long = {"prompt": "Once upon a time", "n_predict": 1500, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120) as a, httpx.Client(timeout=120) as b:
        with a.stream("POST", url + "/completion", json=long) as sa:
            lines = sa.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # A is running
            result = {}

            def queued():  # B waits behind A
                result["b"] = b.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0})

            tb = threading.Thread(target=queued)
            tb.start()
            deadline = time.monotonic() + 30
            while _stats(url)["waiting"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            r = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_busy"
            t_close = time.monotonic()
        # A disconnected (stream closed after a few tokens): its generation stops, B runs
        tb.join(timeout=60)
        waited = time.monotonic() - t_close
        assert result["b"].status_code == 200 and result["b"].json()["tokens_predicted"] == 2
        assert waited < 10, waited  # 1500 tokens on one thread would take far longer
        s = _stats(url)
        assert s["cancelled"] >= 1 and s["rejected"] >= 1 and not s["busy"]


def test_disconnect_non_streaming(small_server):
    url = small_server.url
    before = _stats(url)["cancelled"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/completion",
            json={"prompt": "Once", "n_predict": 1500, "ignore_eos": True, "temperature": 0},
            timeout=1.5,
        )
    deadline = time.monotonic() + 10
    while True:
        s = _stats(url)
        if s["cancelled"] > before and not s["busy"]:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.1)


def test_chat_content_parts_and_null_content_are_normalised():
    from powerinfer_backend.server.errors import APIError
    from powerinfer_backend.server.schemas import chat_message as _chat_message

    assert (
        _chat_message(
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}
        )["content"]
        == "Hi there"
    )
    assert _chat_message({"role": "assistant", "content": None, "tool_calls": []})["content"] == ""
    assert _chat_message({"role": "user"})["content"] == ""
    for bad in ({"content": "x"}, {"role": "user", "content": [{"type": "image_url"}]}, {"role": "user", "content": 5}):
        with pytest.raises(APIError):
            _chat_message(bad)


def test_serve_flag_ranges():
    from powerinfer_backend.cli import main

    for argv in (["serve", "--max-queue", "-1"], ["serve", "--port", "99999"]):
        with pytest.raises(SystemExit):
            main(argv)
