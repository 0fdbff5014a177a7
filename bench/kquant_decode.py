"""K-quant decode speed against llama.cpp on a Q4_K_M llama-family file (issue 8).

SmolLM2's n_embd (576) is not a multiple of 256, so llama.cpp's quantizer leaves most of
its tensors in other types; this writes (once, into --dir) a synthetic llama-shaped F16
GGUF whose dimensions suit K-quants (n_embd 1024, n_ff 2816 by default), quantizes it
to Q4_K_M with llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``), and runs
``powerinfer-backend bench`` on the result: our engine and llama.cpp on the same file
and thread count, one after the other, with the ratios.

    python bench/kquant_decode.py [--layers 8] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gguf import GGMLQuantizationType as T  # noqa: E402

from tests.fixtures.tiny_gguf import write_tiny_llama  # noqa: E402
from powerinfer_backend.cli.bench import format_table, run_bench  # noqa: E402


def build(dir_: Path, layers: int, n_embd: int, n_ff: int) -> Path:
    """The Q4_K_M file (made once): F16 synthetic llama, then llama.cpp's quantizer."""
    import llama_cpp

    out = dir_ / f"kq-{layers}x{n_embd}x{n_ff}.Q4_K_M.gguf"
    if out.exists():
        return out
    dir_.mkdir(parents=True, exist_ok=True)
    f16 = dir_ / f"kq-{layers}x{n_embd}x{n_ff}.F16.gguf"
    write_tiny_llama(f16, n_embd=n_embd, n_ff=n_ff, n_layer=layers, n_head=n_embd // 64, n_head_kv=n_embd // 256,
                     n_vocab=256, n_ctx_train=2048, types={"matrix": T.F16, "token_embd": T.F16, "output": T.F16})
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    f16.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer-kquant", help="where the model file is made (once)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=1024)
    ap.add_argument("--n-ff", type=int, default=2816)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    path = build(Path(a.dir), a.layers, a.n_embd, a.n_ff)
    from gguf import GGUFReader

    types = sorted({t.tensor_type.name for t in GGUFReader(str(path)).tensors})
    r = run_bench(str(path), n_threads=a.threads, sparse="off")
    r["tensor_types"] = types
    print(json.dumps(r) if a.json else format_table(r) + f"\ntensor types: {', '.join(types)}")


if __name__ == "__main__":
    main()
