"""``serve --parallel 8`` over loopback: 64 concurrent streams each get their solo text,
and a returning request finds the slot holding its prefix (llama-server's slot choice),
evaluating only the tokens its cells lack (counted: ``/completion``'s ``timings.prompt_n``,
``/slots``' ``n_prompt_tokens_processed``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from powerinfer_backend import Llama

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from tests.fixtures.server import ServerProcess  # noqa: E402 - needs the packages checked above
from tests.server.test_parallel import _request  # noqa: E402 - needs the packages checked above

N_TOKENS = 8
SLOT_CTX = 256  # 2048 / 8
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "Water boils at",
    "My favourite food is",
    "A haiku about rain:",
    "The best way to learn",
    "Roses are red,",
]
CHATS = ["Name a fruit.", "Say hello.", "What is 2+2?", "Name a colour."]
TURN_1 = [{"role": "user", "content": "Give me a word that rhymes with cat."}]
TURN_2 = " And one that rhymes with dog?"


@pytest.fixture(scope="module")
def server(model_path):
    s = ServerProcess("--model", model_path, "--ctx-size", str(8 * SLOT_CTX), "--parallel", "8", "--max-queue", "64")
    yield s
    s.close()


@pytest.fixture(scope="module")
def solo(model_path):
    """A lone Llama with one slot's context: each prompt's greedy text, and the prompt
    tokens a second chat turn evaluates after the first."""
    with Llama(model_path, n_ctx=SLOT_CTX, n_threads=1, verbose=False) as llm:
        out = {
            ("c", p): llm.create_completion(p, max_tokens=N_TOKENS, temperature=0)["choices"][0]["text"]
            for p in PROMPTS
        }
        out.update({("ls", p): out["c", p] for p in PROMPTS})
        for q in CHATS:
            msgs = [{"role": "user", "content": q}]
            out["chat", q] = llm.create_chat_completion(msgs, max_tokens=N_TOKENS, temperature=0)["choices"][0][
                "message"
            ]["content"]
        llm.reset()
        reply = llm.create_chat_completion(TURN_1, max_tokens=N_TOKENS, temperature=0)["choices"][0]["message"]
        out["reply"] = reply["content"]
        llm.create_chat_completion(_turn_2(reply["content"]), max_tokens=N_TOKENS, temperature=0)
        out["turn 2 evaluated"] = llm.sequence.prompt_evaluated
        yield out


def _turn_2(reply: str) -> list:
    return TURN_1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": TURN_2}]


def test_64_concurrent_streams_on_8_slots_get_their_solo_text(server, solo):
    kinds = [("c", p) for p in PROMPTS] + [("ls", p) for p in PROMPTS] + [("chat", q) for q in CHATS]
    work = [kinds[i % len(kinds)] for i in range(64)]  # each prompt 3 or 4 times: cached prefixes too
    before = httpx.get(server.url + "/stats").json()
    with ThreadPoolExecutor(len(work)) as ex:
        got = list(ex.map(lambda w: _request(server.url, *w, stream=True, n_tokens=N_TOKENS), work))
    assert [status for _, status in got] == [200] * len(work), got
    for (kind, text), (answer, _) in zip(work, got):
        assert answer == solo[kind, text], (kind, text)
    stats = httpx.get(server.url + "/stats").json()
    assert stats["served"] - before["served"] == 64 and stats["rejected"] == 0 and server.alive()
    steps, tokens = stats["steps"] - before["steps"], stats["tokens_decoded"] - before["tokens_decoded"]
    # a request takes 8 steps (its prompt, then 7 decodes): 64 steps if the 8 slots were always full
    assert tokens >= 64 * N_TOKENS and steps <= 96, (steps, tokens)


def _completion(url: str, prompt, **kw) -> dict:
    r = httpx.post(url + "/completion", json={"prompt": prompt, "temperature": 0, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_returning_prompt_evaluates_only_what_its_slot_lacks(server):
    url = server.url

    def tok(text, special):
        return httpx.post(url + "/tokenize", json={"content": text, "add_special": special}).json()["tokens"]

    p = tok("Tell me about the moons of Jupiter.", True)
    first = _completion(url, p, n_predict=N_TOKENS, ignore_eos=True)
    assert first["timings"]["prompt_n"] == len(p) and first["stop_type"] == "limit"
    other = _completion(url, "Unrelated: the rain in Spain", n_predict=2)  # another slot (least recently used)
    assert other["id_slot"] != first["id_slot"]
    more = tok(" Which is the largest?", False)
    again = _completion(url, p + first["tokens"] + more, n_predict=2)
    # the cells hold the prompt and every generated token but the last (sampled, never evaluated)
    assert again["id_slot"] == first["id_slot"]
    assert again["timings"]["prompt_n"] == len(more) + 1
    assert again["timings"]["cache_n"] == len(p) + N_TOKENS - 1
    slots = httpx.get(url + "/slots").json()
    assert slots[again["id_slot"]]["n_prompt_tokens_processed"] == len(more) + 1


def test_a_second_chat_turn_evaluates_as_a_lone_llama_continuing_it(server, solo):
    url = server.url
    body = {"max_tokens": N_TOKENS, "temperature": 0}
    r1 = httpx.post(url + "/v1/chat/completions", json={"messages": TURN_1, **body}, timeout=120).json()
    reply = r1["choices"][0]["message"]["content"]
    assert reply == solo["reply"]
    _completion(url, "Unrelated: a list of prime numbers", n_predict=2)  # between the turns, on another slot
    before = httpx.get(url + "/slots").json()
    r2 = httpx.post(url + "/v1/chat/completions", json={"messages": _turn_2(reply), **body}, timeout=120)
    assert r2.status_code == 200
    after = httpx.get(url + "/slots").json()
    ran = [a for b, a in zip(before, after) if a["n_past"] != b["n_past"]]
    assert len(ran) == 1, (before, after)
    n = ran[0]["n_prompt_tokens_processed"]
    # the lone Llama kept the first turn too: both evaluate the same new tokens, a small part of the prompt
    assert n == solo["turn 2 evaluated"] and 0 < n < r2.json()["usage"]["prompt_tokens"] // 2, (n, r2.json())
