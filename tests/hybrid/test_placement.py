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
from powerinfer_backend.cli import main as cli_main
from powerinfer_backend.loader import load_gguf

from tests.fixtures.tiny_gguf import write_tiny_llama

F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30

# the tiny model below, worked out by hand with ggml's CPU buffer rule (P.CPU_BUFT: a
# tensor takes ggml_nbytes rounded up to 32; Q8_0 row of 64 = 2 blocks x 34 B = 68 B):
#   attention block: attn_norm 256 + q 4352 + k 2176 + v 2176 + out 4352 + ffn_norm 256
#   = 13568, + KV for n_ctx 100 (128 cells x 32 x F16, K and V: 2 x 8192) 16384
ATTN_BLOCK = 13568 + 16384
#   all 128 neurons (a whole FFN, as stored): gate [64, 128] Q8_0 8704 + up 8704 + down
#   [128, 64] Q8_0 8704; fewer are gathered, their down columns Q8_0 [n_hot rounded up to
#   32, 64] (68 B per neuron, in blocks of 32 neurons: 2176 B)
HOT_ALL = 26112
#   output_norm 256 + tied embedding 4352 (the logits are in the compute buffer)
OUTPUT = 4608
#   compute estimate, n_batch 4: 4 B x 4 tokens x (3 x 64 + 2 x 64 + 2 x 32 + 2 x 128
#   + 2 x 4 heads x 128 cells + 64 vocab) = 16 x 1728
COMPUTE = 27648
FULL = COMPUTE + 2 * (ATTN_BLOCK + HOT_ALL) + OUTPUT  # 144384


def test_byte_accounting_is_exact(tiny_sizes):
    _, s = tiny_sizes
    assert P.kv_bytes_per_layer(s, 100) == 16384 and P.kv_bytes_per_layer(s, 128) == 16384
    assert P.kv_bytes_per_layer(s, 129) == 24576  # 192 cells: one more KV_PAD block of 64
    assert P.attn_block_bytes(s, 0, 100) == ATTN_BLOCK == 29952
    # one neuron: gate 68 -> 96, up 68 -> 96, down columns Q8_0 [32, 64]: one block of 32 per row
    assert P.hot_bytes(s, 0, 128) == HOT_ALL and P.hot_bytes(s, 0, 1) == 96 + 96 + 2176 and P.hot_bytes(s, 0, 0) == 0
    assert P.hot_bytes(s, 0, 127) == 2 * 8640 + 8704  # gathered: Q8_0 down columns [128, 64]
    assert P.neuron_bytes(s, 1) == (68, 68, 68)
    assert P.down_cols(s, 0, 33) == (Q8_0, 64)
    assert P.output_block_bytes(s, 4) == OUTPUT
    assert P.compute_bytes(s, 100, 4) == COMPUTE
    assert P.full_device_bytes(s, 100, 4) == FULL == 144384


class _PaddedRows:
    """A sizer as ggml's CUDA buffer type counts: quantized tensors padded by one row
    of 512 elements' bytes when ne0 is not a multiple of 512, alignment 128."""

    name, alignment, exact = "padded", 128, True

    def tensor_bytes(self, t, ne0, ne1=1):
        pad = P.row_bytes(t, 512 - ne0 % 512) if t not in (0, 1) and ne0 % 512 else 0
        return P.row_bytes(t, ne0) * ne1 + pad

    def compute_bytes(self, sizes, n_ctx, n_batch):
        return 1000


