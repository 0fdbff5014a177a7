"""Per-model artifact folder, atomic writes and provenance (powerinfer_backend.loader.artifacts),
and the transposed down-projection cache (powerinfer_backend.engine.down_cache).

Every test writes a tiny GGUF model into tmp_path and points XDG_CACHE_HOME at
tmp_path, so nothing outside the test folder is touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend.loader import artifacts

from powerinfer_backend.engine import down_cache
from powerinfer_backend.loader.artifacts import (
    artifact_dir,
    atomic_write,
    atomic_write_bytes,
    atomic_write_json,
    check_provenance,
    model_fingerprint,
)
from powerinfer_backend.engine.down_cache import (
    QuantizedDownT,
    build_down_cache,
    down_cache_path,
    down_t_dtype,
    load_down_cache,
    transposed_down,
)
from powerinfer_backend.loader import load_gguf

from tests.fixtures.tiny_gguf import write_tiny_llama

N_LAYER, N_EMBD, N_FF = 2, 64, 128


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _model(folder: Path, name: str = "tiny.gguf", down_type: int = GT.Q8_0, seed: int = 0) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return write_tiny_llama(
        folder / name, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, types={"ffn_down": down_type}, seed=seed
    )


# ---- fingerprint and folder ------------------------------------------------------------


def test_fingerprint_stable_and_content_sensitive(tmp_path):
    p = _model(tmp_path / "m")
    fp = model_fingerprint(p)
    assert fp == _sha(p) and len(fp) == 64
    assert model_fingerprint(Path(p)) == fp  # path-like, in-process cache
    st = os.stat(p)
    with open(p, "r+b") as f:  # flip one byte of the tensor data (end of file)
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    fp2 = model_fingerprint(p)
    assert fp2 != fp and fp2 == _sha(p)


def test_fingerprint_stored_for_the_next_process(tmp_path, xdg_cache, monkeypatch):
    """A new process (here: the in-process cache cleared) takes the stored SHA-256 without
    hashing the file again; any write to the file (a new ctime) makes it hash again."""
    p = _model(tmp_path / "m")
    store = xdg_cache / "powerinfer_backend" / "fingerprints"
    fp = model_fingerprint(p)
    assert not store.exists()  # a file changed in the last 2 s is not stored
    artifacts._fp_cache.clear()
    monkeypatch.setattr(artifacts, "_SETTLED_NS", 0)
    assert model_fingerprint(p) == fp
    stored = list(store.glob("*.json"))
    assert len(stored) == 1
    rec = json.loads(stored[0].read_text())
    assert rec["sha256"] == fp and rec["key"][0] == os.path.realpath(p)
    rec["sha256"] = "ab" * 32  # what only a read of the store can return
    stored[0].write_text(json.dumps(rec))
    artifacts._fp_cache.clear()
    assert model_fingerprint(p) == "ab" * 32
    time.sleep(0.05)  # past the ctime granularity
    with open(p, "r+b") as f:  # same bytes written back: the content is unchanged, the ctime is not
        b = f.read(1)
        f.seek(0)
        f.write(b)
    artifacts._fp_cache.clear()
    assert model_fingerprint(p) == fp == _sha(p)


def test_artifact_dir_beside_writable_folder(tmp_path, xdg_cache):
    p = _model(tmp_path / "m")
    d = artifact_dir(p)
    assert d == (tmp_path / "m" / "tiny.powerinfer").resolve() and d.is_dir()
    assert not xdg_cache.exists()


def test_artifact_dir_cache_when_not_beside(tmp_path, xdg_cache):
    p = _model(tmp_path / "m")
    d = artifact_dir(p, prefer_beside=False)
    assert d == xdg_cache / "powerinfer_backend" / model_fingerprint(p)[:16] and d.is_dir()
    assert not (tmp_path / "m" / "tiny.powerinfer").exists()
    assert artifact_dir(p, prefer_beside=False, create=False) == d


def test_artifact_dir_cache_default_home(tmp_path, monkeypatch):
    p = _model(tmp_path / "m")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    d = artifact_dir(p, prefer_beside=False, create=False)
    assert d == tmp_path / "home" / ".cache" / "powerinfer_backend" / model_fingerprint(p)[:16]


def test_artifact_dir_read_only_folder(tmp_path, xdg_cache):
    folder = tmp_path / "ro"
    p = _model(folder)
    os.chmod(folder, 0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip(
                "running as root: os.access reports a 0o555 folder writable "
                "(the cache path is covered by prefer_beside=False)"
            )
        d = artifact_dir(p)
        assert d == xdg_cache / "powerinfer_backend" / model_fingerprint(p)[:16]
        assert d.is_dir() and not (folder / "tiny.powerinfer").exists()
    finally:
        os.chmod(folder, 0o755)


def test_artifact_dir_unwritable_folder_simulated(tmp_path, xdg_cache, monkeypatch):
    """The same fallback when os.access says no (works as root too)."""
    folder = tmp_path / "ro"
    p = _model(folder)
    real_access = os.access

    def access(path, mode, *a, **k):
        if Path(path).resolve() in (folder.resolve(), (folder / "tiny.powerinfer").resolve()):
            return False
        return real_access(path, mode, *a, **k)

    monkeypatch.setattr(artifacts.os, "access", access)
    d = artifact_dir(p)
    assert d == xdg_cache / "powerinfer_backend" / model_fingerprint(p)[:16]
    assert d.is_dir() and not (folder / "tiny.powerinfer").exists()


def test_artifact_dir_installed_package_uses_cache(tmp_path, xdg_cache):
    """A model under site-packages (like the embedded default) never gets files beside it."""
    folder = tmp_path / "venv" / "lib" / "site-packages" / "llm_pkg"
    p = _model(folder)
    assert artifacts.in_installed_packages(p)
    d = artifact_dir(p)
    assert d == xdg_cache / "powerinfer_backend" / model_fingerprint(p)[:16]
    assert not (folder / "tiny.powerinfer").exists()
    assert not artifacts.in_installed_packages(_model(tmp_path / "m"))


def test_default_model_artifact_dir_is_cache(xdg_cache):
    from powerinfer_backend.loader.models import default_model_path

    try:
        p = default_model_path()
    except Exception as e:  # the embedded model package is not installed
        pytest.skip(f"no embedded model: {e}")
    assert artifacts.in_installed_packages(p)
    d = artifact_dir(p, create=False)  # costs one hash of the ~100 MB model (~0.1 s)
    assert d.parent == xdg_cache / "powerinfer_backend" and not d.exists()


def test_artifact_dir_missing_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        artifact_dir(tmp_path / "nope.gguf")


# ---- atomic writes --------------------------------------------------------------------


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    atomic_write_json(tmp_path / "b.json", {"x": 1})
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.json"]


def test_atomic_write_failure_keeps_old_content(tmp_path):
    target = tmp_path / "a.bin"
    atomic_write_bytes(target, b"old")

    def writer(f):
        f.write(b"half of the new")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        atomic_write(target, writer)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "fresh.bin", writer)
    assert os.listdir(tmp_path) == ["a.bin"]


# ---- provenance ---------------------------------------------------------------------------


def test_provenance(tmp_path, xdg_cache):
    a = _model(tmp_path / "a", seed=1)
    b = _model(tmp_path / "b", seed=2)
    fa, fb = model_fingerprint(a), model_fingerprint(b)
    assert fa != fb
    out = tmp_path / "calib.json"
    assert check_provenance(out, fa, force=False) is True  # nothing there yet
    atomic_write_json(out, artifacts.artifact_metadata(a, thresholds=[0.1]))
    assert artifacts.read_fingerprint(out) == fa
    assert check_provenance(out, fa, force=False, model_path=a) is True
    with pytest.raises(ValueError) as e:
        check_provenance(out, fb, force=False, model_path=b)
    msg = str(e.value)
    assert str(out) in msg and os.path.realpath(a) in msg and b in msg
    assert fa in msg and fb in msg and "force=True" in msg
    assert check_provenance(out, fb, force=True, model_path=b) is False
    atomic_write_json(out, artifacts.artifact_metadata(b, thresholds=[0.2]))
    assert artifacts.read_fingerprint(out) == fb

    # a binary artifact keeps its metadata in <name>.meta.json
    blob = tmp_path / "plan.bin"
    atomic_write_bytes(blob, b"plan")
    with pytest.raises(ValueError, match="unknown"):  # no metadata: provenance unknown
        check_provenance(blob, fa, force=False)
    atomic_write_json(artifacts.metadata_path(blob), artifacts.artifact_metadata(a))
    assert check_provenance(blob, fa, force=False) is True
    with pytest.raises(ValueError, match="plan.bin"):
        check_provenance(blob, fb, force=False, model_path=b)


# ---- down_t cache --------------------------------------------------------------------------


def _reference(model, layer: int) -> np.ndarray:
    tv = model.layer_tensors(layer)[8]
    assert tv.name == f"blk.{layer}.ffn_down.weight"
    raw = np.asarray(tv.data)
    w = quants.dequantize(raw, tv.type) if tv.type != GT.F32 else raw.view(np.float32)
    w = np.asarray(w, dtype=np.float32).reshape(N_EMBD, N_FF)  # n_embd rows of n_ff
    return np.ascontiguousarray(w.T)


@pytest.mark.parametrize("down_type", [GT.Q8_0, GT.Q4_1, GT.F32], ids=lambda t: t.name)
def test_transposed_down_values_and_reuse(tmp_path, xdg_cache, down_type):
    p = _model(tmp_path / "m", down_type=down_type)
    sha_before = _sha(p)
    model = load_gguf(p, verbose=False)
    assert model.layer_tensors(0)[8].type == down_type
    for dtype, npdt in (("f32", np.float32), ("f16", np.float16)):
        for layer in range(N_LAYER):
            got = transposed_down(model, layer, dtype=dtype)
            ref = _reference(model, layer)
            assert got.shape == (N_FF, N_EMBD) and got.dtype == npdt
            np.testing.assert_array_equal(got, ref.astype(npdt))
        npy = down_cache_path(p, dtype)
        assert npy.parent == (tmp_path / "m" / "tiny.powerinfer").resolve()
        meta = artifacts.read_metadata(npy)
        assert meta["model_fingerprint"] == sha_before and meta["dtype"] == dtype
        assert meta["shape"] == [N_LAYER, N_FF, N_EMBD]
        full = np.load(npy)
        assert full.shape == (N_LAYER, N_FF, N_EMBD) and full.dtype == npdt

        # the second call (in-process and from a fresh process state) loads, not rebuilds
        mtimes = (os.stat(npy).st_mtime_ns, os.stat(artifacts.metadata_path(npy)).st_mtime_ns)
        again = transposed_down(model, 1, dtype=dtype)
        down_cache._loaded.clear()  # as a new process would start
        fresh = transposed_down(model, 1, dtype=dtype)
        assert mtimes == (os.stat(npy).st_mtime_ns, os.stat(artifacts.metadata_path(npy)).st_mtime_ns)
        for arr in (again, fresh):
            assert isinstance(arr, np.memmap) and not arr.flags.writeable
            np.testing.assert_array_equal(arr, _reference(model, 1).astype(npdt))
        assert build_down_cache(p, model, dtype=dtype, progress=False) == npy
        assert os.stat(npy).st_mtime_ns == mtimes[0]
    assert not any(n.endswith(".tmp") for n in os.listdir(npy.parent))
    assert _sha(p) == sha_before  # the model file is never written
    model.close()


@pytest.mark.parametrize("down_type", [GT.Q8_0, GT.Q4_1], ids=lambda t: t.name)
def test_transposed_down_q8_0(tmp_path, xdg_cache, down_type):
    """The Q8_0 cache: each neuron's row is its n_embd weights (the exact dequantized
    column of ffn_down) quantized to Q8_0 blocks: within half a step (amax / 127 / 2,
    plus the F16 rounding of the scale) of the exact values, as TensorViews of ne
    (n_embd, n_ff) over one uint8 memmap, loaded again without rebuilding."""
    p = _model(tmp_path / "m", down_type=down_type)
    model = load_gguf(p, verbose=False)
    assert down_t_dtype(model) == "q8_0"  # a quantized ffn_down: Q8_0 rows (34 B per 32 weights, F16: 64)
    for layer in range(N_LAYER):
        v = transposed_down(model, layer, dtype="q8_0")
        assert v.type == GT.Q8_0 and v.ne == (N_EMBD, N_FF) and v.nbytes == N_FF * N_EMBD // 32 * 34
        got = quants.dequantize(np.asarray(v.data).reshape(N_FF, -1), GT.Q8_0).reshape(N_FF, N_EMBD)
        ref = _reference(model, layer)
        amax = np.abs(ref.reshape(N_FF, -1, 32)).max(axis=2, keepdims=True)
        assert np.all(np.abs(got - ref).reshape(N_FF, -1, 32) <= amax * 0.6 / 127)
    npy = down_cache_path(p, "q8_0")
    meta = artifacts.read_metadata(npy)
    assert meta["dtype"] == "q8_0" and meta["shape"] == [N_LAYER, N_FF, N_EMBD // 32 * 34]
    assert meta["n_embd"] == N_EMBD
    mtime = os.stat(npy).st_mtime_ns
    down_cache._loaded.clear()
    cache = load_down_cache(p, "q8_0")
    assert isinstance(cache, QuantizedDownT) and cache.shape == (N_LAYER, N_FF, N_EMBD) and len(cache) == N_LAYER
    assert load_down_cache(p, "q8_0", (N_LAYER, N_FF, N_EMBD)) is not None
    assert load_down_cache(p, "q8_0", (N_LAYER, N_FF, N_EMBD + 32)) is None
    np.testing.assert_array_equal(cache[1].data, transposed_down(model, 1, dtype="q8_0").data)
    with pytest.raises(IndexError):
        cache[N_LAYER]
    assert build_down_cache(p, model, dtype="q8_0", progress=False) == npy and os.stat(npy).st_mtime_ns == mtime
    model.close()


def test_down_t_dtype_rule(tmp_path):
    """F32 only when every ffn_down is F32; F16 for unquantized sources and for n_embd
    not a multiple of 32 (no whole Q8_0 blocks); Q8_0 for quantized sources."""

    def dtype(name, **kw):
        m = load_gguf(write_tiny_llama(tmp_path / name, n_layer=2, **kw), verbose=False)
        try:
            return down_t_dtype(m)
        finally:
            m.close()

    assert dtype("f32.gguf", types={"ffn_down": GT.F32}) == "f32"
    assert dtype("f16.gguf", types={"ffn_down": GT.F16}) == "f16"
    assert dtype("mixed.gguf", types={"blk.0.ffn_down.weight": GT.F32, "ffn_down": GT.Q4_0}) == "f16"
    assert dtype("q4_0.gguf", types={"ffn_down": GT.Q4_0}) == "q8_0"
    assert dtype("q8_0.gguf") == "q8_0"
    assert dtype("e48.gguf", n_embd=48, n_head=3, n_head_kv=1, types={"matrix": GT.F16, "ffn_down": GT.Q4_0}) == "f16"


def test_down_cache_rebuilds_on_other_model(tmp_path, xdg_cache):
    p = _model(tmp_path / "m", seed=1)
    npy = build_down_cache(p, dtype="f16", progress=False)
    old_meta = artifacts.read_metadata(npy)
    # the same file name now holds another model: the cache (not a result) rebuilds silently
    write_tiny_llama(p, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, seed=2)
    model = load_gguf(p, verbose=False)
    got = transposed_down(model, 0)
    np.testing.assert_array_equal(got, _reference(model, 0).astype(np.float16))
    new_meta = artifacts.read_metadata(npy)
    assert new_meta["model_fingerprint"] == _sha(p) != old_meta["model_fingerprint"]
    model.close()


def test_down_cache_errors_and_corrupt_file(tmp_path, xdg_cache):
    p = _model(tmp_path / "m")
    model = load_gguf(p, verbose=False)
    with pytest.raises(IndexError):
        transposed_down(model, N_LAYER)
    with pytest.raises(ValueError, match="dtype"):
        transposed_down(model, 0, dtype="q4_0")
    with pytest.raises(ValueError, match="dtype"):
        transposed_down(model, 0, dtype=np.uint8)  # q8_0 is asked for by name
    # a corrupt array with matching-looking metadata is rebuilt, not trusted
    npy = build_down_cache(p, model, dtype=np.float32, progress=False)
    atomic_write_bytes(npy, b"garbage")
    down_cache._loaded.clear()
    np.testing.assert_array_equal(transposed_down(model, 0, dtype="f32"), _reference(model, 0))
    model.close()
