"""Aggregate decode tokens/s of concurrent clients: ``serve --parallel N`` vs ``--parallel 1``
vs llama-cpp-python's server, same model, threads and context, measured in one run.

    python bench/serve_parallel.py [--model PATH] [--clients 4] [--parallel 4] [--threads 2]
                                   [--tokens 64] [--repeats 2] [--servers ours1,oursN,llama_cpp] [--json OUT]

Each server is started on a free loopback port; ``--clients`` clients each send one
``/v1/completions`` request at once (distinct prompts, greedy, end-of-generation tokens
banned through ``logit_bias`` so every request decodes ``--tokens`` tokens); the figure
is the completion tokens of all clients over the wall time of the round (best of
``--repeats``, after one warm-up round). llama-cpp-python's server (``python -m
llama_cpp.server``, needs its ``[server]`` extra) decodes one request at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.loader.models import default_model_path  # noqa: E402

PROMPTS = ["Once upon a time", "The history of the Roman empire", "A recipe for bread:", "def quicksort(xs):",
           "The weather today is", "My favourite book is", "In the year 2050,", "Dear diary,"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, model: str, threads: int, n_ctx: int, parallel: int) -> tuple:
    """-> (process, base url) once /v1/models answers."""
    port = _port()
    if kind == "llama_cpp":
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx), "--port", str(port), "--host", "127.0.0.1",
               "--verbose", "False"]
    else:
        cmd = [sys.executable, "-m", "powerinfer_backend", "serve", "--model", model, "--threads", str(threads),
               "--ctx-size", str(n_ctx), "--parallel", str(parallel), "--port", str(port), "--max-queue", "64"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{kind} did not start")
        time.sleep(0.3)


def round_tps(url: str, clients: int, tokens: int, ban: dict) -> tuple:
    """One round of ``clients`` concurrent requests -> (completion tokens, wall seconds)."""
    def one(i):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 0, "logit_bias": ban}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        n = sum(ex.map(one, range(clients)))
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--servers", default="ours1,oursN,llama_cpp")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    model = args.model or default_model_path()
    from powerinfer_backend.text.tokenizer import LlamaCppTokenizer

    tok = LlamaCppTokenizer(model, n_ctx=args.ctx_size)
    eog = [t for t in range(tok.llama.n_vocab()) if tok.is_eog(t)]
    ban = {str(t): -100 for t in eog}
    kinds = {"ours1": ("ours", 1), "oursN": ("ours", args.parallel), "llama_cpp": ("llama_cpp", 1)}
    results = {}
    for name in args.servers.split(","):
        kind, parallel = kinds[name]
        label = f"powerinfer_backend --parallel {parallel}" if kind == "ours" else "llama_cpp.server"
        try:
            proc, url = start(kind, model, args.threads, args.ctx_size, parallel)
        except Exception as e:  # e.g. llama-cpp-python installed without its [server] extra
            print(f"{label}: not run ({e})")
            continue
        try:
            round_tps(url, args.clients, 8, ban)  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                n, dt = round_tps(url, args.clients, args.tokens, ban)
                best = max(best, n / dt)
            results[name] = {"label": label, "tokens_per_s": best}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        print(f"{label:36s} {best:8.1f} tok/s aggregate ({args.clients} clients x {args.tokens} tokens)", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; threads {args.threads}, n_ctx {args.ctx_size}")
    base = results.get("ours1", {}).get("tokens_per_s")
    for name, r in results.items():
        if base and name != "ours1":
            r["vs_parallel_1"] = r["tokens_per_s"] / base
            print(f"{r['label']}: {r['vs_parallel_1']:.2f}x powerinfer_backend --parallel 1")
    if "oursN" in results and "llama_cpp" in results:
        ratio = results["oursN"]["tokens_per_s"] / results["llama_cpp"]["tokens_per_s"]
        print(f"powerinfer_backend --parallel {args.parallel}: {ratio:.2f}x llama_cpp.server")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