def test_sizer_decides_every_byte(tiny_sizes):
    """The plan counts what the sizer says: row padding and alignment of the device's
    buffer type, its compute buffer."""
    _, s = tiny_sizes
    z = _PaddedRows()
    q8_pad = 448 // 32 * 34  # 448 more Q8_0 elements
    assert P.tensor_device_bytes(s.layers[0]["attn_q"], z) == P.align_up(4352 + q8_pad, 128) == 4864
    assert P.kv_bytes_per_layer(s, 100, z) == 16384  # F16: no padding, 8192 is 128-aligned
    down = P.align_up(64 * 34 + 480 // 32 * 34, 128)  # Q8_0 [32, 64], each row padded by 480 elements
    assert P.hot_bytes(s, 0, 1, z) == 2 * P.align_up(68 + q8_pad, 128) + down
    assert P.compute_bytes(s, 100, 4, z) == 1000
    full = P.full_device_bytes(s, 100, 4, z)
    p = P.plan_placement(s, None, full, n_ctx=100, n_batch=4, sizer=z)
    assert p.device_bytes == full and p.compute_bytes == 1000 and p.hot_fraction == 1.0
    assert p.buffer_bytes() == {"weights": full - 1000 - 2 * 16384, "kv": 2 * 16384, "compute": 1000}


def test_full_zero_and_below_compute(tiny_sizes):
    _, s = tiny_sizes
    full = P.plan_placement(s, None, FULL, n_ctx=100, n_batch=4)
    assert full.device_bytes == FULL and full.kv_location == "device" and full.output_on_device
    assert [L.n_hot for L in full.layers] == [128, 128] and full.hot_fraction == 1.0
    assert full.bytes_by_category() == {
        "compute": COMPUTE,
        "attention": 2 * 13568,
        "kv_cache": 2 * 16384,
        "output": OUTPUT,
        "ffn_hot": 2 * HOT_ALL,
        "free": 0,
    }
    assert full.buffer_bytes() == {"weights": 2 * (13568 + HOT_ALL) + OUTPUT, "kv": 2 * 16384, "compute": COMPUTE}
    for budget in (0, COMPUTE - 1):
        p = P.plan_placement(s, None, budget, n_ctx=100, n_batch=4)
        assert p.device_bytes == 0 and p.kv_location == "cpu" and not p.output_on_device
        assert all(L.n_hot == 0 for L in p.layers)
    # one byte short of everything: dense blocks come first, and layer 1's FFN is gathered,
    # its down columns Q8_0 (68 B per neuron as the whole FFN's, in blocks of 32): 127 neurons
    # fit in 26111 B (gate and up 127 x 68 = 8636 -> 8640, down [128, 64] Q8_0 8704)
    p = P.plan_placement(s, None, FULL - 1, n_ctx=100, n_batch=4)
    assert P.hot_bytes(s, 1, 127) == 2 * 8640 + 8704 == 25984
    assert p.device_bytes == FULL - HOT_ALL + 25984 and p.output_on_device
    assert [L.n_hot for L in p.layers] == [128, 127] and p.kv_location == "device"


def test_dense_first_then_hot_by_frequency(tiny_sizes):
    _, s = tiny_sizes
    freq = np.zeros((2, 128))
    freq[1, [5, 77, 100]] = 0.9  # the most frequent neurons are in layer 1
    freq[0, 3] = 0.5
    base = COMPUTE + 2 * ATTN_BLOCK + OUTPUT
    # 3 hot neurons: gate 3 x 68 = 204 -> 224, up 224, down Q8_0 [32, 64] 2176; 4: 288 + 288 + 2176
    assert P.hot_bytes(s, 1, 3) == 2624 and P.hot_bytes(s, 1, 4) == 2752
    p = P.plan_placement(s, freq, base + 2624, n_ctx=100, n_batch=4)
    assert p.kv_location == "device" and p.output_on_device
    assert p.layers[1].hot_ids.tolist() == [5, 77, 100] and p.layers[0].n_hot == 0
    assert p.device_bytes == base + 2624 and p.layers[1].freq_mass == 1.0
    # room for two groups of 32: layer 1's first group, then layer 0's (mean 0.5/32 > 0)
    g32 = P.hot_bytes(s, 0, 32)
    assert g32 == 2176 + 2176 + 2176
    p = P.plan_placement(s, freq, base + 2 * g32, n_ctx=100, n_batch=4)
    assert [L.n_hot for L in p.layers] == [32, 32] and p.device_bytes == base + 2 * g32
    assert {5, 77, 100} <= set(p.layers[1].hot_ids.tolist())
    # layer 0 ranks id 3 first, then the zeros by id: 0, 1, 2, 4, ..., 31
    assert p.layers[0].hot_ids.tolist() == list(range(32))
    # no room for the compute buffer: nothing at all, even with hot neurons ready
    assert P.plan_placement(s, freq, COMPUTE - 1, n_ctx=100, n_batch=4).device_bytes == 0


def test_disable_gpu_index(tiny_sizes):
    _, s = tiny_sizes
    p = P.plan_placement(s, None, FULL, n_ctx=100, n_batch=4, disable_gpu_index=True)
    assert all(L.n_hot == 0 for L in p.layers) and p.device_bytes == COMPUTE + 2 * ATTN_BLOCK + OUTPUT


def test_bad_inputs(tiny_sizes):
    _, s = tiny_sizes
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
        layers.append(
            {
                "attn_norm": P.TensorSize(F32, (n_embd,)),
                "attn_q": mat(n_embd, n_embd),
                "attn_k": mat(n_embd, n_head_kv * head),
                "attn_v": mat(n_embd, n_head_kv * head),
                "attn_out": mat(n_embd, n_embd),
                "ffn_norm": P.TensorSize(F32, (n_embd,)),
                "ffn_gate": mat(n_embd, n_ff),
                "ffn_up": mat(n_embd, n_ff),
                "ffn_down": mat(n_ff, n_embd),
            }
        )
    s = P.ModelSizes(
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head,
        n_vocab,
        tuple(layers),
        P.TensorSize(F32, (n_embd,)),
        mat(n_embd, n_vocab),
    )
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
@given(model_sizes(), st.floats(0, 1.2), st.integers(1, 3000), st.integers(1, 64), st.booleans(), st.booleans())
def test_plan_never_exceeds_budget(sf, frac, n_ctx, n_batch, disable, padded):
    s, f = sf
    z = _PaddedRows() if padded else P.CPU_BUFT
    full = P.full_device_bytes(s, n_ctx, n_batch, z)
    budget = int(full * frac)
    p = P.plan_placement(s, f, budget, n_ctx=n_ctx, n_batch=n_batch, disable_gpu_index=disable, sizer=z)
    assert p.device_bytes <= budget
    # the total is the sum of its parts, recomputed from the byte functions
    want = (P.compute_bytes(s, n_ctx, n_batch, z) if p.device_bytes else 0) + (
        P.output_block_bytes(s, n_batch, z) if p.output_on_device else 0
    )
    for L in p.layers:
        want += (P.attn_block_bytes(s, L.layer, n_ctx, z) if L.attn_on_device else 0) + P.hot_bytes(
            s, L.layer, L.n_hot, z
        )
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
        np.array_equal(a.hot_ids, b.hot_ids) for a, b in zip(p.layers, q.layers)
    )


