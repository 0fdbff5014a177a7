"""Aggregate decode tokens/s of concurrent clients: ``serve --parallel N`` vs ``--parallel 1``
vs llama-cpp-python's server, same model, threads and context, measured in one run; and the
time to first token of concurrent streaming clients.

    python bench/serve_parallel.py [--model PATH] [--clients 4] [--parallel 4] [--threads 2]
                                   [--tokens 64] [--repeats 3] [--ttft-clients 8]
                                   [--servers ours1,oursN,llama_cpp] [--json OUT]

The servers are started together, each on a free loopback port (idle ones use no CPU), and
measured in turn, round by round, so each ratio is taken from rounds run minutes apart at
most. In a throughput round ``--clients`` clients each send one ``/v1/completions`` request
at once (distinct prompts, greedy, end-of-generation tokens banned through ``logit_bias`` so
every request decodes ``--tokens`` tokens); the figure is the completion tokens of all
clients over the wall time of the round: the median of ``--repeats`` rounds, after one
warm-up round; ratios are the medians of the per-round ratios. In a first-token round
``--ttft-clients`` clients each send a streaming request at once (same bodies); a client's
time to first token runs from its request to the first chunk with text; p50 / p95 are over
all clients of ``--repeats`` rounds. llama-cpp-python's server (``python -m
llama_cpp.server``, needs its ``[server]`` extra) decodes one request at a time (started with
``--interrupt_requests False``: by default a new request ends the running stream).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code first; the imports below follow it (noqa: E402)

from powerinfer_backend.loader.models import default_model_path  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "The history of the Roman empire",
    "A recipe for bread:",
    "def quicksort(xs):",
    "The weather today is",
    "My favourite book is",
    "In the year 2050,",
    "Dear diary,",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, model: str, threads: int, n_ctx: int, parallel: int) -> tuple:
    """-> (process, base url) once /v1/models answers."""
    port = _port()
    if kind == "llama_cpp":
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            model,
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_ctx",
            str(n_ctx),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--verbose",
            "False",
            "--interrupt_requests",
            "False",
        ]  # queue requests, not cut a stream short
    else:
        cmd = [
            sys.executable,
            "-m",
            "powerinfer_backend",
            "serve",
            "--model",
            model,
            "--threads",
            str(threads),
            "--ctx-size",
            str(n_ctx),
            "--parallel",
            str(parallel),
            "--port",
            str(port),
            "--max-queue",
            "64",
        ]
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


def _body(i: int, tokens: int, ban: dict, stream: bool) -> dict:
    return {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": tokens,
        "temperature": 0,
        "logit_bias": ban,
        "stream": stream,
    }


def together(url: str, clients: int, fn) -> tuple:
    """``fn(i, client)`` for i < ``clients`` in as many threads, started at once: each HTTP
    client is made and connected beforehand (making one takes tens of ms, which would
    stagger the requests) -> (results, seconds from the start to the last one's end)."""
    conns = [httpx.Client(base_url=url, timeout=600) for _ in range(clients)]
    try:
        for c in conns:
            c.get("/v1/models").raise_for_status()  # the keep-alive connection the request reuses
        start = threading.Barrier(clients + 1)

        def one(i):
            start.wait()
            return fn(i, conns[i])

        with ThreadPoolExecutor(clients) as ex:
            futures = [ex.submit(one, i) for i in range(clients)]
            start.wait()
            t0 = time.perf_counter()
            results = [f.result() for f in futures]
        return results, time.perf_counter() - t0
    finally:
        for c in conns:
            c.close()


def round_tps(url: str, clients: int, tokens: int, ban: dict) -> tuple:
    """One round of ``clients`` concurrent requests -> (completion tokens, wall seconds)."""

    def one(i, c):
        r = c.post("/v1/completions", json=_body(i, tokens, ban, False))
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    counts, seconds = together(url, clients, one)
    return sum(counts), seconds


def round_ttft(url: str, clients: int, tokens: int, ban: dict) -> list:
    """One round of ``clients`` concurrent streaming requests -> each one's seconds from its
    request to its first chunk with text."""

    def one(i, c):
        t0 = time.perf_counter()
        first = None
        with c.stream("POST", "/v1/completions", json=_body(i, tokens, ban, True)) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{url}: a stream without text")
        return first

    return together(url, clients, one)[0]


def percentile(xs: list, q: float) -> float:
    """The ``q`` quantile of ``xs`` (linear interpolation, numpy's default)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ttft-clients", type=int, default=8, help="streaming clients of a first-token round (0: none)")
    ap.add_argument("--servers", default="ours1,oursN,llama_cpp")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    model = args.model or default_model_path()
    from powerinfer_backend.text.tokenizer import LlamaCppTokenizer

    tok = LlamaCppTokenizer(model, n_ctx=args.ctx_size)
    eog = [t for t in range(tok.llama.n_vocab()) if tok.is_eog(t)]
    ban = {str(t): -100 for t in eog}
    kinds = {"ours1": ("ours", 1), "oursN": ("ours", args.parallel), "llama_cpp": ("llama_cpp", 1)}
    running = {}
    try:
        for name in args.servers.split(","):
            kind, parallel = kinds[name]
            label = f"powerinfer_backend --parallel {parallel}" if kind == "ours" else "llama_cpp.server"
            try:
                proc, url = start(kind, model, args.threads, args.ctx_size, parallel)
            except Exception as e:  # e.g. llama-cpp-python installed without its [server] extra
                print(f"{label}: not run ({e})")
                continue
            running[name] = (label, proc, url)
            round_tps(url, args.clients, 8, ban)  # warm-up
        tps = {name: [] for name in running}
        ttft = {name: [] for name in running}
        for _ in range(args.repeats):  # interleaved: each round of each server, in turn
            for name, (_, _, url) in running.items():
                n, dt = round_tps(url, args.clients, args.tokens, ban)
                tps[name].append(n / dt)
            if args.ttft_clients:
                for name, (_, _, url) in running.items():
                    ttft[name] += round_ttft(url, args.ttft_clients, args.tokens, ban)
    finally:
        for _, proc, _ in running.values():
            proc.terminate()
            proc.wait(timeout=30)
    results = {}
    for name, (label, _, _) in running.items():
        r = results[name] = {"label": label, "tokens_per_s": statistics.median(tps[name]), "rounds": tps[name]}
        print(
            f"{label:36s} {r['tokens_per_s']:8.1f} tok/s aggregate, median of "
            f"{' '.join(f'{x:.1f}' for x in tps[name])} ({args.clients} clients x {args.tokens} tokens)"
        )
        if ttft[name]:
            r["ttft_p50_ms"], r["ttft_p95_ms"] = (percentile(ttft[name], q) * 1e3 for q in (0.5, 0.95))
            print(
                f"{label:36s} time to first token p50 {r['ttft_p50_ms']:.0f} ms, p95 {r['ttft_p95_ms']:.0f} ms "
                f"({args.ttft_clients} concurrent streaming clients, {len(ttft[name])} requests)"
            )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; threads {args.threads}, n_ctx {args.ctx_size}")

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(tps[a], tps[b], strict=True))

    if "ours1" in results:
        for name, r in results.items():
            if name != "ours1":
                r["vs_parallel_1"] = ratio(name, "ours1")
                print(f"{r['label']}: {r['vs_parallel_1']:.2f}x powerinfer_backend --parallel 1")
    if "oursN" in results and "llama_cpp" in results:
        results["oursN"]["vs_llama_cpp"] = ratio("oursN", "llama_cpp")
        vs = results["oursN"]["vs_llama_cpp"]
        print(f"powerinfer_backend --parallel {args.parallel}: {vs:.2f}x llama_cpp.server")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
