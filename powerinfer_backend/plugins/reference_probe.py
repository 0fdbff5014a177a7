"""The child process of the reference's extra-buffer-type probe
(:func:`powerinfer_backend.plugins.reference.extra_buffer_types_work`), and the switch
both sides load llama.cpp models with (:func:`use_extra_buffer_types`).

``python -m powerinfer_backend.plugins.reference_probe N_THREADS`` writes a tiny
one-layer llama GGUF whose matrices are the types llama.cpp repacks or hands to AMX
(Q4_0, Q4_K, Q8_0, Q4_1, Q5_K, Q6_K), loads it twice with llama-cpp-python — extra
buffer types on (llama.cpp's default) and off —, evaluates an 8-token prompt (the
batched kernels) and one more token (the one-row kernels) with each, and exits 0 when
the first run's logits are finite and agree with the second's. A crash in the repacked
or AMX kernels kills this process instead of the caller; any other failure exits
non-zero with the reason on stderr.

``POWERINFER_REFERENCE_PROBE_FAIL=1`` in the environment makes the child abort (SIGABRT)
at start: the caller's path for a crashing probe, exercised for real by the tests.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import numpy as np

#: environment variable that makes the probe child abort (tests of the fallback)
FORCE_FAIL_ENV = "POWERINFER_REFERENCE_PROBE_FAIL"

_N_EMBD, _N_FF, _N_HEAD, _N_VOCAB = 256, 512, 2, 64
# (role, ggml type name): every type llama.cpp's CPU repack (x86: Q4_0, Q4_K) or AMX
# buffers (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) take, in the rows they would take
_TYPES = {
    "attn_q": "Q4_0",
    "attn_k": "Q4_K",
    "attn_v": "Q8_0",
    "attn_output": "Q4_1",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q4_0",
    "ffn_down": "Q6_K",
    "output": "Q5_K",
    "token_embd": "Q8_0",
}
# byte offsets of the fp16 scales in one K-quant block: random other bytes make a valid block
_KQ_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


@contextlib.contextmanager
def use_extra_buffer_types(on: bool):
    """Load llama.cpp models with its extra buffer types on or off in this block.
    llama-cpp-python 0.3.36 has no constructor argument for ``use_extra_bufts``: its
    ``Llama`` starts from ``llama_model_default_params()``, so that is wrapped for the
    duration of the load."""
    import llama_cpp
    import llama_cpp.llama as llama_mod

    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = on
        return p

    llama_mod.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        llama_mod.llama_cpp.llama_model_default_params = orig


def _matrix(rng, type_name: str, n_in: int, n_out: int):
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name not in _KQ_SCALES:
        x = rng.normal(0.0, n_in**-0.5, size=(n_out, n_in)).astype(np.float32)
        return gguf.quants.quantize(x, qtype), qtype
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = n_out * n_in // block
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in _KQ_SCALES[type_name]:
        b[:, off : off + 2] = rng.uniform(0.001, 0.004, size=(n_blocks, 1)).astype("<f2").view(np.uint8)
    return b.reshape(n_out, n_in // block * size), qtype


def write_probe_model(path: str) -> str:
    """Write the probe's tiny GGUF to ``path`` (random weights, a byte-level BPE vocabulary
    of 64 tokens); returns ``path``."""
    import gguf

    rng = np.random.default_rng(23)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("powerinfer-reference-probe")
    w.add_context_length(512)
    w.add_embedding_length(_N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(_N_FF)
    w.add_head_count(_N_HEAD)
    w.add_head_count_kv(_N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    chars = "Ġabcdefghijklmnopqrstuvwxyz.,"
    tokens = ["<|endoftext|>"] + list(chars)
    merges = []
    for i in range(_N_VOCAB - len(tokens)):  # two-character tokens, each from a merge of known ones
        a, b = chars[1 + i % 26], chars[1 + (i * 7) % 26]
        if a + b not in tokens:
            merges.append(f"{a} {b}")
            tokens.append(a + b)
    tokens += [f"<|pad{i}|>" for i in range(_N_VOCAB - len(tokens))]
    types = [int(gguf.TokenType.CONTROL)] + [int(gguf.TokenType.NORMAL)] * (len(chars) + len(merges))
    types += [int(gguf.TokenType.CONTROL)] * (_N_VOCAB - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)

    def add(name, type_name, n_in, n_out):
        data, qtype = _matrix(rng, type_name, n_in, n_out)
        w.add_tensor(name, data, raw_dtype=qtype)  # data: (rows, bytes per row)

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.normal(size=_N_EMBD)).astype(np.float32))

    add("token_embd.weight", _TYPES["token_embd"], _N_EMBD, _N_VOCAB)
    norm("blk.0.attn_norm.weight")
    for role in ("attn_q", "attn_k", "attn_v", "attn_output"):
        add(f"blk.0.{role}.weight", _TYPES[role], _N_EMBD, _N_EMBD)
    norm("blk.0.ffn_norm.weight")
    add("blk.0.ffn_gate.weight", _TYPES["ffn_gate"], _N_EMBD, _N_FF)
    add("blk.0.ffn_up.weight", _TYPES["ffn_up"], _N_EMBD, _N_FF)
    add("blk.0.ffn_down.weight", _TYPES["ffn_down"], _N_FF, _N_EMBD)
    norm("output_norm.weight")
    add("output.weight", _TYPES["output"], _N_EMBD, _N_VOCAB)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(path: str, n_threads: int, extra_bufts: bool) -> np.ndarray:
    import llama_cpp

    with use_extra_buffer_types(extra_bufts):
        llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=32,
            n_batch=16,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            logits_all=True,
            verbose=False,
        )
    llm.eval(list(range(1, 9)))
    llm.eval([9])
    out = np.array(llm.scores[:9], dtype=np.float32)
    llm.close()
    return out


def main(argv: list[str]) -> int:
    if os.environ.get(FORCE_FAIL_ENV) == "1":
        os.abort()
    n_threads = int(argv[0]) if argv else 2
    with tempfile.TemporaryDirectory(prefix="pi-ref-probe-") as d:
        path = write_probe_model(os.path.join(d, "probe.gguf"))
        on = _logits(path, n_threads, True)
        off = _logits(path, n_threads, False)
    if not np.isfinite(on).all():
        print("logits with extra buffer types are not finite", file=sys.stderr)
        return 3
    err = float(np.abs(on - off).max())
    scale = float(np.abs(off).max())
    if not err <= 5e-2 * scale:  # another summation order: ~1e-3 of the largest logit here; broken kernels: ~1
        print(
            f"logits with extra buffer types differ from the plain kernels' by {err:.3g} (max |logit| {scale:.3g})",
            file=sys.stderr,
        )
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
