"""``serve --parallel 2 --device ggml-cpu --vram-budget 48MiB`` over loopback (issue 24 item 4): two
concurrent greedy ``/completion`` clients each get exactly the text the same placement (same
n_ctx, slots, budget and threads: an in-process ``Llama(n_seq_max=2)``, its own completions in
sequence 0) gives that prompt alone; the server's device holds the plan's buffers, KV included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from powerinfer_backend import Llama

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from tests.fixtures.server import ServerProcess  # noqa: E402 - needs the packages checked above

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
N_TOKENS = 8
BUDGET = "48MiB"


def test_parallel_slots_on_a_device_answer_as_alone(model_path, xdg_cache):
    with Llama(
        model_path,
        n_ctx=512,
        n_batch=64,
        n_threads=1,
        n_seq_max=2,
        device="ggml-cpu",
        vram_budget=BUDGET,
        verbose=False,
    ) as llm:
        solo = [llm.create_completion(p, max_tokens=N_TOKENS, temperature=0)["choices"][0]["text"] for p in PROMPTS]
        dev = llm.stats()["device"]
    print(f"placed: {dev['buffers']}")
    assert dev["buffers"]["kv"] > 0 and dev["buffers"]["weights"] > 0  # partly placed: attention and hot rows
    s = ServerProcess(
        "--model",
        model_path,
        "--ctx-size",
        "512",
        "--batch-size",
        "64",
        "--parallel",
        "2",
        "--device",
        "ggml-cpu",
        "--vram-budget",
        BUDGET,
    )
    try:

        def ask(prompt: str) -> dict:
            return httpx.post(
                s.url + "/completion", json={"prompt": prompt, "n_predict": N_TOKENS, "temperature": 0}, timeout=300
            ).json()

        with ThreadPoolExecutor(len(PROMPTS)) as ex:
            got = list(ex.map(ask, PROMPTS))
        props = httpx.get(s.url + "/props", timeout=60).json()
    finally:
        s.close()
    assert [r["content"] for r in got] == solo
    assert props["total_slots"] == 2 and props["stats"]["device"]["buffers"] == dev["buffers"]
