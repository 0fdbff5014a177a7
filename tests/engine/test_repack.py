"""Row groups at load (NativeModel.repack, pi_model_repack; Llama(repack=True), the default):
on SmolLM2 requantized to Q4_0 by llama.cpp, the bytes copied are exactly the Q4_0 product
matrices and the tied output (token_embd, Q8_0); the file's pages of each copied tensor
leave the process (one copy held); the sparse FFN keeps gathering the file's rows, while its
product form reads the row groups; the
logits stay within llama.cpp's own drift between its repacked and plain Q4_0 kernels,
closer to its repacked ones (the same float order per block); a sidecar's speedup measured
against the file's rows no longer decides "auto"; batch invariance on this model is in
test_seqs.py."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend._native import ffi, lib
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures import SHARED_DATA

SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"

PRODUCT = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _mapping_rss(path: str) -> int:
    """Bytes of ``path``'s mapping(s) resident in this process (/proc/self/smaps)."""
    rss, inside = 0, False
    real = __import__("os").path.realpath(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(real)
            elif inside and first == "Rss:":
                rss += int(line.split()[1]) * 1024
    return rss


def test_repack_copies_the_q4_0_products_and_releases_their_pages(smol_q4_0_path):
    g = load_gguf(smol_q4_0_path, verbose=False)
    products = [v for name, v in g.tensors.items() if name.split(".")[-2] in PRODUCT]
    assert {v.type_name for v in products} == {"Q4_0"} and len(products) == 7 * g.hparams.n_layer
    head = g.tensors["token_embd.weight"]  # the tied output: a Q8_0 copy, its rows kept for the lookup
    assert head.type_name == "Q8_0" and g.tied_output
    want = sum(v.nbytes for v in products) + head.nbytes
    m = NativeModel(g)
    try:
        np.asarray(g._mm).sum()  # every page of the file resident first
        before = _mapping_rss(smol_q4_0_path)
        assert before >= g.file_size - (1 << 20)
        assert m.repack() == want
        after = _mapping_rss(smol_q4_0_path)
        # each copied tensor's whole pages released (a partial page at either end may stay)
        assert after <= before - want + 2 * 4096 * (len(products) + 1)
        assert m.repack() == 0  # repacked already
    finally:
        m.close()


def _greedy_logits(model: NativeModel, tokens, setup=None) -> np.ndarray:
    ctx = NativeContext(model, n_ctx=64, n_batch=64, n_threads=2)
    if setup is not None:
        setup(ctx)
    rows = [ctx.eval(tokens[:4])[0].copy()] + [ctx.eval([t])[0].copy() for t in tokens[4:]]
    ctx.close()
    return np.stack(rows)


def test_sparse_ffn_gathers_the_file_rows_after_a_repack(smol_q4_0_path):
    """Layer 0's gate and up repacked under a sparse FFN that gathers rows (the gate form):
    it reads the file's rows, so its logits are those of the model without the copy."""
    g = load_gguf(smol_q4_0_path, verbose=False)
    tokens = [int(t) for t in np.random.default_rng(3).integers(1, 49152, 10)]
    n_ff, n_embd = g.hparams.n_ff, g.hparams.n_embd
    v = g.tensors["blk.0.ffn_down.weight"]
    down_t = np.ascontiguousarray(v.to_float32().reshape(n_embd, n_ff).T)

    def sparse0(ctx):
        ctx.set_ffn_threshold_on("gate")
        ctx.set_ffn_sparsity(0, down_t, 0.05)

    plain, copied = NativeModel(g), NativeModel(g)
    try:
        slots = ffi.new("uint32_t[]", g.hparams.n_layer)
        slots[0] = (1 << lib.PI_L_FFN_GATE) | (1 << lib.PI_L_FFN_UP)
        done = ffi.new("int64_t *")
        assert lib.pi_model_repack(copied.ptr, slots, 0, ffi.NULL, ffi.NULL, done) == 0
        assert done[0] == 2 * g.tensors["blk.0.ffn_up.weight"].nbytes
        # the copy's bytes read as rows would give garbage, not these bits
        assert np.array_equal(_greedy_logits(copied, tokens, sparse0), _greedy_logits(plain, tokens, sparse0))
    finally:
        plain.close()
        copied.close()


def test_product_form_reads_the_row_groups(smol_q4_0_path):
    """The product form of a SwiGLU layer reads every gate and up row through the dense
    products: those stay in the repack (``gathered_layers`` leaves them out, the gate form keeps
    them in the file's rows), and a token's logits have the same bits decoded alone or in a batch."""
    g = load_gguf(smol_q4_0_path, verbose=False)
    hp = g.hparams
    layers = (0, hp.n_layer - 1)
    down_t = {
        i: np.ascontiguousarray(g.tensors[f"blk.{i}.ffn_down.weight"].to_float32().reshape(hp.n_embd, hp.n_ff).T)
        for i in layers
    }

    def product(ctx):
        for i in layers:
            ctx.set_ffn_sparsity(i, down_t[i], 0.02)

    m = NativeModel(g)
    try:
        probe = NativeContext(m, n_ctx=64, n_batch=64, n_threads=1)
        product(probe)
        assert probe.gathered_layers == frozenset()
        probe.set_ffn_threshold_on("gate")
        assert probe.gathered_layers == frozenset(layers)
        probe.close()
        products = [v for name, v in g.tensors.items() if name.split(".")[-2] in PRODUCT]
        assert m.repack() == sum(v.nbytes for v in products) + g.tensors["token_embd.weight"].nbytes
        prompt = [int(t) for t in np.random.default_rng(4).integers(1, hp.n_vocab, 6)]
        alone = NativeContext(m, n_ctx=64, n_batch=64, n_threads=2)
        product(alone)
        rows = [alone.eval(prompt)[0].copy()]
        tokens = [int(np.argmax(rows[-1]))]
        for _ in range(3):
            rows.append(alone.eval(tokens[-1:])[0].copy())
            tokens.append(int(np.argmax(rows[-1])))
        used, total = alone.ffn_stats()
        assert 0 < used < total  # sparse: some neurons skipped
        batch = NativeContext(m, n_ctx=64, n_batch=64, n_threads=2)
        product(batch)
        batch.eval(prompt)
        got = batch.eval(tokens[:3], logits_all=True)
        for i in range(3):
            assert np.array_equal(got[i], rows[i + 1]), f"token {i}: max |diff| {np.abs(got[i] - rows[i + 1]).max()}"
        alone.close()
        batch.close()
    finally:
        m.close()


def test_repack_range_must_be_whole(smol_q4_0_path):
    m = NativeModel(load_gguf(smol_q4_0_path, verbose=False))
    try:
        lo = ffi.cast("const void *", 4096)
        assert lib.pi_model_repack(m.ptr, ffi.NULL, 1, lo, ffi.NULL, ffi.NULL) != 0
        assert "release range" in ffi.string(lib.pi_last_error()).decode()
    finally:
        m.close()


@pytest.mark.llama_cpp
@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} not found")
def test_logits_within_llama_cpp_repack_drift(smol_q4_0_path):
    """Teacher-forced over real text: ours repacked vs llama.cpp with its repacked Q4_0
    (extra buffer types) differ less than llama.cpp's repacked vs plain kernels do; the
    top-1 tokens agree as often."""
    from powerinfer_backend import Llama
    from powerinfer_backend.plugins.reference import load_reference

    llm = Llama(smol_q4_0_path, n_ctx=256, n_threads=2, verbose=False, logits_all=True)
    assert llm._backend.repacked > 0
    tokens = llm.tokenize(SHAKESPEARE.read_text()[-3000:].encode())[:96]
    llm.eval(tokens)
    ours = np.array(llm.scores[: len(tokens)])
    llm.close()
    refs = {}
    for extra in (True, False):
        ref = load_reference(smol_q4_0_path, n_ctx=256, n_threads=2, logits_all=True, extra_buffer_types=extra)
        ref.eval(tokens)
        refs[extra] = np.array(ref.scores[: len(tokens)])
        ref.close()
    drift = np.abs(refs[True] - refs[False]).mean()
    assert np.abs(ours - refs[True]).mean() < drift
    agree = (ours.argmax(1) == refs[True].argmax(1)).mean()
    assert agree >= (refs[False].argmax(1) == refs[True].argmax(1)).mean() - 0.03


