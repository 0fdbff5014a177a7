"""Calibration cost and quality on SmolLM2 (issue 16 item 6): calibrate on the first 90%
of tinyshakespeare at the default budget, then perplexity dense vs sparse on the last 10%
(which calibration never saw). Prints wall time, process CPU time (less sensitive to a
shared host), load average, sparsity and the unseen-tail perplexity change as one JSON line.

Usage: python bench/calibrate_cost.py [--threads 2] [--chunks 8] [--reduced] [--no-speed] [--out PATH]
(``--reduced``: the CI test's smaller calibration: 2048 statistics tokens, 1024 held out)."""

import argparse
import inspect
import json
import os
import tempfile
import time
from pathlib import Path

from powerinfer_backend import Llama
from powerinfer_backend.loader.models import default_model_path
from powerinfer_backend.sparsity.calibrate import calibrate
from powerinfer_backend.sparsity.perplexity import perplexity, read_text

ROOT = Path(__file__).resolve().parents[1]
#: shared/data in the checkout's parent or any folder above it (a worktree sits deeper)
TEXT = (
    next(
        (p / "shared" / "data" for p in ROOT.parents if (p / "shared" / "data").is_dir()),
        ROOT.parent / "shared" / "data",
    )
    / "tinyshakespeare.txt"
)


def tail_ppl(model, text, sparse, threads, chunks):
    with Llama(model, n_ctx=512, n_batch=512, n_threads=threads, verbose=False, sparse=sparse) as llm:
        toks = llm.tokenize(text.encode())
        be = llm._backend

        def chunk(c):
            be.truncate(0)
            return be.eval(c, logits_all=True)

        ppl = perplexity(toks, chunk, 512, chunks)["ppl"]
        st = llm.stats()
        return ppl, st["ffn_sparsity"], st["mode"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--reduced", action="store_true")
    ap.add_argument("--no-speed", action="store_true", help="skip the decode speed check (if calibrate has one)")
    ap.add_argument("--out", default=None, help="keep the sidecar here (default: a temporary folder)")
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M, the packaged test model)")
    args = ap.parse_args()
    model = args.model or default_model_path()
    cut = int(os.path.getsize(TEXT) * 0.9)
    kw = dict(max_bytes=cut, n_threads=args.threads, progress=False, log=print)
    if args.reduced:
        kw.update(tokens=2048, heldout_tokens=1024)
    if args.no_speed and "speed_check" in inspect.signature(calibrate).parameters:
        kw["speed_check"] = False
    out = args.out or os.path.join(tempfile.mkdtemp(), "sparsity.gguf")
    load0 = os.getloadavg()
    w0, c0 = time.perf_counter(), time.process_time()
    prof = calibrate(model, str(TEXT), out=out, **kw)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    load1 = os.getloadavg()
    text = read_text(str(TEXT), offset_bytes=cut)
    ppl_d, _, _ = tail_ppl(model, text, "off", args.threads, args.chunks)
    ppl_s, sp, mode = tail_ppl(model, text, out, args.threads, args.chunks)
    print(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "load_before": load0,
                "load_after": load1,
                "expected_sparsity": round(float(prof.layer_sparsity.mean()), 4),
                "heldout_ppl_change": round(prof.info["ppl_sparse"] / prof.info["ppl_dense"] - 1, 5),
                "unseen_ppl_dense": round(ppl_d, 4),
                "unseen_ppl_sparse": round(ppl_s, 4),
                "unseen_ppl_change": round(ppl_s / ppl_d - 1, 5),
                "unseen_sparsity": round(sp, 4),
                "mode": mode,
                "method": prof.info.get("method"),
                "speed": {k: v for k, v in prof.info.items() if k.startswith(("speed", "decode_"))},
                "calibration_log": {k: prof.info.get(k) for k in ("forms_tried", "threshold_on", "tokens_search")},
                "reduced": args.reduced,
                "threads": args.threads,
                "sidecar": out,
            }
        )
    )


if __name__ == "__main__":
    main()
