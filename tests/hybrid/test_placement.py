"""VRAM placement (powerinfer_backend/hybrid/placement/): exact byte accounting, the
budget never exceeded (hypothesis), frequency order, budget parsing and rules,
the cached plan beside the model, and `powerinfer-backend plan`."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.cli.commands import main as cli_main
from powerinfer_backend.loader import load_gguf

from tests.fixtures.tiny_gguf import write_tiny_llama

F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30

# the tiny model below, worked out by hand (Q8_0 row of 64 = 2 blocks x 34 B = 68 B):
#   attention block: attn_norm 256 + q 4352 + k 2304 (2176 aligned) + v 2304 + out 4352
#   + ffn_norm 256 = 13824, + KV for n_ctx 100 (128 cells x 32 x F16, K and V) 16384
ATTN_BLOCK = 13824 + 16384
#   128 hot rows: gate 8704 + up 8704 + down_t F16 16384 + map 512
HOT_ALL = 34304
#   output_norm 256 + tied embedding 4352 + logits 4 x 64 x 4 = 1024
OUTPUT = 5632
#   n_batch 4: x, xn, y 3 x 1024; q, attn 2 x 1024; k, v 2 x 512; g, u 2 x 2048;
#   scores 4 x 4 heads x 128 cells x 4 = 8192; quantize input 1024
SCRATCH = 19456
FULL = SCRATCH + 2 * (ATTN_BLOCK + HOT_ALL) + OUTPUT  # 154112


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("pl") / "tiny.gguf", n_layer=2, n_ff=128)
    m = load_gguf(path, verbose=False)
    sizes = P.ModelSizes.from_gguf(m)
    m.close()
    return path, sizes


def test_byte_accounting_is_exact(tiny):
    _, s = tiny
    assert P.attn_block_bytes(s, 0, 100) == ATTN_BLOCK == 30208
    assert P.kv_bytes_per_layer(s, 100) == 16384 and P.kv_bytes_per_layer(s, 128) == 16384
    assert P.kv_bytes_per_layer(s, 129) == 24576  # 192 cells: one more KV_PAD block of 64
    assert P.hot_bytes(s, 0, 128) == HOT_ALL and P.hot_bytes(s, 0, 1) == 4 * 256 and P.hot_bytes(s, 0, 0) == 0
    assert P.neuron_bytes(s, 1) == (68, 68, 128)
    assert P.output_block_bytes(s, 4) == OUTPUT
    assert P.scratch_bytes(s, 100, 4) == SCRATCH
    assert P.full_device_bytes(s, 100, 4) == FULL == 154112


def test_full_zero_and_below_scratch(tiny):
    _, s = tiny
    full = P.plan_placement(s, None, FULL, n_ctx=100, n_batch=4)
    assert full.device_bytes == FULL and full.kv_location == "device" and full.output_on_device
    assert [L.n_hot for L in full.layers] == [128, 128] and full.hot_fraction == 1.0
    assert full.bytes_by_category() == {"scratch": SCRATCH, "attention": 2 * 13824, "kv_cache": 2 * 16384,
                                        "output": OUTPUT, "ffn_hot": 2 * HOT_ALL, "free": 0}
    for budget in (0, SCRATCH - 1):
        p = P.plan_placement(s, None, budget, n_ctx=100, n_batch=4)
        assert p.device_bytes == 0 and p.kv_location == "cpu" and not p.output_on_device
        assert all(L.n_hot == 0 for L in p.layers)
    # one byte short of everything: dense blocks come first, so the last hot rows stay
    # on the CPU (one 256 B unit of each row array: 2 of layer 1's neurons)
    p = P.plan_placement(s, None, FULL - 1, n_ctx=100, n_batch=4)
    assert p.device_bytes == FULL - 256 and p.output_on_device and p.kv_location == "device"
    assert [L.n_hot for L in p.layers] == [128, 126]


def test_dense_first_then_hot_by_frequency(tiny):
    _, s = tiny
    freq = np.zeros((2, 128))
    freq[1, [5, 77, 100]] = 0.9  # the most frequent neurons are in layer 1
    freq[0, 3] = 0.5
    base = SCRATCH + 2 * ATTN_BLOCK + OUTPUT
    # 3 hot rows: gate 3 x 68 -> 256, up 256, down_t 3 x 128 -> 512, map 12 -> 256; 4 rows: 1792
    assert P.hot_bytes(s, 1, 3) == 1280 and P.hot_bytes(s, 1, 4) == 1792
    p = P.plan_placement(s, freq, base + 1280, n_ctx=100, n_batch=4)
    assert p.kv_location == "device" and p.output_on_device
    assert p.layers[1].hot_ids.tolist() == [5, 77, 100] and p.layers[0].n_hot == 0
    assert p.device_bytes == base + 1280 and p.layers[1].freq_mass == 1.0
    # room for two groups of 32: layer 1's first group, then layer 0's (mean 0.5/32 > 0)
    g32 = P.hot_bytes(s, 0, 32)
    assert g32 == 2304 + 2304 + 4096 + 256
    p = P.plan_placement(s, freq, base + 2 * g32, n_ctx=100, n_batch=4)
    assert [L.n_hot for L in p.layers] == [32, 32] and p.device_bytes == base + 2 * g32
    assert {5, 77, 100} <= set(p.layers[1].hot_ids.tolist())
    # layer 0 ranks id 3 first, then the zeros by id: 0, 1, 2, 4, ..., 31
    assert p.layers[0].hot_ids.tolist() == list(range(32))
    # no room for the dense blocks' scratch: nothing at all, even with hot neurons ready
    assert P.plan_placement(s, freq, SCRATCH - 1, n_ctx=100, n_batch=4).device_bytes == 0


def test_disable_gpu_index(tiny):
    _, s = tiny
    p = P.plan_placement(s, None, FULL, n_ctx=100, n_batch=4, disable_gpu_index=True)
    assert all(L.n_hot == 0 for L in p.layers) and p.device_bytes == SCRATCH + 2 * ATTN_BLOCK + OUTPUT


def test_bad_inputs(tiny):
    _, s = tiny
    with pytest.raises(ValueError, match="vram_budget must be an integer >= 0"):
        P.plan_placement(s, None, -1, n_ctx=100, n_batch=4)
    with pytest.raises(ValueError, match="n_ctx"):
        P.plan_placement(s, None, 0, n_ctx=0, n_batch=4)
    with pytest.raises(ValueError, match=r"shape \(n_layer, n_ff\) = \(2, 128\)"):
        P.plan_placement(s, np.ones((2, 64)), 0, n_ctx=100, n_batch=4)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        P.plan_placement(s, np.full((2, 128), 1.5), 0, n_ctx=100, n_batch=4)


# ---- the budget is never exceeded (hypothesis) --------------------------------------

_MAT_TYPES = [F32, F16, Q4_0, Q4_1, Q8_0, BF16]


@st.composite
def model_sizes(draw):
    n_layer = draw(st.integers(1, 5))
    n_embd = 32 * draw(st.integers(1, 8))
    n_ff = draw(st.integers(1, 300))
    n_head = draw(st.sampled_from([h for h in (1, 2, 4) if n_embd % h == 0 and (n_embd // h) % 2 == 0]))
    n_head_kv = draw(st.sampled_from([k for k in (1, 2, 4) if n_head % k == 0]))
    head = n_embd // n_head
    n_vocab = draw(st.integers(1, 500))

    def mat(ne0, ne1):
        t = draw(st.sampled_from(_MAT_TYPES)) if ne0 % 32 == 0 else F32
        return P.TensorSize(t, (ne0, ne1))

    layers = []
    for _ in range(n_layer):
        layers.append({"attn_norm": P.TensorSize(F32, (n_embd,)), "attn_q": mat(n_embd, n_embd),
                       "attn_k": mat(n_embd, n_head_kv * head), "attn_v": mat(n_embd, n_head_kv * head),
                       "attn_out": mat(n_embd, n_embd), "ffn_norm": P.TensorSize(F32, (n_embd,)),
                       "ffn_gate": mat(n_embd, n_ff), "ffn_up": mat(n_embd, n_ff), "ffn_down": mat(n_ff, n_embd)})
    s = P.ModelSizes(n_layer, n_embd, n_ff, n_head, n_head_kv, head, n_vocab, tuple(layers),
                     P.TensorSize(F32, (n_embd,)), mat(n_embd, n_vocab), draw(st.sampled_from([2, 4])))
    freq = draw(st.sampled_from(["none", "random", "ties"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if freq == "none":
        f = None
    elif freq == "random":
        f = rng.random((n_layer, n_ff))
    else:
        f = rng.choice([0.0, 0.1, 0.5, 1.0], size=(n_layer, n_ff))
    return s, f


@settings(max_examples=150, deadline=None)
@given(model_sizes(), st.floats(0, 1.2), st.integers(1, 3000), st.integers(1, 64), st.booleans())
def test_plan_never_exceeds_budget(sf, frac, n_ctx, n_batch, disable):
    s, f = sf
    full = P.full_device_bytes(s, n_ctx, n_batch)
    budget = int(full * frac)
    p = P.plan_placement(s, f, budget, n_ctx=n_ctx, n_batch=n_batch, disable_gpu_index=disable)
    assert p.device_bytes <= budget
    # the total is the sum of its parts, recomputed from the byte functions
    want = (P.scratch_bytes(s, n_ctx, n_batch) if p.device_bytes else 0) + \
        (P.output_block_bytes(s, n_batch) if p.output_on_device else 0)
    for L in p.layers:
        want += (P.attn_block_bytes(s, L.layer, n_ctx) if L.attn_on_device else 0) + P.hot_bytes(s, L.layer, L.n_hot)
        ids = L.hot_ids
        assert ids.dtype == np.int32 and np.all(np.diff(ids) > 0) and (ids.size == 0 or 0 <= ids[0] <= ids[-1] < s.n_ff)
        if disable:
            assert L.n_hot == 0
        elif f is not None and 0 < L.n_hot < s.n_ff:  # hot neurons fire at least as often as cold ones
            cold = np.setdiff1d(np.arange(s.n_ff), ids)
            assert f[L.layer, ids].min() >= f[L.layer, cold].max()
    assert p.device_bytes == want
    assert p.bytes_by_category()["free"] == budget - p.device_bytes >= 0
    if budget >= full:
        assert p.output_on_device and p.kv_location == "device"
        assert all(L.n_hot == (0 if disable else s.n_ff) for L in p.layers)
    # the same inputs give the same plan, and it survives JSON
    q = P.Plan.from_json(json.loads(json.dumps(p.to_json())))
    assert q.device_bytes == p.device_bytes and all(
        np.array_equal(a.hot_ids, b.hot_ids) for a, b in zip(p.layers, q.layers))


# ---- vram_budget and n_gpu_layers ------------------------------------------------------


@pytest.mark.parametrize("value,want", [
    (None, None), (0, 0), (8, 8 << 30), (0.5, 1 << 29), ("8", 8 << 30), ("8GiB", 8 << 30), ("8 gib", 8 << 30),
    ("512MiB", 512 << 20), ("512M", 512 << 20), ("1.5GB", 1_500_000_000), ("100B", 100), ("2KiB", 2048),
    ("1e-3", int(1e-3 * (1 << 30))), (np.int64(2), 2 << 30)])
def test_parse_vram_budget(value, want):
    assert P.parse_vram_budget(value) == want


@pytest.mark.parametrize("value", [-1, -0.5, "-1GiB", "abc", "8 parsecs", "", float("nan"), float("inf"),
                                   True, [8], "nan"])
def test_parse_vram_budget_rejects(value):
    with pytest.raises(ValueError, match="vram_budget"):
        P.parse_vram_budget(value)


def test_resolve_budget_rules(tiny):
    _, s = tiny
    kw = dict(n_ctx=100, n_batch=4)
    layer = ATTN_BLOCK + HOT_ALL
    # explicit vram_budget wins; n_gpu_layers ignored with one warning
    with pytest.warns(UserWarning, match="n_gpu_layers=3 ignored") as rec:
        d = P.resolve_budget("100KiB", 3, s, free_bytes=1 << 30, **kw)
    assert len(rec) == 1 and (d.bytes, d.source) == (102400, "vram_budget")
    with pytest.raises(ValueError, match=r"1073741824 bytes exceeds the device's free memory 1000 bytes"):
        P.resolve_budget(1, None, s, free_bytes=1000, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert P.resolve_budget(None, 0, s, free_bytes=1 << 30, **kw).bytes == 0
        assert P.resolve_budget(None, 1, s, free_bytes=1 << 30, **kw).bytes == SCRATCH + layer
        assert P.resolve_budget(None, 2, s, free_bytes=1 << 30, **kw).bytes == SCRATCH + 2 * layer
        assert P.resolve_budget(None, 3, s, free_bytes=1 << 30, **kw).bytes == FULL  # + the output "layer"
        assert P.resolve_budget(None, -1, s, free_bytes=1 << 30, **kw).bytes == FULL
        d = P.resolve_budget(None, -1, s, free_bytes=50000, **kw)  # capped, never an error
        assert d.bytes == 50000 and "capped at free device memory 50000 bytes" in d.message
        assert "converted to vram_budget" in P.resolve_budget(None, 1, s, free_bytes=1 << 30, **kw).message
        assert P.resolve_budget(None, 5, s, free_bytes=None, **kw).bytes == 0  # no device: CPU only
        d = P.resolve_budget(None, None, s, free_bytes=2 << 30, **kw)
        assert d.bytes == (2 << 30) - P.DEFAULT_FREE_MARGIN and d.source == "default"
        assert P.resolve_budget(None, None, s, free_bytes=100, **kw).bytes == 0
        assert P.resolve_budget(None, None, s, free_bytes=None, **kw).bytes == 0
    with pytest.raises(ValueError, match="n_gpu_layers must be an integer >= -1"):
        P.resolve_budget(None, -2, s, free_bytes=1 << 30, **kw)


# ---- the cached plan ----------------------------------------------------------------------


def test_plan_cached_beside_model(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    p1 = P.plan_for_model(path, FULL // 2, n_ctx=100, n_batch=4)
    assert not p1.cached and p1.path == tmp_path / "m.powerinfer" / "placement.json"
    stored = json.loads(p1.path.read_text())
    assert stored["model_fingerprint"] == stored["inputs"]["model_sha256"] and stored["device_bytes"] == p1.device_bytes
    p2 = P.plan_for_model(path, FULL // 2, n_ctx=100, n_batch=4)
    assert p2.cached and p2.device_bytes == p1.device_bytes
    assert [L.hot_ids.tolist() for L in p2.layers] == [L.hot_ids.tolist() for L in p1.layers]
    # other inputs: recomputed (and the file replaced)
    p3 = P.plan_for_model(path, FULL, n_ctx=100, n_batch=4)
    assert not p3.cached and p3.device_bytes == FULL
    assert not P.plan_for_model(path, FULL, n_ctx=100, n_batch=4, reset_gpu_index=True).cached
    p4 = P.plan_for_model(path, FULL, n_ctx=100, n_batch=4, disable_gpu_index=True)
    assert not p4.cached and p4.hot_fraction == 0.0
    freq = np.zeros((2, 128), np.float32)
    freq[0, :7] = 1
    p5 = P.plan_for_model(path, SCRATCH + 2 * ATTN_BLOCK + OUTPUT + 4 * 1024, n_ctx=100, n_batch=4, neuron_freq=freq)
    assert p5.inputs["freq_source"].startswith("array:") and p5.layers[0].hot_ids.tolist()[:7] == list(range(7))
    # a plan recorded for another model is not overwritten without reset_gpu_index
    d = json.loads(p5.path.read_text())
    d["model_fingerprint"] = "0" * 64
    p5.path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="Refusing to overwrite artifact"):
        P.plan_for_model(path, 0, n_ctx=100, n_batch=4)
    assert not P.plan_for_model(path, 0, n_ctx=100, n_batch=4, reset_gpu_index=True).cached
    assert sorted(os.listdir(p5.path.parent)) == ["placement.json"]  # atomic writes leave no temporaries


def test_cli_plan(tmp_path, capsys):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    png = tmp_path / "plan.png"
    assert cli_main(["plan", "--model", path, "--vram-budget", f"{FULL}B", "--ctx", "100", "--batch", "4",
                     "--png", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device_bytes"] == FULL and [L["n_hot"] for L in out["layers"]] == [128, 128]
    assert out["bytes_by_category"]["kv_cache"] == 2 * 16384
    if out["png"]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli_main(["plan", "--model", path, "--vram-budget", "60KiB", "--ctx", "100", "--batch", "4",
                     "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "vram budget 61440 B" in text and text.count("\n") >= 5 and "KV cache: split" in text
    user = tmp_path / "mine.png"
    user.write_bytes(b"USER DATA")
    argv = ["plan", "--model", path, "--vram-budget", f"{FULL}B", "--ctx", "100", "--batch", "4", "--png", str(user)]
    if out["png"]:  # matplotlib present: a file that is not our plot is kept unless --force
        assert cli_main(argv) == 2 and user.read_bytes() == b"USER DATA"
        assert "Refusing to overwrite" in capsys.readouterr().err
        assert cli_main(argv + ["--force"]) == 0 and user.read_bytes()[:4] == b"\x89PNG"
        assert cli_main(argv) == 0  # our own plot may be replaced
        capsys.readouterr()
    assert cli_main(["plan", "--model", path, "--vram-budget", "-3"]) == 2
    assert "vram_budget must be >= 0" in capsys.readouterr().err
