"""``serve --parallel 4`` over loopback: continuous batching of concurrent clients.

16 clients at once (OpenAI completions and chat, llama-server ``/completion``, half of
them streaming, two embeddings among them) each get exactly the text the model gives
that prompt alone (greedy, SmolLM2, an in-process ``Llama`` with the slot's context);
the steps decode several slots together; a client that disconnects mid-stream leaves
its slot within one step while the others go on; no answer is a 500."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from powerinfer_backend import Llama

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from tests.fixtures.server import ServerProcess  # noqa: E402 - needs the packages checked above

N_TOKENS = 12
COMPLETIONS = [
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
LLAMA_SERVER = ["The best way to learn", "Roses are red,"]
EMBED = ["hello world", "goodbye"]


@pytest.fixture(scope="module")
def server(model_path):
    s = ServerProcess("--model", model_path, "--ctx-size", "2048", "--parallel", "4", "--max-queue", "16")
    yield s
    s.close()


@pytest.fixture(scope="module")
def solo(model_path):
    """Each request's answer alone: an in-process Llama with one slot's context (2048 / 4)."""
    with Llama(model_path, n_ctx=512, n_threads=1, embedding=True, verbose=False) as llm:
        out = {}
        for p in COMPLETIONS:
            out["c", p] = llm.create_completion(p, max_tokens=N_TOKENS, temperature=0)["choices"][0]["text"]
        for q in CHATS:
            msgs = [{"role": "user", "content": q}]
            out["chat", q] = llm.create_chat_completion(msgs, max_tokens=N_TOKENS, temperature=0)["choices"][0][
                "message"
            ]["content"]
        for p in LLAMA_SERVER:
            out["ls", p] = llm.create_completion(p, max_tokens=N_TOKENS, temperature=0)["choices"][0]["text"]
        yield out


def _request(url: str, kind: str, text: str, stream: bool, n_tokens: int = N_TOKENS):
    """One client's request (greedy, ``n_tokens``); returns (its text (embeddings: the
    vector), its HTTP status)."""
    with httpx.Client(base_url=url, timeout=600) as c:
        if kind == "emb":
            r = c.post("/v1/embeddings", json={"input": text})
            return (r.json()["data"][0]["embedding"] if r.status_code == 200 else r.text), r.status_code
        if kind == "ls":
            body = {"prompt": text, "n_predict": n_tokens, "temperature": 0, "stream": stream}
            path, pick = "/completion", (lambda d: d["content"])
        elif kind == "c":
            body = {"prompt": text, "max_tokens": n_tokens, "temperature": 0, "stream": stream}
            path, pick = "/v1/completions", (lambda d: d["choices"][0]["text"])
        else:
            body = {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": n_tokens,
                "temperature": 0,
                "stream": stream,
            }
            path = "/v1/chat/completions"
            pick = (
                (lambda d: d["choices"][0]["delta"].get("content") or "")
                if stream
                else (lambda d: d["choices"][0]["message"]["content"])
            )
        if not stream:
            r = c.post(path, json=body)
            return (pick(r.json()) if r.status_code == 200 else r.text), r.status_code
        out = ""
        with c.stream("POST", path, json=body) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    out += pick(json.loads(line[6:]))
            return out, s.status_code


def test_16_concurrent_clients_get_their_solo_text(server, solo):
    work = (
        [("c", p) for p in COMPLETIONS]
        + [("chat", q) for q in CHATS]
        + [("ls", p) for p in LLAMA_SERVER]
        + [("emb", t) for t in EMBED]
    )
    assert len(work) == 16
    emb_solo = {t: _request(server.url, "emb", t, False)[0] for t in EMBED}
    before = httpx.get(server.url + "/stats").json()
    with ThreadPoolExecutor(len(work)) as ex:
        got = list(ex.map(lambda iw: _request(server.url, *iw[1], stream=iw[0] % 2 == 1), enumerate(work)))
    assert [status for _, status in got] == [200] * len(work), got
    for (kind, text), (answer, _) in zip(work, got):
        if kind == "emb":
            assert answer == emb_solo[text]
        else:
            assert answer == solo[kind, text], (kind, text)
    after = httpx.get(server.url + "/stats").json()
    steps, tokens = after["steps"] - before["steps"], after["tokens_decoded"] - before["tokens_decoded"]
    # 14 generating requests of 12 tokens each: one at a time would take >= 14 * 12 steps
    assert tokens >= 14 * N_TOKENS and steps < 14 * N_TOKENS * 0.6, (steps, tokens)
    assert after["total_slots"] == 4 and after["slots_processing"] == 0


def test_props_and_slots_report_the_split_context(server):
    p = httpx.get(server.url + "/props").json()
    assert p["total_slots"] == 4 and p["n_ctx"] == 2048 and p["n_ctx_slot"] == 512
    assert p["default_generation_settings"]["n_ctx"] == 512
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and all(s["n_ctx"] == 512 for s in slots)
    # a prompt longer than a slot (but within the total) is refused, as llama-server does
    r = httpx.post(server.url + "/completion", json={"prompt": "x " * 700, "n_predict": 1}, timeout=60)
    assert r.status_code == 400 and "512" in r.json()["error"]["message"]


def _wait(pred, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_cancel_mid_stream_frees_its_slot_within_one_step(server):
    url = server.url
    long = {"n_predict": 1500, "temperature": 0, "ignore_eos": True, "stream": True}
    cancels = len(httpx.get(url + "/stats").json()["cancel_steps"])
    with httpx.Client(timeout=120) as a, httpx.Client(timeout=120) as b:
        with b.stream("POST", url + "/completion", json={"prompt": "Once upon a time", **long}) as sb:
            b_lines = sb.iter_lines()
            assert next(line for line in b_lines if line.startswith("data: "))
            with a.stream("POST", url + "/completion", json={"prompt": "The sea", **long}) as sa:
                a_lines = sa.iter_lines()
                for _ in range(3):
                    next(line for line in a_lines if line.startswith("data: "))
                a_slot = json.loads(next(line for line in a_lines if line.startswith("data: "))[6:])["id_slot"]
                assert _wait(lambda: httpx.get(url + "/stats").json()["slots_processing"] == 2, "two running")
            # A's client is gone: the scheduler drops its slot at the next step
            s = _wait(
                lambda: (lambda s: s if len(s["cancel_steps"]) > cancels else None)(httpx.get(url + "/stats").json()),
                "the cancel was not seen",
            )
            cancel_step, left_step = s["cancel_steps"][-1]
            assert 0 <= left_step - cancel_step <= 1, s["cancel_steps"]
            slots = _wait(
                lambda: (lambda sl: sl if not sl[a_slot]["is_processing"] else None)(httpx.get(url + "/slots").json()),
                "A's slot still busy",
            )
            assert slots[a_slot]["n_past"] == 0  # its KV cells were cleared
            # B decodes on, and a new request runs next to it
            steps = httpx.get(url + "/stats").json()["steps"]
            r = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0}, timeout=120)
            assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
            for _ in range(3):
                assert next(line for line in b_lines if line.startswith("data: "))
            assert httpx.get(url + "/stats").json()["steps"] > steps
    s = _wait(
        lambda: (lambda s: s if s["slots_processing"] == 0 else None)(httpx.get(url + "/stats").json()),
        "B's slot still busy",
    )
    assert s["cancelled"] >= 2 and server.alive()
