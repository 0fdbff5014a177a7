"""llama.cpp's vocabulary rules, checked in Python before a GGUF reaches llama.cpp.

llama.cpp (as vendored by llama-cpp-python 0.3.36) aborts the whole process on some
vocabulary contents - a token string that appears twice trips a ``GGML_ASSERT`` while
the vocabulary loads - and on others the first tokenize aborts it (an assert, or a C++
exception that escapes its C API). It refuses further contents with an exception that
llama-cpp-python reports as "Failed to load model from file", naming nothing.
:func:`check_vocab` finds all of these first and raises :class:`ValueError` naming the
file, the key and the offending entries. docs/reliability.md lists each rule with the
llama.cpp check it mirrors.

Cost: one scan of the metadata (:mod:`.gguf_meta`) plus set and numpy operations over
the token arrays; a file that passed is remembered by (path, size, mtime), so a repeated
load costs a ``stat``.
"""

from __future__ import annotations

import os
import re

import numpy as np

from .gguf_meta import MetaValue, scan_metadata
from .types import _V, _vtype_name
from .ugm_charsmap import charsmap_problem
from .vocab_texts import LlamaTexts

__all__ = ["check_vocab", "PRE_TOKENIZERS", "TOKENIZER_MODELS"]

_K = "tokenizer.ggml."
MODEL, PRE, TOKENS, SCORES, TOKEN_TYPE, MERGES = (
    _K + k for k in ("model", "pre", "tokens", "scores", "token_type", "merges")
)
CHARSMAP, SUPPRESS = _K + "precompiled_charsmap", _K + "suppress_tokens"
NAME = "general.name"

#: tokenizer.ggml.model -> llama.cpp's vocabulary type (llama_vocab::impl::load)
TOKENIZER_MODELS = {
    "llama": "SPM",
    "bert": "WPM",
    "gpt2": "BPE",
    "hybriddna": "BPE",
    "whitespace": "BPE",
    "gemma4": "BPE",
    "t5": "UGM",
    "rwkv": "RWKV",
    "plamo2": "PLAMO2",
}
_NO_VOCAB = ("no_vocab", "none")

#: tokenizer.ggml.pre names llama.cpp accepts for BPE vocabularies (any other throws)
PRE_TOKENIZERS = frozenset(
    """
default minicpm5 llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano
deepseek-llm deepseek-coder deepseek-v3 spark2_5 youtu falcon mpt starcoder gpt-2 phi-2 jina-es jina-de
gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jais-2 gemma4 granite-embed-multi-311m
sarvam-moe jina-v1-en jina-v2-code roberta-bpe whitespace refact command-r qwen2 deepseek-r1-qwen kormo
f2llmv2 qwen35 stablelm2 olmo dbrx smaug-bpe poro-chat glm4 chatglm-bpe viking jais tekken smollm
codeshell bloom gpt3-finnish exaone exaone4 exaone-moe chameleon minerva-7b megrez gpt-4o llama4 kanana2
talkie granite-embed-multi-97m tiny_aya cohere2moe superbpe trillion granite-docling bailingmoe
bailingmoe2 llada-moe seed-coder hunyuan hunyuan-dense hy_v4 joyai-llm kimi-k2 ufakzeka grok-2 afmoe
laguna minimax-m2 solar-open mellum2
""".split()
)
# BPE pre-tokenizers for which llama.cpp adds BOS by default
_ADD_BOS_PRE = frozenset(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano tekken chameleon".split()
)
_GEMMA4_PRE = ("gemma4", "granite-embed-multi-311m")  # llama.cpp forces add_bos for these

# special-token ids the tokenizer asserts on: role -> key, and llama.cpp's defaults per model
_ID = {r: f"{_K}{k}_token_id" for r, k in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("sep", "seperator"))}
_DEFAULT_IDS = {
    "llama": {"bos": 1, "eos": 2, "unk": 0},
    "bert": {"bos": 101, "unk": 100, "sep": 102},
    "gpt2": {"bos": 11, "eos": 11},
    "hybriddna": {"bos": 11, "eos": 11},
    "whitespace": {"bos": 11, "eos": 11},
    "t5": {"eos": 1, "unk": 2},
    "plamo2": {"bos": 1, "eos": 2, "unk": 0},
    "rwkv": {},
    "gemma4": {},
}
_U32_KEYS = tuple(
    f"{_K}{k}_token_id"
    for k in (
        "bos",
        "eos",
        "eot",
        "eom",
        "unknown",
        "seperator",
        "padding",
        "mask",
        "fim_pre",
        "fim_suf",
        "fim_mid",
        "fim_pad",
        "fim_rep",
        "fim_sep",
        "prefix",
        "suffix",
        "middle",
    )
) + (_K + "token_type_count",)
_BOOL_KEYS = tuple(
    _K + k
    for k in (
        "add_bos_token",
        "add_eos_token",
        "add_sep_token",
        "add_space_prefix",
        "remove_extra_whitespaces",
        "normalizer.lowercase",
        "normalizer.strip_accents",
    )
)
_BYTE = 6  # LLAMA_TOKEN_TYPE_BYTE
_HEX_BYTE = re.compile(rb"<0x[0-9A-Fa-f]{2}>")
_PHI3_TOKENS = (b"</s>", b"<unk>", b"<s>", b"<|endoftext|>")

