"""Draw the documentation's pictures into docs/img/ (committed; rerun after new numbers):

* ``placement.png``: ``powerinfer-backend plan``'s own plot (``write_plot``) of the embedded
  SmolLM2 at a budget, counted with ggml's CPU buffer rule (no GPU needed); frequencies
  from ``--sidecar`` (a calibration sidecar), else the model's own, else uniform;
* ``bench.png``: decode and prefill tokens/s from a ``powerinfer-backend bench --json``
  file, ours against llama.cpp measured in the same run.

Usage (needs the ``[docs]`` or ``[plot]`` extra for matplotlib)::

    powerinfer-backend bench --threads 2 --json > docs/data/bench-smollm2.json
    python docs/scripts/figures.py [--bench docs/data/bench-smollm2.json] [--sidecar FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
IMG = DOCS / "img"
sys.path.insert(0, str(DOCS.parent))  # this checkout's package, installed or not


def placement(out: Path, budget: str, n_ctx: int, n_batch: int, sidecar) -> Path:
    """The plan's plot for the embedded model at ``budget`` (a size string)."""
    from powerinfer_backend.hybrid.placement import parse_vram_budget, plan_for_model, write_plot
    from powerinfer_backend.loader.models import default_model_path

    with tempfile.TemporaryDirectory() as tmp:  # the plan file is not kept: only its picture
        plan = plan_for_model(
            default_model_path(),
            parse_vram_budget(budget),
            n_ctx=n_ctx,
            n_batch=n_batch,
            sparsity_sidecar=sidecar or "auto",
            out=Path(tmp) / "placement.json",
        )
    return write_plot(plan, out, force=True)


def bench(src: Path, out: Path) -> Path:
    """Grouped bars of ``bench --json``'s tokens/s: decode and prefill, per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads(src.read_text(encoding="utf-8"))
    engines = [
        (k, label)
        for k, label in (
            ("ours", "powerinfer_backend (dense)"),
            ("ours_sparse", "powerinfer_backend (sparse)"),
            ("llama_cpp", "llama.cpp (llama-cpp-python)"),
        )
        if k in r
    ]
    metrics = [
        ("decode_tok_s", f"decode ({r.get('n_decode', '?')} tokens)"),
        ("prefill_tok_s", f"prefill ({r.get('n_prefill', '?')} tokens)"),
    ]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(engines)
    for j, (key, label) in enumerate(engines):
        xs = [i + (j - (len(engines) - 1) / 2) * width for i in range(len(metrics))]
        vals = [r[key][m] for m, _ in metrics]
        bars = ax.bar(xs, vals, width, label=label)
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_xticks(range(len(metrics)), [m[1] for m in metrics])
    ax.set_ylabel("tokens / s")
    model = Path(str(r.get("model", "model"))).name
    load = f"\nload average {r['load_average']}" if "load_average" in r else ""
    ratio = r.get("ratio", {})
    ratios = (
        f"; ours / llama.cpp: decode {ratio['decode']:.2f}x, prefill {ratio['prefill']:.2f}x"
        if {"decode", "prefill"} <= set(ratio)
        else ""
    )
    ax.set_title(f"{model}, {r.get('threads', '?')} threads{ratios}{load}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--bench",
        type=Path,
        default=DOCS / "data" / "bench-smollm2.json",
        help="a `powerinfer-backend bench --json` file (default docs/data/bench-smollm2.json)",
    )
    p.add_argument("--sidecar", default=None, help="calibration sidecar with firing frequencies for the plan")
    p.add_argument("--budget", default="72MiB", help="the plan's budget (default 72MiB)")
    p.add_argument("--ctx", type=int, default=512, help="the plan's n_ctx (default 512)")
    p.add_argument("--batch", type=int, default=32, help="the plan's n_batch (default 32)")
    a = p.parse_args(argv)
    print(placement(IMG / "placement.png", a.budget, a.ctx, a.batch, a.sidecar))
    print(bench(a.bench, IMG / "bench.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
