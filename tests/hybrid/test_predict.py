"""Decode throughput predicted from a plan (powerinfer_backend/hybrid/placement/predict.py):
bytes and seconds exactly on a hand-computed tiny case, llama.cpp's layer split at the
budget edges, monotonicity in the budget, bad inputs, the host bandwidth measurement and
`powerinfer-backend plan --predict`."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from powerinfer_backend.cli import main as cli_main
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.placement import predict as pr
from powerinfer_backend.loader import load_gguf

from tests.fixtures import ROOT
from tests.fixtures.tiny_gguf import write_tiny_llama

sys.path.insert(0, str(ROOT / "bench"))
from predict_paper import Q4_0, SHAPES, paper_sizes

# the tiny Q8_0 model (n_embd 64, n_ff 128, 4 heads, 2 KV heads, tied embedding of 64
# tokens), bytes as stored (no alignment: these are bytes read, not allocated):
#   attention weights: attn_norm 256 + q 64 x 68 + k 32 x 68 + v 32 x 68 + out 64 x 68 + ffn_norm 256
ATTN_W = 256 + 4352 + 2176 + 2176 + 4352 + 256  # 13568
#   one neuron's rows: gate 68 (2 Q8_0 blocks), up 68, down 68: a Q8_0 column of 64 on the
#   device (34 B per 32 neurons per row), the CPU-only engine's Q8_0 down_t row on the host
ROW = HOST_ROW = (68, 68, 68)
#   GGUF FFN tensors: gate 8704 + up 8704 + down (64 rows of 128 Q8_0 = 136 B) 8704
FFN_GGUF = 3 * 8704
OUT = 256 + 4352  # output_norm + tied embedding


def _plan(attn_on, hot, output_on=False, n_ff=128):
    layers = [
        P.LayerPlan(i, a, 1 if a else 0, 0, np.asarray(h, np.int32), 0, 0.0)
        for i, (a, h) in enumerate(zip(attn_on, hot))
    ]
    return P.Plan(10**9, 100, 4, n_ff, 0, output_on, 1 if output_on else 0, layers)


def test_row_and_block_bytes(tiny_sizes, tmp_path):
    _, s = tiny_sizes
    assert pr.attn_weight_bytes(s, 0) == ATTN_W == 13568
    assert pr.ffn_row_bytes(s, 1, device=True) == ROW
    assert pr.ffn_row_bytes(s, 1) == pr.ffn_row_bytes(s, 1, split=False) == HOST_ROW  # CPU-only's down_t: Q8_0
    # an all-F32 model: the CPU's down_t stays F32, the device's down columns are F16 (unquantized)
    m = load_gguf(write_tiny_llama(tmp_path / "f32.gguf", types={"matrix": 0, "token_embd": 0}), verbose=False)
    s32 = P.ModelSizes.from_gguf(m)
    m.close()
    assert pr.ffn_row_bytes(s32, 0) == (256, 256, 256) and pr.ffn_row_bytes(s32, 0, device=True) == (256, 256, 128)


def test_ours_bytes_and_times_exact(tiny_sizes):
    _, s = tiny_sizes
    freq = np.empty((2, 128))
    freq[0, :32], freq[0, 32:], freq[1] = 1.0, 0.25, 0.5
    # layer 0: attention and neurons 0..31 on the device; layer 1 and the output on the host
    plan = _plan([True, False], [np.arange(32), []])
    p = pr.predict_ours(s, plan, freq, device_gbps=10, host_gbps=1, mode="relu")
    L0, L1 = p.layers
    assert L0.attn_bytes == L1.attn_bytes == ATTN_W
    assert L0.device_ffn_bytes == 32 * sum(ROW) == 6528  # all hot rows (a dense mul_mat over them)
    # relu: every cold gate row (96 x 68), up and down rows only when firing (96 x 0.25 = 24)
    assert L0.host_ffn_bytes == 96 * 68 + 24 * 68 + 24 * 68 == 9792
    # layer 1 has no neuron on the device: the CPU-only engine's FFN, its down_t Q8_0 (68 B)
    assert L1.device_ffn_bytes == 0 and L1.host_ffn_bytes == 128 * 68 + 64 * 68 + 64 * 68 == 17408
    assert L0.t == pytest.approx(13568 / 10e9 + max(6528 / 10e9, 9792 / 1e9), rel=1e-12)
    assert L1.t == pytest.approx((13568 + 17408) / 1e9, rel=1e-12)
    assert p.t_output == pytest.approx(OUT / 1e9, rel=1e-12) and p.output_bytes == OUT
    assert p.seconds_per_token == pytest.approx(4.67328e-5, rel=1e-12)
    assert p.tok_s == pytest.approx(1 / 4.67328e-5, rel=1e-12)
    assert p.device_bytes_read == 13568 + 6528 and p.host_bytes_read == 9792 + 13568 + 17408 + OUT
    # the device skipping rows as the host does; KV read at 10 positions (2 x 10 x 32 x F16); sync
    q = pr.predict_ours(
        s, plan, freq, device_gbps=10, host_gbps=1, mode="relu", device_skips=True, n_past=10, sync_s=1e-6
    )
    assert q.layers[0].device_ffn_bytes == 32 * sum(ROW)  # frequency 1.0: every row still read
    assert q.layers[0].attn_bytes == ATTN_W + 1280
    assert q.layers[0].t == pytest.approx((ATTN_W + 1280) / 10e9 + 9792 / 1e9 + 1e-6, rel=1e-12)
    assert q.layers[1].t == pytest.approx((ATTN_W + 1280 + 17408) / 1e9, rel=1e-12)  # host only: no sync


@pytest.mark.parametrize(
    "mode,cold_bytes",
    [("dense", 96 * 204), ("relu", 96 * 68 + 24 * 136), ("threshold", 96 * 136 + 24 * 68), ("predictor", 24 * 204)],
)
def test_modes(tiny_sizes, mode, cold_bytes):
    _, s = tiny_sizes
    freq = np.full((2, 128), 0.25)
    plan = _plan([False, False], [np.arange(32), np.arange(32)])
    p = pr.predict_ours(s, plan, freq, device_gbps=100, host_gbps=1, mode=mode, predictor_bytes=1000)
    extra = 1000 if mode == "predictor" else 0
    assert [L.host_ffn_bytes for L in p.layers] == [cold_bytes + extra] * 2


def test_threshold_cpu_only_layer_reads_the_cheaper_down(tmp_path):
    """A layer with no device neuron in mode threshold: gate and up rows, and the down as the
    engine runs it: the kept Q8_0 down_t rows (68 B each at n_embd 64), or the GGUF's Q4_1
    ffn_down (64 rows of 128 = 5120 B) where those read more. Q4_1 gate/up rows: 40 B."""
    m = load_gguf(write_tiny_llama(tmp_path / "q41.gguf", n_layer=2, n_ff=128, types={"matrix": 3}), verbose=False)
    s = P.ModelSizes.from_gguf(m)
    m.close()
    plan = _plan([False, False], [[], []])
    for f, down in ((0.5, 64 * 68), (0.9, 5120)):  # 0.9 x 128 x 68 = 7833.6 > 5120
        p = pr.predict_ours(s, plan, np.full((2, 128), f), device_gbps=1, host_gbps=1, mode="threshold")
        assert p.layers[0].host_ffn_bytes == pytest.approx(2 * 128 * 40 + down)


def test_dense_cpu_only_reads_gguf_tensors(tiny_sizes):
    _, s = tiny_sizes
    plan = P.plan_placement(s, None, 0, n_ctx=100, n_batch=4)
    p = pr.predict_ours(s, plan, None, device_gbps=5, host_gbps=5, mode="dense")
    assert p.host_bytes_read == 2 * (ATTN_W + FFN_GGUF) + OUT and p.device_bytes_read == 0
    split = pr.predict_layer_split(s, 0, device_gbps=5, host_gbps=5, n_ctx=100, n_batch=4)
    assert split.n_gpu_layers == 0 and split.seconds_per_token == pytest.approx(p.seconds_per_token, rel=1e-12)


def test_layer_split_edges(tiny_sizes):
    _, s = tiny_sizes
    scratch = P.scratch_bytes(s, 100, 4)
    layer = ATTN_W + FFN_GGUF + P.kv_bytes_per_layer(s, 100)  # 39680 + 16384
    out_block = OUT + 4 * 64 * 4
    assert pr.llama_cpp_offload(s, scratch + layer - 1, n_ctx=100, n_batch=4) == (0, False)
    assert pr.llama_cpp_offload(s, scratch + layer, n_ctx=100, n_batch=4) == (1, False)
    assert pr.llama_cpp_offload(s, scratch + 2 * layer + out_block - 1, n_ctx=100, n_batch=4) == (2, False)
    assert pr.llama_cpp_offload(s, scratch + 2 * layer + out_block, n_ctx=100, n_batch=4) == (2, True)
    p = pr.predict_layer_split(s, scratch + layer, device_gbps=10, host_gbps=1, n_ctx=100, n_batch=4)
    assert [L.attn_on_device for L in p.layers] == [False, True]  # the last layer first, as -ngl
    assert p.seconds_per_token == pytest.approx(39680 / 1e9 + 39680 / 10e9 + OUT / 1e9, rel=1e-12)


def test_layer_split_monotone_in_budget(tiny_sizes):
    """More budget never predicts fewer tok/s for the layer split (a layer moves to the faster memory)."""
    _, s = tiny_sizes
    last = 0.0
    for budget in np.linspace(0, P.full_device_bytes(s, 100, 4), 41).astype(int):
        split = pr.predict_layer_split(s, int(budget), device_gbps=20, host_gbps=1, n_ctx=100, n_batch=4)
        assert split.tok_s >= last * (1 - 1e-12), budget
        last = split.tok_s


@pytest.mark.parametrize("wtype", [1, 8])  # F16, Q8_0
def test_ours_monotone_once_dense_placed_with_a_fast_device(tmp_path, wtype):
    """Once the dense blocks are all placed more budget only adds hot rows; with a device
    so fast that its half never limits a layer, each one removes host bytes: never slower
    (a split layer's host rows are the CPU-only engine's, F16 or Q8_0 down_t)."""
    m = load_gguf(write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128, types={"matrix": wtype}), verbose=False)
    s = P.ModelSizes.from_gguf(m)
    m.close()
    assert s.cpu_down_t_type == s.down_t_type == ("f16" if wtype == 1 else "q8_0")
    freq = np.clip(np.random.default_rng(0).pareto(1.5, (2, 128)) / 4, 0.2, 1.0)
    full = P.full_device_bytes(s, 100, 4)
    last, n = 0.0, 0
    for budget in np.linspace(0, full, 81).astype(int):
        plan = P.plan_placement(s, freq, int(budget), n_ctx=100, n_batch=4)
        if not (plan.output_on_device and all(L.attn_on_device for L in plan.layers)):
            continue
        ours = pr.predict_ours(s, plan, freq, device_gbps=1e6, host_gbps=1, mode="relu")
        assert ours.tok_s >= last * (1 - 1e-12), budget
        last, n = ours.tok_s, n + 1
    assert n >= 10


@pytest.mark.parametrize("wtype", [8, 3, 1, "7b"])  # Q8_0, Q4_1 (ffn_down cheaper than Q8_0 rows), F16, 7B Q4_0
def test_split_host_reads_no_more_than_cpu_only(tmp_path, wtype):
    """A split layer's host bytes (its cold neurons) never exceed the same layer's CPU-only
    bytes in the same mode, for every number of hot neurons (the most frequent first) and
    frequency profile: the host rows are the CPU-only engine's, their down over ffn_down
    where the cold rows would read more (modes dense and threshold, as CPU-only; a dense
    layer's whole down on the host where its cold down_t rows would read more; a sparse mode's
    layers keep their down_t, ``sparse_ffn``)."""
    if wtype == "7b":  # LLaMA-2-7B's shapes, no file (bench/predict_paper.py)
        s = paper_sizes(*SHAPES["LLaMA(ReLU)-2-7B"], wtype=Q4_0)
    else:
        m = load_gguf(
            write_tiny_llama(tmp_path / "m.gguf", n_layer=1, n_ff=128, types={"matrix": wtype}), verbose=False
        )
        s = P.ModelSizes.from_gguf(m)
        m.close()
    b, n_ff = pr.LayerBytes.of(s, 0), s.n_ff
    assert b.host_rows == b.cpu_rows
    skewed = np.sort(np.random.default_rng(1).uniform(0.0, 1.0, n_ff))[::-1]
    for freq in (np.ones(n_ff), np.full(n_ff, 0.9), skewed, np.full(n_ff, 0.05)):
        for mode in pr.MODES:

            def host(n_hot, freq=freq, mode=mode):
                return pr.layer_time(
                    pr.LayerBytes.of(s.for_mode(mode), 0),
                    0,
                    n_ff=n_ff,
                    attn_on=False,
                    n_hot=n_hot,
                    hot_fsum=float(freq[:n_hot].sum()),
                    cold_fsum=float(freq[n_hot:].sum()),
                    bd=1e9,
                    bh=1e9,
                    mode=mode,
                    predictor_bytes=100,
                ).host_ffn_bytes

            cpu = host(0)
            steps = range(1, n_ff + 1, max(1, n_ff // 128))
            assert all(host(n) <= cpu * (1 + 1e-12) for n in steps), (mode, freq[:4], cpu)


def test_more_hot_rows_can_be_slower(tiny_sizes):
    """The halves overlap (max): once a layer is device-bound, more hot rows make it slower.
    Layer 0 with 112 hot rows: device (112 x 204 + 16 zero down columns x 68) B / 20 GB/s =
    1.1968 us, host 16 gate rows + 16 x 0.05 x (68 + 68) B / 1 GB/s = 1.1968 us; 127 hot:
    (127 x 204 + 68) B / 20 GB/s = 1.2988 us. All 128 are the whole FFN as stored, its down
    Q8_0 as the gathered columns: 26112 B / 20 GB/s = 1.3056 us."""
    _, s = tiny_sizes
    freq = np.full((2, 128), 0.05)
    t = [
        pr.predict_ours(
            s, _plan([False, False], [np.arange(n), []]), freq, device_gbps=20, host_gbps=1, mode="relu"
        ).layers[0]
        for n in (112, 127, 128)
    ]
    assert t[0].t_ffn_device == pytest.approx(1.1968e-6) and t[0].t_ffn_host == pytest.approx(1.1968e-6)
    assert t[1].t_ffn_device == pytest.approx(1.2988e-6) and t[1].t > t[0].t
    assert t[2].t_ffn_device == pytest.approx(1.3056e-6) and t[2].t_ffn_host == 0 and t[2].t > t[1].t


def test_bad_inputs(tiny_sizes):
    _, s = tiny_sizes
    plan = _plan([False, False], [[], []])
    for kw in ({"device_gbps": 0}, {"host_gbps": -1}, {"device_gbps": float("nan")}, {"host_gbps": True}):
        args = dict(device_gbps=1, host_gbps=1, mode="dense") | kw
        with pytest.raises(ValueError, match="gbps must be a finite bandwidth"):
            pr.predict_ours(s, plan, None, **args)
    for kw, what in (
        ({"n_past": -1}, "n_past must be an integer >= 0"),
        ({"sync_s": -1e-6}, "sync_s must be"),
        ({"predictor_bytes": 1.5}, "predictor_bytes must be an integer"),
    ):
        with pytest.raises(ValueError, match=what):
            pr.predict_ours(s, plan, None, device_gbps=1, host_gbps=1, mode="dense", **kw)
    with pytest.raises(ValueError, match="n_past must be an integer >= 0"):
        pr.predict_layer_split(s, 0, device_gbps=1, host_gbps=1, n_ctx=100, n_batch=4, n_past=-2)
    with pytest.raises(ValueError, match="mode must be one of"):
        pr.predict_ours(s, plan, None, device_gbps=1, host_gbps=1, mode="sparse")
    with pytest.raises(ValueError, match="plan has 2 layers of n_ff 64"):
        pr.predict_ours(s, _plan([False, False], [[], []], n_ff=64), None, device_gbps=1, host_gbps=1, mode="dense")
    with pytest.raises(ValueError, match="neuron_freq must"):
        pr.predict_ours(s, plan, np.full((2, 128), 2.0), device_gbps=1, host_gbps=1, mode="relu")
    with pytest.raises(ValueError, match="nbytes must be >= 1 MiB"):
        pr.measure_host_bandwidth(nbytes=1000)


def test_default_mode():
    assert pr.default_mode("silu", has_sidecar=False, has_predictors=False) == "dense"
    assert pr.default_mode("silu", has_sidecar=True, has_predictors=False) == "threshold"
    assert pr.default_mode("relu", has_sidecar=False, has_predictors=False) == "relu"
    assert pr.default_mode("drelu", has_sidecar=True, has_predictors=False) == "threshold"
    assert pr.default_mode("relu", has_sidecar=True, has_predictors=True) == "predictor"


def test_host_bandwidth_is_plausible():
    gbps = pr.measure_host_bandwidth(nbytes=64 << 20, n_threads=2, repeats=2)
    assert 0.2 < gbps < 2000  # a DRAM-class bandwidth in GB/s, not bytes or seconds


def test_cli_plan_predict(tmp_path, xdg_cache, capsys):
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    base = ["plan", "--model", path, "--vram-budget", "0", "--ctx", "100", "--batch", "4", "--no-plot", "--predict"]
    assert cli_main(base) == 2
    assert "--predict needs --device-bandwidth" in capsys.readouterr().err
    assert cli_main(base + ["--device-bandwidth", "4", "--host-bandwidth", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["prediction"]
    want = 1 / ((2 * (ATTN_W + FFN_GGUF) + OUT) / 2e9)  # nothing placed: both engines read the file densely
    assert d["ours"]["tok_s"] == pytest.approx(want) and d["layer_split"]["tok_s"] == pytest.approx(want)
    assert d["ratio"] == pytest.approx(1.0) and d["host_bandwidth_measured"] is False
    with pytest.raises(SystemExit, match="2"):  # a usage error now, before the model loads
        cli_main(base + ["--device-bandwidth", "4", "--host-bandwidth", "0"])
    assert "--host-bandwidth must be a finite number > 0, got 0" in capsys.readouterr().err
    assert cli_main(base[:4] + ["100KiB"] + base[5:] + ["--device-bandwidth", "50", "--host-bandwidth", "5"]) == 0
    text = capsys.readouterr().out
    assert "ratio ours / layer split:" in text and "llama.cpp layer split" in text


def test_device_skips_in_predictor_mode(tiny_sizes):
    """The ggml device's skipping (``device_skips``, mode "predictor"): a split layer's device
    reads the gate and up rows of the hot neurons it selects (by frequency) and every down
    column, after the host has read the predictor; other modes and unsplit layers are as
    without it."""
    _, s = tiny_sizes
    freq = np.full((2, 128), 0.25)
    plan = _plan([False, False], [np.arange(32), np.arange(128)])
    kw = dict(device_gbps=0.1, host_gbps=1, mode="predictor", predictor_bytes=1000)
    every, skips = (pr.predict_ours(s, plan, freq, device_skips=d, **kw) for d in (False, True))
    assert every.layers[0].device_ffn_bytes == 32 * sum(ROW) == 6528
    assert skips.layers[0].device_ffn_bytes == 32 * 0.25 * (68 + 68) + 32 * 68 == 3264
    host = 96 * 0.25 * sum(HOST_ROW) + 1000  # the selected cold rows and the predictor
    assert every.layers[0].host_ffn_bytes == skips.layers[0].host_ffn_bytes == host
    assert every.layers[0].t == pytest.approx(ATTN_W / 1e9 + 6528 / 1e8, rel=1e-12)
    assert skips.layers[0].t == pytest.approx(ATTN_W / 1e9 + 1000 / 1e9 + max(3264 / 1e8, (host - 1000) / 1e9))
    assert skips.layers[1].t == every.layers[1].t  # every neuron on the device: no predictor first
    relu = [pr.predict_ours(s, plan, freq, **{**kw, "mode": "relu"}, device_skips=d) for d in (False, True)]
    assert relu[0].layers[0].t == relu[1].layers[0].t
    # where every hot neuron fires nothing is saved and the predictor comes first: slower
    ones = np.ones((2, 128))
    a, b = (pr.predict_ours(s, plan, ones, device_skips=d, **kw).tok_s for d in (False, True))
    assert b < a


@pytest.mark.parametrize(
    "freq_value,gbps,skips", [(0.1, 5.0, True), (1.0, 5.0, False), (0.25, 100.0, False), (0.25, 0.1, False)]
)
def test_auto_chooses_device_skips_where_predicted_faster(tiny_sizes, freq_value, gbps, skips):
    """``plan_auto`` keeps the device's skipping only where predicted faster for the winning
    plan: split layers bound by the device at a low firing frequency (skipping), every hot
    neuron firing (nothing saved: not), host-bound splits (not), nothing placed (not)."""
    _, s = tiny_sizes
    freq = np.full((2, 128), freq_value)
    budget = int(P.full_device_bytes(s, 64, 8) * 0.9)
    kw = dict(n_ctx=64, n_batch=8, device_gbps=gbps, host_gbps=1, mode="predictor", predictor_bytes=100)
    plan = P.plan_auto(s, freq, budget, **kw)
    c = plan.choice
    pk = {k: v for k, v in kw.items() if k not in ("n_ctx", "n_batch")}
    with_, without = (pr.predict_ours(s, plan, freq, device_skips=d, **pk).tok_s for d in (True, False))
    assert c["device_skips"] is skips and (with_ > without) is skips
    assert c["tok_s"][c["policy"]] == pytest.approx(max(with_, without), rel=1e-12)
    assert P.plan_auto(s, freq, budget, **{**kw, "mode": "relu"}).choice["device_skips"] is False
