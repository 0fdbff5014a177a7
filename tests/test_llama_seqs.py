"""``Llama(n_seq_max=N)``: the context holds N sequences for the server (``native_context``'s
eval_seqs), this Llama's own completion runs in sequence 0 with its n_ctx / N window, and a
ggml device placement holds every slot's KV. On a tiny llama."""

from __future__ import annotations

import pytest
from tests.fixtures.tiny_gguf import write_tiny_llama

from powerinfer_backend import Llama
from powerinfer_backend.engine.native import NativeContext

KW = dict(n_ctx=64, n_batch=16, n_threads=1, verbose=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("seqs") / "m.gguf", n_layer=2, n_ff=128))


def _greedy(llm) -> str:
    return llm.create_completion([1, 5, 9], max_tokens=8, temperature=0.0)["choices"][0]["text"]


def test_sequence_zero_completes_as_one_sequence(tiny):
    with Llama(tiny, **KW) as one, Llama(tiny, n_seq_max=4, **KW) as four:
        ctx = four.native_context
        assert isinstance(ctx, NativeContext) and isinstance(one.native_context, NativeContext)
        assert (ctx.n_seq_max, ctx.n_ctx_seq, four.n_ctx()) == (4, 16, 64)
        assert one.native_context.n_seq_max == 1 and one.native_context.n_ctx_seq == 64
        assert _greedy(four) == _greedy(one)
        assert ctx.seq_n_past(0) > 0 and ctx.seq_n_past(1) == 0  # Llama's own calls: sequence 0
        with pytest.raises(ValueError, match="exceed context window of 16"):
            four.create_completion(list(range(1, 18)), max_tokens=1)


def test_placement_with_several_sequences(tiny, xdg_cache):
    # n_ctx 64 over 2 slots: 2 x 64 padded cells, twice one sequence's (the plan counts the
    # context's cells: ggml's buffers equal the plan's, checked by the placement)
    with (
        Llama(tiny, device="ggml-cpu", vram_budget="1GiB", n_seq_max=2, **KW) as two,
        Llama(tiny, device="ggml-cpu", vram_budget="1GiB", n_seq_max=1, **KW) as one,
    ):
        b2, b1 = two.stats()["device"]["buffers"], one.stats()["device"]["buffers"]
        assert b1["kv"] > 0 and b2["kv"] == 2 * b1["kv"] and b2["weights"] == b1["weights"]
        assert two.native_context.n_seq_max == 2
        assert _greedy(two) == _greedy(one)  # sequence 0 over the same placement
