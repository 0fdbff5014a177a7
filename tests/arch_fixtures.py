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
    from fixtures import finish_gguf, write_tiny_llama
except ImportError:  # tests/ imported as a package
    from tests.fixtures import finish_gguf, write_tiny_llama


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


# ---- Falcon and OPT: LayerNorm, ungated FFN ----------------------------------------------


def _write_gguf(path: str, arch: str, kv: Mapping, tensors, *, n_vocab: int, matrix_type: int, seed: int,
                magic: bytes = b"GGUF") -> str:
    """Write metadata (plus the tiny tokenizer) and (name, float32 array, is_matrix)
    tensors; matrices in ``matrix_type``, vectors F32."""
    from fixtures import random_quantized, tiny_tokenizer  # noqa: E402 (tests/ on sys.path)

    rng = np.random.default_rng(seed + 7)
    w = gguf.GGUFWriter(path, arch)
    tokens, token_types, merges = tiny_tokenizer(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    for key, value in kv.items():
        if value is None:
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))
    for name, arr, is_matrix in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if is_matrix and matrix_type != T.F32:
            w.add_tensor(name, random_quantized(arr, matrix_type, rng), raw_dtype=matrix_type)
        else:
            w.add_tensor(name, arr)
    finish_gguf(w, path, magic)
    return path


def write_tiny_falcon(path: str | os.PathLike, *, n_vocab: int = 64, n_embd: int = 64, n_layer: int = 2,
                      n_ff: int = 256, n_head: int = 4, n_head_kv: int = 1, two_norms: bool = False,
                      ffn_act: str | None = None, sparse_threshold: float | None = None,
                      transposed_down: bool = False, matrix_type: int = T.F32, seed: int = 0,
                      drop: tuple = (), shapes: Mapping | None = None) -> str:
    """A Falcon GGUF as llama.cpp's converter writes it: token_embd, per layer attn_norm
    (+bias), attn_norm_2 (+bias, ``two_norms``: Falcon 40B), attn_qkv (q heads, then k,
    then v), attn_output, ffn_up, ffn_down (``transposed_down``: PowerInfer's
    blk.N.ffn_down_t.weight instead), output_norm (+bias), output. ``ffn_act`` writes
    powerinfer.ffn_act, ``sparse_threshold`` powerinfer.sparse_threshold (a PowerInfer
    ReluFalcon file). ``drop``: tensor names left out; ``shapes``: name -> numpy shape."""
    path = os.fspath(path)
    rng = np.random.default_rng(seed)
    hd = n_embd // n_head
    n_qkv = (n_head + 2 * n_head_kv) * hd
    shapes = dict(shapes or {})

    def mat(n_out, n_in):
        return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def ln(stem, n=n_embd):
        return [(f"{stem}.weight", 1.0 + 0.1 * rng.standard_normal(n), False),
                (f"{stem}.bias", 0.1 * rng.standard_normal(n), False)]

    ts = [("token_embd.weight", rng.standard_normal((n_vocab, n_embd)), True)]
    for i in range(n_layer):
        p = f"blk.{i}."
        ts += ln(p + "attn_norm")
        if two_norms:
            ts += ln(p + "attn_norm_2")
        ts += [(p + "attn_qkv.weight", mat(n_qkv, n_embd), True),
               (p + "attn_output.weight", mat(n_embd, n_head * hd), True),
               (p + "ffn_up.weight", mat(n_ff, n_embd), True)]
        down = mat(n_embd, n_ff)
        ts.append((p + "ffn_down_t.weight", down.T, True) if transposed_down else (p + "ffn_down.weight", down, True))
    ts += ln("output_norm")
    ts.append(("output.weight", mat(n_vocab, n_embd), True))
    ts = [(n, np.zeros(shapes[n]) if n in shapes else a, m) for n, a, m in ts if n not in drop]
    kv = {
        "general.name": "tiny-random-falcon",
        "falcon.context_length": 256,
        "falcon.embedding_length": n_embd,
        "falcon.feed_forward_length": n_ff,
        "falcon.block_count": n_layer,
        "falcon.attention.head_count": n_head,
        "falcon.attention.head_count_kv": n_head_kv,
        "falcon.attention.layer_norm_epsilon": 1e-5,
        "falcon.tensor_data_layout": "jploski",
        "powerinfer.ffn_act": ffn_act,
        "powerinfer.sparse_threshold": None if sparse_threshold is None else float(sparse_threshold),
    }
    return _write_gguf(path, "falcon", kv, ts, n_vocab=n_vocab, matrix_type=matrix_type, seed=seed)