# ---- vram_budget and n_gpu_layers ------------------------------------------------------


@pytest.mark.parametrize(
    "value,want",
    [
        (None, None),
        (0, 0),
        (8, 8 << 30),
        (0.5, 1 << 29),
        ("8", 8 << 30),
        ("8GiB", 8 << 30),
        ("8 gib", 8 << 30),
        ("512MiB", 512 << 20),
        ("512M", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("100B", 100),
        ("2KiB", 2048),
        ("1e-3", int(1e-3 * (1 << 30))),
        (np.int64(2), 2 << 30),
    ],
)
def test_parse_vram_budget(value, want):
    assert P.parse_vram_budget(value) == want


@pytest.mark.parametrize(
    "value", [-1, -0.5, "-1GiB", "abc", "8 parsecs", "", float("nan"), float("inf"), True, [8], "nan"]
)
def test_parse_vram_budget_rejects(value):
    with pytest.raises(ValueError, match="vram_budget"):
        P.parse_vram_budget(value)


def test_resolve_budget_rules(tiny_sizes):
    _, s = tiny_sizes
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
        assert P.resolve_budget(None, 1, s, free_bytes=1 << 30, **kw).bytes == COMPUTE + layer
        assert P.resolve_budget(None, 2, s, free_bytes=1 << 30, **kw).bytes == COMPUTE + 2 * layer
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
    # another device (the sizer's name, alignment, compute bytes): recomputed with its bytes
    z = _PaddedRows()
    pz = P.plan_for_model(path, FULL, n_ctx=100, n_batch=4, sizer=z)
    assert not pz.cached and pz.inputs["device"] == "padded" and pz.inputs["align"] == 128
    assert pz.compute_bytes == 1000 and P.plan_for_model(path, FULL, n_ctx=100, n_batch=4, sizer=z).cached
    assert not P.plan_for_model(path, FULL, n_ctx=100, n_batch=4).cached
    p4 = P.plan_for_model(path, FULL, n_ctx=100, n_batch=4, disable_gpu_index=True)
    assert not p4.cached and p4.hot_fraction == 0.0
    freq = np.zeros((2, 128), np.float32)
    freq[0, :7] = 1
    p5 = P.plan_for_model(path, COMPUTE + 2 * ATTN_BLOCK + OUTPUT + 4 * 1024, n_ctx=100, n_batch=4, neuron_freq=freq)
    assert p5.inputs["freq_source"].startswith("array:") and p5.layers[0].hot_ids.tolist()[:7] == list(range(7))
    # a plan recorded for another model is not overwritten without reset_gpu_index
    d = json.loads(p5.path.read_text())
    d["model_fingerprint"] = "0" * 64
    p5.path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="Refusing to overwrite artifact"):
        P.plan_for_model(path, 0, n_ctx=100, n_batch=4)
    assert not P.plan_for_model(path, 0, n_ctx=100, n_batch=4, reset_gpu_index=True).cached
    assert sorted(os.listdir(p5.path.parent)) == ["placement.json"]  # atomic writes leave no temporaries


