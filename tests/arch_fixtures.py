"""Tiny random-weight GGUFs of the non-llama architectures, with their real tensor
names and hyper-parameter keys, and float64 numpy references of their forward passes.

The writers reuse :func:`fixtures.write_tiny_llama` for the llama-shaped part (token
embedding, attention, gated FFN, tokenizer) and add each architecture's extra
tensors and keys.
"""

from __future__ import annotations

import os
from typing import Mapping

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

try:
    from fixtures import write_tiny_llama
except ImportError:  # tests/ imported as a package
    from tests.fixtures import write_tiny_llama


def write_tiny_gemma3(path: str | os.PathLike, *, n_vocab: int = 64, n_embd: int = 64, n_layer: int = 6,
                      n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32,
                      n_swa: int = 3, matrix_type: int = T.F32, seed: int = 0,
                      extra_kv: Mapping | None = None) -> str:
    """A Gemma 3 GGUF: llama.cpp's gemma3 tensor set (q/k norms, post-attention and
    post-FFN norms, tied output) and keys (key_length = head_dim, which differs from
    n_embd / n_head; sliding_window = n_swa). Norm weights are 1 + 0.1 * normal (the
    converter stores Gemma's (1 + w))."""
    path = os.fspath(path)
    tmp = path + ".llama"
    kv = {
        "gemma3.attention.key_length": head_dim,
        "gemma3.attention.value_length": head_dim,
        "gemma3.attention.sliding_window": n_swa,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.dimension_count": None,
        "general.name": "tiny-random-gemma3",
    }
    kv.update(extra_kv or {})
    # write_tiny_llama derives head_dim = n_embd / n_head; pass the real shapes
    shapes = {}
    for i in range(n_layer):
        shapes[f"blk.{i}.attn_q.weight"] = (n_embd, n_head * head_dim)
        shapes[f"blk.{i}.attn_k.weight"] = (n_embd, n_head_kv * head_dim)
        shapes[f"blk.{i}.attn_v.weight"] = (n_embd, n_head_kv * head_dim)
        shapes[f"blk.{i}.attn_output.weight"] = (n_head * head_dim, n_embd)
    write_tiny_llama(tmp, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
                     n_head_kv=n_head_kv, types={"matrix": matrix_type}, seed=seed, tied=True,
                     arch="gemma3", extra_kv=kv, shapes=shapes)
    rng = np.random.default_rng(seed + 1)

    def extra(name: str):
        if name.endswith("attn_norm.weight"):
            i = name.split(".")[1]
            for role, n in (("attn_q_norm", head_dim), ("attn_k_norm", head_dim),
                            ("post_attention_norm", n_embd), ("post_ffw_norm", n_embd)):
                yield f"blk.{i}.{role}.weight", (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    _rewrite_with_extra(tmp, path, "gemma3", extra)
    return path


def write_tiny_qwen2(path: str | os.PathLike, *, n_vocab: int = 64, n_embd: int = 64, n_layer: int = 2,
                     n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2, matrix_type: int = T.Q8_0,
                     seed: int = 0, bias_scale: float = 0.5) -> str:
    """A Qwen2 GGUF: the llama tensor set plus blk.N.attn_{q,k,v}.bias (F32)."""
    path = os.fspath(path)
    tmp = path + ".llama"
    write_tiny_llama(tmp, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
                     n_head_kv=n_head_kv, types={"matrix": matrix_type}, seed=seed, tied=True, arch="qwen2",
                     extra_kv={"general.name": "tiny-random-qwen2"})
    rng = np.random.default_rng(seed + 1)
    hd = n_embd // n_head

    def extra(name: str):
        if name.endswith("attn_v.weight"):
            i = name.split(".")[1]
            for role, n in (("attn_q", n_head * hd), ("attn_k", n_head_kv * hd), ("attn_v", n_head_kv * hd)):
                yield f"blk.{i}.{role}.bias", (bias_scale * rng.standard_normal(n)).astype(np.float32)

    _rewrite_with_extra(tmp, path, "qwen2", extra)
    return path


def _rewrite_with_extra(src: str, dst: str, arch: str, extra) -> None:
    """Copy GGUF src to dst (metadata and tensors), adding after each tensor the
    (name, float32 array) pairs extra(name) yields; src is removed."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch)
    w.kv_data[0].clear()
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=gguf.GGUFValueType(f.types[-1]))
        else:
            w.add_key_value(key, f.contents(), vtype)
    for t in r.tensors:
        data = np.array(t.data)
        if t.tensor_type in (T.F32, T.F16):
            w.add_tensor(t.name, data.reshape(tuple(int(d) for d in reversed(t.shape))))
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        for name, arr in extra(t.name):
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del r
    os.remove(src)


# ---- float64 reference forward passes --------------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_neox(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """x: (n_tok, n_heads, head_dim), the halves rotated (NEOX)."""
    d = x.shape[-1]
    half = d // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / d)  # (n_tok, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def gelu16(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) at half precision, as llama.cpp's forward pass: input and
    output rounded to F16; x <= -10 gives 0, x >= 10 gives x."""
    h = x.astype(np.float16).astype(np.float64)
    g = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h ** 3)))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, g))


def gemma3_reference(model, tokens, *, window: bool = True) -> np.ndarray:
    """Logits (n_tok, n_vocab) of Gemma 3 in float64 from a loaded GGUFModel
    (window=False: local layers attend to everything, for checking that a test
    exercises the window)."""
    hp = model.hparams
    t = {name: tv.to_float32().astype(np.float64) for name, tv in model.tensors.items()}
    emb = t["token_embd.weight"]
    hd, nh, nkv = hp.n_embd_head, hp.n_head, hp.n_head_kv
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = emb[tokens] * float(np.sqrt(np.float32(hp.n_embd)))
    eps = hp.rms_eps
    for l in range(hp.n_layer):
        p = f"blk.{l}."
        local = hp.is_swa(l)
        base = hp.rope_freq_base_swa if local else hp.rope_freq_base
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q = (h @ t[p + "attn_q.weight"].T).reshape(n, nh, hd)
        k = (h @ t[p + "attn_k.weight"].T).reshape(n, nkv, hd)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        q = _rope_neox(_rms(q, t[p + "attn_q_norm.weight"], eps), pos, base) / np.sqrt(hd)
        k = _rope_neox(_rms(k, t[p + "attn_k_norm.weight"], eps), pos, base)
        out = np.zeros((n, nh, hd))
        for i in range(n):
            lo = max(0, i - hp.n_swa + 1) if local and window else 0
            for hh in range(nh):
                g = hh // (nh // nkv)
                s = k[lo : i + 1, g] @ q[i, hh]
                wts = np.exp(s - s.max())
                out[i, hh] = (wts / wts.sum()) @ v[lo : i + 1, g]
        a = out.reshape(n, nh * hd) @ t[p + "attn_output.weight"].T
        x = x + _rms(a, t[p + "post_attention_norm.weight"], eps)
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        f = gelu16(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)
        d = f @ t[p + "ffn_down.weight"].T
        x = x + _rms(d, t[p + "post_ffw_norm.weight"], eps)
    return _rms(x, t["output_norm.weight"], eps) @ emb.T