_CHECKED: dict[tuple, None] = {}  # (real path, size, mtime_ns) of files that passed
_MAX_CHECKED = 4096


def check_vocab(path) -> None:
    """Check the vocabulary of the GGUF file ``path`` against llama.cpp's rules.

    Returns None when llama.cpp can load the vocabulary and tokenize with it without
    aborting the process; the result is cached per (path, size, mtime).

    Raises:
        ValueError: ``"<path>: <key>: <problem>"`` - e.g. a token string that appears
            twice (with both ids), an array shorter than ``tokenizer.ggml.tokens``, a
            special-token id the tokenizer needs but the file does not resolve, an
            unknown tokenizer model or pre-tokenizer; also a file that cannot be read
            or whose metadata is not valid GGUF.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file: {e.strerror}") from e
    stamp = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if stamp in _CHECKED:
        return
    try:
        kv = scan_metadata(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file: {e.strerror}") from e
    _Vocab(path, kv).check()
    if len(_CHECKED) >= _MAX_CHECKED:
        _CHECKED.clear()
    _CHECKED[stamp] = None


class _Vocab:
    """One file's vocabulary metadata and the checks over it, in llama.cpp's order."""

    def __init__(self, path: str, kv: dict[str, MetaValue]):
        self.path, self.kv = path, kv

    def fail(self, key: str, msg: str) -> ValueError:
        return ValueError(f"{self.path}: {key}: {msg}")

    # -- typed access (llama.cpp refuses a file whose key has another type) --

    def scalar(self, key: str, vtype: int):
        v = self.kv.get(key)
        if v is None:
            return None
        if v.vtype != vtype:
            raise self.fail(key, f"has type {_type(v)}; llama.cpp needs {_vtype_name(vtype)} and refuses the file")
        return v.value

    def array(self, key: str, etypes: tuple[int, ...], required: str = "") -> MetaValue | None:
        v = self.kv.get(key)
        if v is None:
            if required:
                raise self.fail(key, f"missing; {required}")
            return None
        if v.vtype != int(_V.ARRAY) or v.etype not in etypes:
            need = " or ".join(f"array of {_vtype_name(e)}" for e in etypes)
            raise self.fail(key, f"has type {_type(v)}; llama.cpp needs {need} and refuses the file")
        return v

    def string(self, key: str) -> str | None:
        v = self.scalar(key, int(_V.STRING))
        return None if v is None else v.decode("utf-8", "replace")

    # -- the checks --

    def check(self) -> None:
        model = self.string(MODEL)
        if model is None:
            raise self.fail(MODEL, "missing; llama.cpp needs it to load the vocabulary")
        pre = self.string(PRE)
        self.name = self.scalar(NAME, int(_V.STRING))
        if model in _NO_VOCAB:
            raise self.fail(
                MODEL,
                f"'{model}' (no vocabulary): llama.cpp loads the file, then aborts the "
                "process on the first tokenize (GGML_ASSERT: tokenizer not initialized)",
            )
        self.type = TOKENIZER_MODELS.get(model)
        if self.type is None:
            raise self.fail(
                MODEL, f"unknown tokenizer model '{model}' (llama.cpp knows {', '.join(sorted(TOKENIZER_MODELS))})"
            )
        self.model, self.raw_pre = model, pre
        if model == "gemma4":
            pre = "gemma4"  # llama.cpp sets it whatever the file says
        self.pre = pre
        if self.type == "BPE":
            self.check_bpe_keys()
        if self.type == "UGM":
            self.check_charsmap()
        for key in _BOOL_KEYS:
            self.scalar(key, int(_V.BOOL))
        for key in _U32_KEYS:
            self.scalar(key, int(_V.UINT32))
        self.array(SUPPRESS, (int(_V.INT32),))
        self.check_tokens()
        self.check_byte_tokens()  # before the ids: a WordPiece BYTE token aborts at load already
        self.check_special_ids()
        self.check_name_rules()

    def check_bpe_keys(self) -> None:
        if self.pre not in (None, "") and self.pre not in PRE_TOKENIZERS:
            raise self.fail(PRE, f"unknown pre-tokenizer '{self.pre}' (llama.cpp refuses the file)")
        if self.pre == "whitespace" and self.model != "whitespace":
            # it keeps the raw bytes; only the "whitespace" model's session drops the spaces
            raise self.fail(
                PRE,
                f"'whitespace' with tokenizer model '{self.model}': tokenizing text with two "
                "spaces in a row hands a space to llama.cpp's BPE merge lookup, which aborts "
                "the process (find_bpe_rank: GGML_ASSERT)",
            )
        why = f"required for a BPE vocabulary (tokenizer.ggml.model '{self.model}'); llama.cpp refuses the file"
        self.array(MERGES, (int(_V.STRING),), required="" if self.pre == "kimi-k2" and self.model != "gemma4" else why)
        # merge format: llama.cpp splits each "a b" at the first space after its first byte and
        # ignores an entry without one; no format makes it fail, so there is nothing to check

    def check_charsmap(self) -> None:
        v = self.array(CHARSMAP, (int(_V.UINT8), int(_V.INT8)))
        if v is None:
            return
        problem = charsmap_problem(np.asarray(v.value).view(np.uint8))
        if problem:
            raise self.fail(CHARSMAP, problem)

    def check_tokens(self) -> None:
        tok = self.array(TOKENS, (int(_V.STRING),), required="llama.cpp cannot load a vocabulary without it")
        assert tok is not None  # required: array() raised
        if tok.count == 0:
            raise self.fail(TOKENS, "empty vocabulary (0 tokens)")
        self.texts = texts = LlamaTexts(tok.value)
        self.n = n = len(texts)
        dups = texts.duplicates()
        if dups:
            raise self.fail(TOKENS, self.duplicates_message(dups))
        for key, etypes in ((SCORES, (int(_V.FLOAT32), int(_V.INT32))), (TOKEN_TYPE, (int(_V.INT32),))):
            v = self.array(key, etypes)
            if v is not None and v.count < n:
                raise self.fail(key, f"has {v.count} entries for {n} tokens (llama.cpp refuses the file)")
        tt = self.kv.get(TOKEN_TYPE)
        self.types = None if tt is None else tt.value[:n]

    def duplicates_message(self, groups: dict[bytes, list[int]]) -> str:
        parts = [f"token string {_show(t)} appears at ids {_ids(ids)}" for t, ids in list(groups.items())[:3]]
        msg = "; ".join(parts)
        if len(groups) > 3:
            msg += f"; and {len(groups) - 3} more duplicated strings"
        altered = set(self.texts.altered.tolist())
        if any(i in altered for ids in groups.values() for i in ids):
            msg += " (as llama.cpp reads them: each token up to its first NUL byte, an empty one as '[EMPTY_<id>]')"
        return msg + (
            ": llama.cpp aborts the process loading this vocabulary "
            "(GGML_ASSERT id_to_token.size() == token_to_id.size())"
        )

    def resolve(self) -> dict[str, int]:
        """bos/eos/unk/sep as llama.cpp resolves them (-1: none): the model's defaults,
        dropped when outside the vocabulary, then the file's id when inside it."""
        ids = {"bos": -1, "eos": -1, "unk": -1, "sep": -1}
        ids.update(_DEFAULT_IDS[self.model])
        if self.type == "BPE" and self.pre in ("glm4", "chatglm-bpe"):
            ids["bos"] = -1
        for role, key in _ID.items():
            if ids[role] >= self.n:
                ids[role] = -1
            v = self.scalar(key, int(_V.UINT32))
            if v is not None and v < self.n:
                ids[role] = v
        return ids

    def flag(self, name: str, default: bool) -> bool:
        v = self.scalar(_K + name, int(_V.BOOL))
        return default if v is None else bool(v)

    def check_special_ids(self) -> None:
        ids, t = self.resolve(), self.type
        add_bos = self.flag("add_bos_token", t in ("SPM", "WPM") or (t == "BPE" and self.pre in _ADD_BOS_PRE))
        add_eos = self.flag("add_eos_token", t == "UGM")
        if t == "BPE" and self.pre in _GEMMA4_PRE:
            add_bos = True
        need = []
        if t in ("SPM", "UGM", "BPE"):
            need += [r for r, on in (("bos", add_bos), ("eos", add_eos)) if on]
        if t == "WPM":
            need += ["bos", "sep"]  # a WordPiece tokenize with special tokens adds both
        if t in ("WPM", "UGM"):
            need.append("unk")  # text it cannot spell becomes UNK (id -1 if none: later lookups abort)
        for role in ("bos", "eos"):  # llama-cpp-python's Llama decodes both texts (strict UTF-8)
            if ids[role] >= 0:
                try:
                    self.texts[ids[role]].decode("utf-8")
                except UnicodeDecodeError:
                    raise self.fail(
                        _ID[role],
                        f"token {ids[role]} {_show(self.texts[ids[role]])} is not valid "
                        f"UTF-8; llama-cpp-python decodes the {role.upper()} text and "
                        "refuses the file",
                    ) from None
        for role in need:
            if ids[role] < 0:
                why = "is missing" if self.kv.get(_ID[role]) is None else "is outside the vocabulary"
                raise self.fail(
                    _ID[role],
                    f"{why} and llama.cpp has no default {role.upper()} token for "
                    f"{self.n} tokens, but its tokenizer needs one: the first tokenize "
                    "aborts the process",
                )

    def check_byte_tokens(self) -> None:
        t, texts = self.type, self.texts
        byte_ids = np.flatnonzero(self.types == _BYTE) if self.types is not None else np.empty(0, np.int64)
        if t == "WPM" and byte_ids.size:
            raise self.fail(
                TOKEN_TYPE,
                f"ids {_ids(byte_ids)} have type BYTE (6): llama.cpp aborts the process "
                "on a BYTE token of a WordPiece vocabulary (token_to_byte: GGML_ABORT)",
            )
        if t in ("SPM", "UGM", "BPE"):
            short = byte_ids[texts.lens[byte_ids] < 3]
            if short.size:
                raise self.fail(
                    TOKEN_TYPE,
                    f"ids {_ids(short)} have type BYTE (6) but are not spelled '<0xXX>' "
                    "(shorter than 3 bytes): llama.cpp refuses the file",
                )
        if t == "SPM":
            missing = [b for b in range(256) if b"<0x%02X>" % b not in texts and (b == 0 or bytes([b]) not in texts)]
            if missing:
                raise self.fail(
                    TOKENS,
                    f"no token for byte(s) {_bytes(missing)} ('<0xXX>'): llama.cpp's "
                    "SentencePiece tokenizer spells text it has no token for with these, and "
                    "a missing one throws past its C API, aborting the process",
                )
        if t == "RWKV":
            short = np.flatnonzero(texts.lens <= 8)  # longer ones cannot unescape to one byte
            single = {u for u in (_rwkv_unescape(texts[i]) for i in short.tolist()) if len(u) == 1}
            missing = [b for b in range(256) if bytes([b]) not in single]
            if missing:
                raise self.fail(
                    TOKENS,
                    f"no token for byte(s) {_bytes(missing)}: llama.cpp's RWKV tokenizer "
                    "then loops without end (growing memory) or emits token id -1 for text "
                    "with them",
                )
        if t == "PLAMO2":
            have = {int(texts[i][3:5], 16) for i in byte_ids.tolist() if i and _HEX_BYTE.fullmatch(texts[i])}
            missing = [b for b in range(256) if b not in have]
            if missing:
                raise self.fail(
                    TOKENS,
                    f"no BYTE token '<0xXX>' for byte(s) {_bytes(missing)}: llama.cpp's "
                    "PLaMo-2 tokenizer refuses the file",
                )

    def check_name_rules(self) -> None:
        # llama.cpp sets attributes on named tokens for some models; a missing one throws
        pre = self.raw_pre or ""
        arch_v = self.kv.get("general.architecture")
        arch = arch_v.value if arch_v is not None and isinstance(arch_v.value, bytes) else b""
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in (b"nomic-bert-moe", b"jina-bert-v3")
        ):
            return
        name = (self.name or b"").lower()
        if b"phi-3" in name or b"phi3" in name:
            missing = [t for t in _PHI3_TOKENS if t not in self.texts]
            if missing:
                raise self.fail(
                    TOKENS,
                    f"no token {', '.join(_show(t) for t in missing)}, which llama.cpp "
                    f"looks up for a model named {_show(self.name)}: it refuses the file",
                )