def test_cli_plan(tmp_path, xdg_cache, capsys):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    png = tmp_path / "plan.png"
    assert (
        cli_main(
            [
                "plan",
                "--device",
                "cpu",
                "--model",
                path,
                "--vram-budget",
                f"{FULL}B",
                "--ctx",
                "100",
                "--batch",
                "4",
                "--png",
                str(png),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["device_bytes"] == FULL and [L["n_hot"] for L in out["layers"]] == [128, 128]
    assert out["bytes_by_category"]["kv_cache"] == 2 * 16384
    if out["png"]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        cli_main(
            [
                "plan",
                "--device",
                "cpu",
                "--model",
                path,
                "--vram-budget",
                "60KiB",
                "--ctx",
                "100",
                "--batch",
                "4",
                "--no-plot",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "vram budget 61440 B" in text and text.count("\n") >= 5 and "KV cache: split" in text
    user = tmp_path / "mine.png"
    user.write_bytes(b"USER DATA")
    argv = [
        "plan",
        "--device",
        "cpu",
        "--model",
        path,
        "--vram-budget",
        f"{FULL}B",
        "--ctx",
        "100",
        "--batch",
        "4",
        "--png",
        str(user),
    ]
    if out["png"]:  # matplotlib present: a file that is not our plot is kept unless --force
        assert cli_main(argv) == 2 and user.read_bytes() == b"USER DATA"
        assert "Refusing to overwrite" in capsys.readouterr().err
        assert cli_main(argv + ["--force"]) == 0 and user.read_bytes()[:4] == b"\x89PNG"
        assert cli_main(argv) == 0  # our own plot may be replaced
        capsys.readouterr()
    assert cli_main(["plan", "--device", "cpu", "--model", path, "--vram-budget", "-3"]) == 2
    assert "vram_budget must be >= 0" in capsys.readouterr().err


def test_cli_plan_counts_with_the_device(tmp_path, xdg_cache, capsys):
    """--device ggml-cpu: the CPU device's own byte rule and compute buffer (a context
    measures it), recorded in the plan's inputs; the default without a GPU: CPU_BUFT."""
    from powerinfer_backend.engine.native import NativeContext, NativeModel
    from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device

    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    argv = ["plan", "--model", path, "--vram-budget", "1GiB", "--ctx", "100", "--batch", "4", "--no-plot", "--json"]
    assert cli_main(argv + ["--device", "ggml-cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    ctx = NativeContext(m, n_ctx=100, n_batch=4, n_threads=1)
    with open_device(resolve_device("ggml-cpu")) as dev:
        compute = ctx.ggml_compute_bytes(dev)
        full = P.full_device_bytes(P.ModelSizes.from_gguf(g), 100, 4, DeviceSizer(dev, ctx))
    ctx.close()
    m.close()
    assert (out["inputs"]["device"], out["inputs"]["align"], out["compute_bytes"]) == ("CPU", 32, compute)
    assert out["device_bytes"] == full == FULL - COMPUTE + compute  # only the compute buffer was estimated
    assert out["runtime_reserve"] == 0 and out["budget_bytes"] == 2**30  # ggml's CPU backend: nothing set aside
    assert cli_main(argv + ["--device", "cpu", "--layer-split"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device_bytes"] == FULL and out["compute_bytes"] == COMPUTE  # CPU_BUFT
    assert cli_main(argv + ["--device", "Vulkan9"]) == 2
    assert "no device named 'Vulkan9'" in capsys.readouterr().err