def write_tiny_opt(path: str | os.PathLike, *, n_vocab: int = 64, n_embd: int = 64, n_layer: int = 2,
                   n_ff: int = 256, n_head: int = 4, n_ctx_train: int = 34, transposed_down: bool = True,
                   matrix_type: int = T.F32, seed: int = 0, bias_scale: float = 0.3, magic: bytes = b"GGUF",
                   drop: tuple = (), shapes: Mapping | None = None) -> str:
    """An OPT GGUF as PowerInfer's converter writes it: token_embd, position_embd
    [n_embd, n_ctx_train] (HF's table: positions offset by 2), per layer attn_norm,
    attn_q/k/v, attn_output, ffn_norm, ffn_up (each with its bias), ffn_down_t weight
    and bias (``transposed_down=False``: blk.N.ffn_down.weight/bias), output_norm (+bias);
    output tied to token_embd; no layer_norm_epsilon key (HF OPT's 1e-5)."""
    path = os.fspath(path)
    rng = np.random.default_rng(seed)
    shapes = dict(shapes or {})

    def lin(stem, n_out, n_in):
        return [(f"{stem}.weight", rng.standard_normal((n_out, n_in)) / np.sqrt(n_in), True),
                (f"{stem}.bias", bias_scale * rng.standard_normal(n_out), False)]

    def ln(stem):
        return [(f"{stem}.weight", 1.0 + 0.1 * rng.standard_normal(n_embd), False),
                (f"{stem}.bias", 0.1 * rng.standard_normal(n_embd), False)]

    ts = [("token_embd.weight", rng.standard_normal((n_vocab, n_embd)), True),
          ("position_embd.weight", 0.5 * rng.standard_normal((n_ctx_train, n_embd)), True)]
    for i in range(n_layer):
        p = f"blk.{i}."
        ts += ln(p + "attn_norm")
        for role in ("attn_q", "attn_k", "attn_v", "attn_output"):
            ts += lin(p + role, n_embd, n_embd)
        ts += ln(p + "ffn_norm")
        ts += lin(p + "ffn_up", n_ff, n_embd)
        (dw, dwa, _), (db, dba, _) = lin(p + "ffn_down", n_embd, n_ff)
        if transposed_down:
            ts += [(p + "ffn_down_t.weight", dwa.T, True), (p + "ffn_down_t.bias", dba, False)]
        else:
            ts += [(dw, dwa, True), (db, dba, False)]
    ts += ln("output_norm")
    ts = [(n, np.zeros(shapes[n]) if n in shapes else a, m) for n, a, m in ts if n not in drop]
    kv = {
        "general.name": "opt",
        "opt.context_length": n_ctx_train,
        "opt.embedding_length": n_embd,
        "opt.block_count": n_layer,
        "opt.feed_forward_length": n_ff,
        "opt.attention.head_count": n_head,
    }
    return _write_gguf(path, "opt", kv, ts, n_vocab=n_vocab, matrix_type=matrix_type, seed=seed, magic=magic)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal attention, q (n, nh, hd), k/v (n, nkv, hd), scores scaled by 1/sqrt(hd)."""
    n, nh, hd = q.shape
    nkv = k.shape[1]
    out = np.zeros_like(q)
    for i in range(n):
        for h in range(nh):
            g = h // (nh // nkv)
            s = k[: i + 1, g] @ q[i, h] / np.sqrt(hd)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[: i + 1, g]
    return out


def falcon_reference(model, tokens) -> np.ndarray:
    """Logits (n_tok, n_vocab) of Falcon in float64 from a loaded GGUFModel, as
    llama.cpp's graph: attention reads attn_norm_2(x) when the layer has it, else
    attn_norm(x); the MLP reads attn_norm(x); x + attention + MLP. GELU at half
    precision (:func:`gelu16`), or ReLU when the model's activation is relu."""
    hp = model.hparams
    t = {name: tv.to_float32().astype(np.float64) for name, tv in model.tensors.items()}
    hd, nh, nkv = hp.n_embd_head, hp.n_head, hp.n_head_kv
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    act = (lambda v: np.maximum(v, 0.0)) if hp.act_name == "relu" else gelu16
    x = t["token_embd.weight"][tokens]
    eps = hp.rms_eps
    for l in range(hp.n_layer):
        p = f"blk.{l}."
        ln_mlp = _ln(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"], eps)
        a_stem = p + ("attn_norm_2" if p + "attn_norm_2.weight" in t else "attn_norm")
        ln_attn = _ln(x, t[a_stem + ".weight"], t[a_stem + ".bias"], eps)
        qkv = ln_attn @ t[p + "attn_qkv.weight"].T
        q = qkv[:, : nh * hd].reshape(n, nh, hd)
        k = qkv[:, nh * hd : (nh + nkv) * hd].reshape(n, nkv, hd)
        v = qkv[:, (nh + nkv) * hd :].reshape(n, nkv, hd)
        base = hp.rope_freq_base
        o = _attend(_rope_neox(q, pos, base), _rope_neox(k, pos, base), v)
        attn = o.reshape(n, nh * hd) @ t[p + "attn_output.weight"].T
        mlp = act(ln_mlp @ t[p + "ffn_up.weight"].T) @ t[p + "ffn_down.weight"].T
        x = x + attn + mlp
    x = _ln(x, t["output_norm.weight"], t["output_norm.bias"], eps)
    return x @ t["output.weight"].T


def opt_reference(model, tokens, start: int = 0) -> np.ndarray:
    """Logits (n_tok, n_vocab) of OPT in float64 (HF OPTForCausalLM's pre-LN decoder):
    embeddings + position row p + 2; LayerNorm with bias; biased q/k/v/out; ReLU FFN
    with biases; output tied to token_embd. ``start``: position of tokens[0] (no cache:
    the tokens attend only to themselves)."""
    hp = model.hparams
    t = {name: tv.to_float32().astype(np.float64) for name, tv in model.tensors.items()}
    hd, nh = hp.n_embd_head, hp.n_head
    n = len(tokens)
    eps = hp.rms_eps
    down_b = "ffn_down.bias" if "blk.0.ffn_down.bias" in t else "ffn_down_t.bias"
    x = t["token_embd.weight"][tokens] + t["position_embd.weight"][np.arange(start, start + n) + 2]
    for l in range(hp.n_layer):
        p = f"blk.{l}."
        h = _ln(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"], eps)
        q, k, v = ((h @ t[p + r + ".weight"].T + t[p + r + ".bias"]).reshape(n, nh, hd)
                   for r in ("attn_q", "attn_k", "attn_v"))
        o = _attend(q, k, v).reshape(n, nh * hd)
        x = x + o @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"]
        h = _ln(x, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"], eps)
        f = np.maximum(h @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"], 0.0)
        x = x + f @ t[p + "ffn_down.weight"].T + t[p + down_b]
    x = _ln(x, t["output_norm.weight"], t["output_norm.bias"], eps)
    return x @ t["token_embd.weight"].T
