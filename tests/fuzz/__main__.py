"""The long fuzz run (docs/reliability.md), from the repository root:

    python -m tests.fuzz --inputs 100000 --seed 1 --out /tmp/fuzz [--jobs 2] [--real-every 50]

prints the summary as JSON (also written to OUT/summary.json) and exits 1 if any input
crashed, hung, ran out of memory or raised an unexpected exception type (saved in
OUT/crashes/ with their seed and mutation; ``--start I --inputs 1`` with the same
``--seed`` and ``--real-every`` rebuilds input I alone)."""

from __future__ import annotations

import argparse
import json
import sys

from powerinfer_backend.loader.models import default_model_path

from .harness import run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="run seed: input i depends only on (seed, i)")
    p.add_argument("--start", type=int, default=0, help="first input index")
    p.add_argument("--out", default="/tmp/powerinfer-fuzz")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per tiny input (default 10, ASan 30; real-model inputs: at least 60, ASan 180)",
    )
    p.add_argument("--mem-mb", type=int, default=1024)
    p.add_argument(
        "--real-every",
        type=int,
        default=50,
        help="every N-th input mutates the real SmolLM2 header (0: tiny seeds only)",
    )
    p.add_argument("--n-threads", type=int, default=1)
    a = p.parse_args(argv)
    s = run(
        a.inputs,
        a.seed,
        a.out,
        jobs=a.jobs,
        timeout=a.timeout,
        mem_mb=a.mem_mb,
        real_model=default_model_path() if a.real_every else None,
        real_every=a.real_every,
        n_threads=a.n_threads,
        start=a.start,
        progress=True,
    )
    print(json.dumps(s.as_dict(), indent=1))
    return 1 if s.bad() else 0


if __name__ == "__main__":
    sys.exit(main())
