"""The batching worker in-process on a tiny model: concurrent requests in two slots equal
a lone Llama, logprobs with echo (every prompt row's logits) under logits_all, the
parallel count checked against the context, and steps that wait for a slot busy in Python."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from powerinfer_backend import Llama

PROMPTS = ["the cat sat on", "hello there", "a b c d e f g", "once upon"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tests.fixtures.server import write_server_model

    return write_server_model(tmp_path_factory.mktemp("slots") / "tiny.gguf")


def _client(app):
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)


def test_two_slots_logprobs_echo_equal_a_lone_llama(tiny_path):
    from powerinfer_backend.server.app import create_app

    kw = dict(n_threads=1, logits_all=True, verbose=False)
    body = dict(max_tokens=6, temperature=0, logprobs=3, echo=True)
    with Llama(tiny_path, n_ctx=128, **kw) as solo:
        want = [solo.create_completion(p, **body)["choices"][0] for p in PROMPTS]
    llm = Llama(tiny_path, n_ctx=256, n_seq_max=2, **kw)
    app = create_app(llm)
    try:
        with _client(app) as c:
            assert c.get("/props").json()["total_slots"] == 2
            with ThreadPoolExecutor(4) as ex:
                got = list(ex.map(lambda p: c.post("/v1/completions", json={"prompt": p, **body}), PROMPTS))
            assert [r.status_code for r in got] == [200] * 4
            for r, w in zip(got, want):
                ch = r.json()["choices"][0]
                assert ch["text"] == w["text"]
                assert ch["logprobs"]["tokens"] == w["logprobs"]["tokens"]
                assert ch["logprobs"]["token_logprobs"][1:] == pytest.approx(
                    w["logprobs"]["token_logprobs"][1:], abs=1e-5
                )
            stats = c.get("/stats").json()
            assert stats["served"] == 4 and stats["slots_processing"] == 0
    finally:
        app.state.serve.worker.stop()
        llm.close()


def test_parallel_beyond_the_context_is_refused(tiny_path):
    from powerinfer_backend.server.app import create_app

    with Llama(tiny_path, n_ctx=256, n_seq_max=2, n_threads=1, verbose=False) as llm:
        with pytest.raises(ValueError, match="n_seq_max=2"):
            create_app(llm, parallel=3)
        with pytest.raises(ValueError, match="parallel must be >= 1"):
            create_app(llm, parallel=0)


def test_parallel_flag_range():
    from powerinfer_backend.cli import main

    for argv in (["serve", "--parallel", "0"], ["serve", "-np", "many"]):
        with pytest.raises(SystemExit):
            main(argv)


def test_a_burst_fills_free_slots_before_the_queue_limit(tiny_path):
    """--max-queue counts requests waiting for a slot: with 4 free slots and max_queue 1, a burst of
    5 is taken (4 run, 1 waits) and only the 6th gets 503 (it counted jobs the free slots were about
    to take, and refused the 2nd request of a burst)."""
    import asyncio

    from powerinfer_backend.server.errors import APIError
    from powerinfer_backend.server.worker import ModelWorker

    with Llama(tiny_path, n_ctx=256, n_seq_max=4, n_threads=1, verbose=False) as llm:
        worker = ModelWorker(llm, max_queue=1)
        try:

            async def burst():
                jobs, refused = [], 0
                with worker._cv:  # the scheduler admits nothing until the whole burst is in
                    for _ in range(6):
                        try:
                            jobs.append(worker.submit(lambda slot: 7))
                        except APIError as e:
                            assert e.status == 503
                            refused += 1
                answers = [await asyncio.wait_for(j.items.get(), 30) for j in jobs]
                return answers, refused

            answers, refused = asyncio.run(burst())
            assert refused == 1 and answers == [("item", 7)] * 5
        finally:
            worker.stop()


def test_slots_too_small_for_a_request_are_refused_naming_both_flags(model_path, capsys):
    """serve --parallel 64 --ctx-size 64 started with 1-token slots where every request failed;
    it is refused before the port is bound or the model loaded."""
    from powerinfer_backend.cli import main

    assert main(["serve", "--model", model_path, "--parallel", "64", "--ctx-size", "64", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "powerinfer-backend: error: --ctx-size 64 split over --parallel 64 slots leaves 1 token per slot "
        "(at least 16): raise --ctx-size or lower --parallel"
    ]


def test_a_step_waits_for_a_slot_busy_in_python(tiny_path):
    """No slot is left out of a step by time: next to a fast request, one whose logits
    processor takes 50 ms a token decodes in the same steps (one step for both prompts,
    then one per token)."""
    import asyncio
    import time

    from powerinfer_backend.server.worker import ModelWorker

    def slow(input_ids, scores):
        time.sleep(0.05)
        return scores

    with Llama(tiny_path, n_ctx=256, n_seq_max=2, n_threads=1, verbose=False) as llm:
        worker = ModelWorker(llm)
        kw = dict(max_tokens=6, temperature=0, logit_bias={llm.token_eos(): -100.0})
        try:

            async def both():
                with worker._cv:  # both join the same step
                    jobs = [
                        worker.submit(lambda slot, p=p, lp=lp: slot.create_completion(p, logits_processor=lp, **kw))
                        for p, lp in ((PROMPTS[0], [slow]), (PROMPTS[1], None))
                    ]
                return [await asyncio.wait_for(j.items.get(), 60) for j in jobs]

            got = asyncio.run(both())
            assert [(kind, r["choices"][0]["finish_reason"]) for kind, r in got] == [("item", "length")] * 2
            assert (
                worker.steps == 6
                and worker.tokens_decoded == sum(len(llm.prompt_tokens(p)) for p in PROMPTS[:2]) + 2 * 5
            )
        finally:
            worker.stop()


def test_a_slot_shares_the_named_parts_and_owns_its_sequence(tiny_path):
    """A slot names each attribute of a Llama as shared (the same object) or its own: an
    attribute added to Llama fails here until it is sorted into one of the two lists."""
    from powerinfer_backend.server.slots import OWN, SHARED, SlotLlama

    with Llama(tiny_path, n_ctx=128, n_seq_max=2, n_threads=1, verbose=False) as base:
        slot = SlotLlama(base, 1, 32, decode=None)
        try:
            assert set(vars(base)) - {"_announced"} <= set(SHARED) | set(OWN)
            assert set(vars(slot)) == set(SHARED) | set(OWN)
            assert all(getattr(slot, n) is getattr(base, n) for n in SHARED)
            assert slot._seq is not base._seq and slot._backend is not base._backend
            assert slot.n_ctx() == 32 and slot.sequence.seq_id == 1 and base.n_ctx() != 32
        finally:
            slot.close()
