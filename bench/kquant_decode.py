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
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's code first; the imports below follow it (noqa: E402)

from synth_models import synthetic_llama, tensor_types  # noqa: E402

from powerinfer_backend.cli.bench import format_table, run_bench  # noqa: E402


def build(dir_: Path, layers: int, n_embd: int, n_ff: int) -> Path:
    """The Q4_K_M file (made once): F16 synthetic llama, then llama.cpp's quantizer."""
    return synthetic_llama(
        dir_,
        f"kq-{layers}x{n_embd}x{n_ff}",
        ["Q4_K_M"],
        n_embd=n_embd,
        n_ff=n_ff,
        n_layer=layers,
        n_head=n_embd // 64,
        n_head_kv=n_embd // 256,
    )["Q4_K_M"]


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
    types = tensor_types(path)
    r = run_bench(str(path), n_threads=a.threads, sparse="off")
    r["tensor_types"] = types
    print(json.dumps(r) if a.json else format_table(r) + f"\ntensor types: {', '.join(types)}")


if __name__ == "__main__":
    main()