def test_repack_keyword_is_checked(smol_q4_0_path):
    from powerinfer_backend import Llama

    with pytest.raises(ValueError, match="repack must be True or False"):
        Llama(smol_q4_0_path, repack="no", verbose=False)
    llm = Llama(smol_q4_0_path, n_ctx=64, n_threads=1, verbose=False, repack=False)
    assert llm._backend.repacked == 0
    llm.close()


def test_repack_waits_for_no_context(smol_q4_0_path):
    """The matrices change under a context that evaluates: refused while one does."""
    m = NativeModel(load_gguf(smol_q4_0_path, verbose=False))
    ctx = NativeContext(m, n_ctx=32, n_batch=32, n_threads=1)
    try:
        with ctx._exclusive():  # what an eval in another thread holds
            with pytest.raises(RuntimeError, match="while a context of the model is evaluating"):
                m.repack()
        assert m.repack() > 0 and m.repacked_bytes > 0
        assert ctx.eval([1, 2, 3]).shape == (1, ctx.n_vocab)
    finally:
        ctx.close()
        m.close()


def test_ffn_repackable_names_the_models_whose_dense_ffn_changes(model_path, smol_q4_0_path):
    """Q4_1's FFN (SmolLM2 as shipped) has no row groups, only its tied Q8_0 head: a sidecar's
    speedup measured against its rows still holds (sparsity.modes); Q4_0's FFN has them."""
    for path, want in ((model_path, False), (smol_q4_0_path, True)):
        m = NativeModel(load_gguf(path, verbose=False))
        try:
            assert m.ffn_repackable() is want
            assert m.repack() > 0  # the head (Q8_0) at least
        finally:
            m.close()
