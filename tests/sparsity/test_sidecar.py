"""The sparsity sidecar's file (sparsity/sidecar.py): what write_sidecar stores is what
read_sidecar returns, value for value and bit for bit (read with the loader's one GGUF
parser, loader/gguf_meta.py), and a damaged file is a ValueError naming it."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend.sparsity.predictors import PredictorSet
from powerinfer_backend.sparsity.sidecar import QUANTILES, SparsityProfile, read_sidecar, write_sidecar

N_LAYER, N_FF, N_EMBD, RANK, BINS = 3, 16, 8, 4, 5


def _profile() -> SparsityProfile:
    rng = np.random.default_rng(7)
    ps = PredictorSet(info={"density": [0.5, 0.25], "select": "density", "ppl_dense": 12.5})
    for layer in (0, 2):
        ps.fc1[layer] = rng.standard_normal((RANK, N_EMBD)).astype(np.float16)
        ps.fc2[layer] = rng.standard_normal((N_FF, RANK)).astype(np.float16)
        ps.thresholds[layer] = 0.125 * (layer + 1)
    return SparsityProfile(
        thresholds=rng.random(N_LAYER, dtype=np.float32),
        layer_sparsity=rng.random(N_LAYER, dtype=np.float32),
        neuron_freq=rng.random((N_LAYER, N_FF), dtype=np.float32),
        neuron_quantiles=rng.random((N_LAYER, N_FF, len(QUANTILES)), dtype=np.float32),
        layer_hist=rng.random((N_LAYER, BINS), dtype=np.float32),
        ffn_act="silu",
        info={
            "model_sha256": "ab" * 32,
            "model_file": "m\u00e9.gguf",
            "model_size": 1 << 33,
            "n_ctx": 64,
            "ppl_dense": 9.75,
            "method": "greedy",
        },
        predictors=ps,
    )


def test_round_trip_is_exact(tmp_path):
    prof = _profile()
    back = read_sidecar(write_sidecar(tmp_path / "s.gguf", prof))
    for name in ("thresholds", "layer_sparsity", "neuron_freq", "neuron_quantiles", "layer_hist"):
        got, want = getattr(back, name), getattr(prof, name)
        assert got.dtype == np.float32 and np.array_equal(got, want), name
    assert back.ffn_act == "silu" and back.info == prof.info
    ps, want = back.predictors, prof.predictors
    assert ps.layers == [0, 2] and ps.thresholds == want.thresholds
    assert ps.info == want.info
    for x in ps.layers:
        assert ps.fc1[x].dtype == np.float16 and np.array_equal(ps.fc1[x], want.fc1[x])
        assert ps.fc2[x].dtype == np.float16 and np.array_equal(ps.fc2[x], want.fc2[x])


def test_damaged_file_is_a_value_error_naming_it(tmp_path):
    good = write_sidecar(tmp_path / "s.gguf", _profile()).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[: good.index(b"powerinfer.calibration.thresholds") + 40])  # inside that array
    with pytest.raises(
        ValueError,
        match=rf"{cut}: truncated or corrupt GGUF header: reading key "
        r"'powerinfer\.calibration\.thresholds'",
    ):
        read_sidecar(cut)
    short = tmp_path / "short.gguf"
    short.write_bytes(good[:-4])  # the last tensor's data cut
    with pytest.raises(ValueError, match=rf"{short}: tensor 'blk\.2\.fc2\.weight' data .* runs past the end"):
        read_sidecar(short)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGML" + good[4:])
    with pytest.raises(ValueError, match=rf"{other}: not a GGUF file"):
        read_sidecar(other)
