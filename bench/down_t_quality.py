"""What the transposed down's storage type costs in quality: SmolLM2 (or --model) with
every layer's FFN over down_t at threshold 0 (nothing skipped but exact zeros), per
down_t type, against the dense path over the file's own ffn_down: perplexity on the
last 10% of tinyshakespeare (--chunks x --ctx tokens) and the largest logit difference.

    python bench/down_t_quality.py [--chunks 4] [--ctx 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down  # noqa: E402
from powerinfer_backend.engine.native import NativeContext, NativeModel  # noqa: E402
from powerinfer_backend.loader import load_gguf  # noqa: E402
from powerinfer_backend.loader.models import default_model_path  # noqa: E402
from powerinfer_backend.sparsity.perplexity import perplexity  # noqa: E402
from powerinfer_backend.text.tokenizer import LlamaCppTokenizer  # noqa: E402

TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def _recording_eval(ctx, rows: list):
    """perplexity's chunk evaluator over ``ctx`` that also keeps every chunk's logits in ``rows``."""

    def chunk(c):
        ctx.truncate(0)
        out = ctx.eval(c, logits_all=True)
        rows.append(out.copy())
        return out

    return chunk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="f32,f16,q8_0")
    a = ap.parse_args()
    path = a.model or default_model_path()
    data = TEXT.read_bytes()
    toks = LlamaCppTokenizer(path).tokenize(data[int(len(data) * 0.9) :])
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    print(f"{Path(path).name}: automatic down_t {down_t_dtype(g)}; {a.chunks} x {a.ctx} tokens of the last 10%")
    print(f"{'FFN down':<22} {'perplexity':>10} {'vs dense':>9} {'max |dlogit|':>12}")
    base = ref = None
    for kind in ["dense"] + a.types.split(","):
        ctx = NativeContext(m, n_ctx=a.ctx, n_batch=a.ctx, n_threads=a.threads)
        if kind != "dense":
            for layer in range(g.hparams.n_layer):
                ctx.set_ffn_sparsity(layer, transposed_down(g, layer, dtype=kind), 0.0)
        rows: list = []
        ppl = perplexity(toks, _recording_eval(ctx, rows), a.ctx, a.chunks)["ppl"]
        logits = np.concatenate(rows)
        if base is None:
            base, ref = ppl, logits
        name = "ffn_down (dense)" if kind == "dense" else f"down_t {kind.upper()}"
        print(f"{name:<22} {ppl:>10.3f} {ppl / base - 1:>+9.2%} {np.abs(logits - ref).max():>12.3f}")
        ctx.close()
    m.close()


if __name__ == "__main__":
    main()