def _rwkv_unescape(s: bytes) -> bytes:
    """llama.cpp's RWKV token unescaping (\\t \\n \\r \\xHH, \\<c> -> c; hex digits unchecked)."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in s:
        if hex_left:
            acc = ((acc << 4) + ((c - 87) if c >= 97 else (c - 48))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            escaping = False
            if c == 120:  # x
                hex_left = 2
            else:
                out.append({116: 9, 110: 10, 114: 13}.get(c, c))
        elif c == 92:  # backslash
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def _type(v: MetaValue) -> str:
    if v.vtype == int(_V.ARRAY) and v.etype is not None:  # an array always has its element type
        return f"array of {_vtype_name(v.etype)}"
    return _vtype_name(v.vtype)


def _show(t: bytes) -> str:
    s = t.decode("utf-8", "backslashreplace")
    return repr(s if len(s) <= 40 else s[:40] + "...")


def _ids(ids) -> str:
    ids = [int(i) for i in ids]
    shown = ", ".join(map(str, ids[:8])) + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "")
    return shown.replace(", ", " and ", 1) if len(ids) == 2 else shown


def _bytes(bs: list[int]) -> str:
    return ", ".join(f"0x{b:02X}" for b in bs[:8]) + (f", ... ({len(bs)} in all)" if len(bs) > 8 else "")
