"""Synthetic llama GGUF files quantized by llama.cpp's own quantizer, made once and cached.

One F16 source of random weights (``tests.fixtures.tiny_gguf.write_tiny_llama``) is
written, quantized to every requested llama.cpp file type with
``llama_cpp.llama_model_quantize`` (the code llama.cpp's ``llama-quantize`` runs, so the
tensor types per role are llama.cpp's: e.g. Q4_K_M keeps some ffn_down / attn_v in
Q6_K), and deleted. Files already present are reused, so reruns cost nothing.
Used by bench/kquant_decode.py and bench/mem7b.py.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: file type name -> llama.cpp's LLAMA_FTYPE_MOSTLY_* attribute
FTYPES = {
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
}

DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "powerinfer_backend" / "bench"


def quantize(src: Path, out: Path, ftype: str, n_threads: int = 0) -> None:
    """llama.cpp's quantizer: ``src`` (F16/F32 GGUF) -> ``out`` in file type ``ftype``
    (a key of :data:`FTYPES`); written to a temporary name and renamed when complete.

    Raises:
        ValueError: unknown ftype. SystemExit: the quantizer failed (its return code).
    """
    import llama_cpp

    if ftype not in FTYPES:
        raise ValueError(f"ftype must be one of {', '.join(FTYPES)}, got {ftype!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[ftype])
    params.nthread = n_threads
    tmp = out.with_name(out.name + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize({src} -> {ftype}) failed ({rc})")
    tmp.replace(out)


def synthetic_llama(
    dir_: Path,
    stem: str,
    ftypes,
    *,
    n_embd: int,
    n_ff: int,
    n_layer: int,
    n_head: int,
    n_head_kv: int,
    n_vocab: int = 256,
    n_ctx_train: int = 2048,
    seed: int = 0,
    extra_kv=None,
    log=print,
) -> dict[str, Path]:
    """Paths ``dir_/<stem>.<ftype>.gguf`` for each of ``ftypes``, making the missing ones
    from one F16 source (written, quantized, deleted).

    Args:
        dir_: cache folder (created). stem: file name stem; it should encode the shape.
        ftypes: keys of :data:`FTYPES`.
        n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx_train: llama hyper-parameters.
        seed: weights' random seed. extra_kv: metadata overrides (``write_tiny_llama``'s),
            e.g. ``{"powerinfer.ffn_act": "relu"}``.
        log: where progress lines go.

    Returns:
        ftype -> path.
    """
    from gguf import GGMLQuantizationType as T

    from tests.fixtures.tiny_gguf import write_tiny_llama

    dir_ = Path(dir_)
    dir_.mkdir(parents=True, exist_ok=True)
    out = {f: dir_ / f"{stem}.{f}.gguf" for f in ftypes}
    missing = [f for f, p in out.items() if not p.exists()]
    if not missing:
        return out
    src = dir_ / f"{stem}.F16.gguf.src"
    if not src.exists():
        t = time.time()
        tmp = src.with_name(src.name + ".part")
        write_tiny_llama(
            tmp,
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_ff=n_ff,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ctx_train=n_ctx_train,
            seed=seed,
            extra_kv=extra_kv,
            types={"matrix": T.F16, "token_embd": T.F16, "output": T.F16},
        )
        tmp.replace(src)
        log(f"wrote {src} ({src.stat().st_size / 2**30:.2f} GiB) in {time.time() - t:.0f} s")
    for f in missing:
        t = time.time()
        quantize(src, out[f], f)
        log(f"quantized {out[f].name} ({out[f].stat().st_size / 2**30:.2f} GiB) in {time.time() - t:.0f} s")
    src.unlink()
    return out


def tensor_types(path) -> list[str]:
    """The sorted ggml type names of the file's tensors."""
    from gguf import GGUFReader

    return sorted({t.tensor_type.name for t in GGUFReader(str(path)).tensors})
