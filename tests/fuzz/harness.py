"""The GGUF fuzz run: mutants of the seeds (:mod:`tests.fuzz.seeds`, :mod:`tests.fuzz.mutate`)
loaded one by one in forks of warm workers (:mod:`tests.fuzz.worker`), each outcome counted,
every crasher saved with its seed and mutation. Input ``i`` of a run with seed ``s`` depends
only on ``(s, i)``, so any input can be rebuilt alone and the run is the same for any
number of jobs.

Outcomes (:func:`classify`):

- ``loaded``: ``Llama(path, n_ctx=32)`` loaded the file and evaluated two tokens;
- ``rejected``: a Python exception of one of our documented types (:data:`ACCEPTED`);
- ``unexpected``: any other Python exception (TypeError, KeyError, UnicodeDecodeError, ...);
- ``crash``: the child died by a signal or a non-zero exit without reporting (an abort in
  llama.cpp or ggml, a segfault, a sanitizer report);
- ``hang``: no answer within the per-input timeout (the child is killed);
- ``oom``: under ASan, the child's resident memory passed the limit (it is killed).

Only ``loaded`` and ``rejected`` are acceptable; everything else is saved under
``OUT/crashes/``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.fixtures import ROOT

from .seeds import Seed, real_seed, tiny_seeds, write_mutant

#: exception types a hostile file may raise (docs/reliability.md): ValueError for every
#: malformed or inconsistent file, NotImplementedError for a valid file using something the
#: engine does not support, MemoryError for an allocation refused at the memory limit
ACCEPTED = ("ValueError", "NotImplementedError", "MemoryError")
#: ValueError subclasses that are accidents, not our messages
_NOT_OURS = ("UnicodeError",)
BAD_OUTCOMES = ("crash", "hang", "oom", "unexpected")


def classify(reply: dict) -> str:
    """The outcome of one worker reply (see the module docstring)."""
    if reply["hang"]:
        return "hang"
    if reply.get("oom"):
        return "oom"
    result = reply["result"]
    if reply["status"] != 0 or result is None:
        return "crash"
    exc = result.get("exception")
    if exc is None:
        return "loaded"
    mro = exc["mro"]
    if any(t in mro for t in ACCEPTED) and not any(t in mro for t in _NOT_OURS):
        return "rejected"
    return "unexpected"


def under_asan() -> bool:
    return "libasan" in os.environ.get("LD_PRELOAD", "")


@dataclass
class Summary:
    inputs: int = 0
    wall_s: float = 0.0
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    by_seed: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    by_kind: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    exceptions: collections.Counter = field(default_factory=collections.Counter)
    rejected_unnamed: int = 0  # rejections whose message does not name the file
    unnamed_examples: list = field(default_factory=list)  # (input, mutation, message) of the first few
    saved: list = field(default_factory=list)
    child_s: collections.Counter = field(default_factory=collections.Counter)  # children's wall time per outcome

    @property
    def rate(self) -> float:
        return self.inputs / self.wall_s if self.wall_s else 0.0

    def bad(self) -> int:
        return sum(self.outcomes[k] for k in BAD_OUTCOMES)

    def as_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "wall_s": round(self.wall_s, 2),
            "inputs_per_s": round(self.rate, 2),
            "outcomes": dict(self.outcomes),
            "by_seed": {k: dict(v) for k, v in self.by_seed.items()},
            "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
            "exceptions": dict(self.exceptions),
            "child_ms_mean": {k: round(1000 * v / self.outcomes[k], 1) for k, v in self.child_s.items()},
            "rejected_unnamed": self.rejected_unnamed,
            "unnamed_examples": self.unnamed_examples,
            "saved": self.saved,
        }


class _Worker:
    """One warm worker subprocess (restarted if it dies)."""

    def __init__(self, warm_path: str, env: dict):
        self._args = [sys.executable, "-m", "tests.fuzz.worker", warm_path]
        self._env = env
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self._args, cwd=ROOT, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the fuzz worker did not start (python -m tests.fuzz.worker)")

    def run(self, req: dict) -> dict:
        for _attempt in (0, 1):
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
                if line:
                    return json.loads(line)
            except (BrokenPipeError, OSError):
                pass
            self.close()
            self._start()
        raise RuntimeError("the fuzz worker died twice on one input")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=30)


def worker_env(mem_mb: int) -> dict:
    """The workers' environment: one BLAS thread (the fork must not copy running threads),
    no gdb on ggml_abort; under ASan its allocator limit (RLIMIT_AS would kill ASan)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", GGML_NO_BACKTRACE="1")
    if under_asan():
        opts = [o for o in env.get("ASAN_OPTIONS", "").split(":") if o]
        opts += ["allocator_may_return_null=1", f"max_allocation_size_mb={mem_mb}"]
        env["ASAN_OPTIONS"] = ":".join(opts)
    return env


def _describe_kinds(mutation: str) -> list[str]:
    return [step.split(" ", 1)[0] for step in mutation.split("; ")]


def input_for(i: int, run_seed: int, tiny: list[Seed], real: Seed | None, real_every: int):
    """Input ``i``: (seed, mutated bytes, description). Every ``real_every``-th input (if a
    real seed is given) mutates the real model's header."""
    rng = np.random.default_rng([run_seed, i])
    if real is not None and real_every and i % real_every == real_every - 1:
        seed = real
    else:
        seed = tiny[int(rng.integers(0, len(tiny)))]
    data, mutation = seed.mutator.mutant(rng)
    return seed, data, mutation


def run(
    n_inputs: int,
    run_seed: int,
    out: str | os.PathLike,
    *,
    jobs: int = 2,
    timeout: float | None = None,
    mem_mb: int = 1024,
    real_model: str | None = None,
    real_every: int = 50,
    n_threads: int = 1,
    start: int = 0,
    progress: bool = False,
) -> Summary:
    """Fuzz ``n_inputs`` mutants (inputs ``start`` .. ``start + n_inputs - 1`` of seed
    ``run_seed``) with ``jobs`` workers; crashers go to ``out/crashes``.

    Args:
        timeout: seconds per tiny input (default 10; 30 under ASan); a real-model input
            gets at least 60 (180 under ASan): reading its 49k-token header takes ~5 s.
        mem_mb: memory a child may add to its size at fork (RLIMIT_AS; under ASan its
            largest allocation and, by the worker's watchdog, its resident growth).
        real_model: a real GGUF (SmolLM2) whose header is mutated for every
            ``real_every``-th input; None: tiny seeds only.
        n_threads: ``Llama(n_threads=)`` in the children.
    Returns: the :class:`Summary`.
    """
    out = Path(out)
    (out / "work").mkdir(parents=True, exist_ok=True)
    (out / "crashes").mkdir(exist_ok=True)
    asan = under_asan()
    timeout = timeout or (30.0 if asan else 10.0)
    real_timeout = max(timeout, 180.0 if asan else 60.0)  # the real header alone takes ~5 s to read here
    tiny = tiny_seeds(out / "work")
    real = real_seed(real_model) if real_model else None
    env = worker_env(mem_mb)
    summary = Summary()
    lock = threading.Lock()
    todo = iter(range(start, start + n_inputs))
    t0 = time.perf_counter()

    errors: list[BaseException] = []

    def loop(j: int) -> None:
        try:
            _loop(j)
        except BaseException as e:  # re-raised by run() after the join
            errors.append(e)

    def _loop(j: int) -> None:
        w = _Worker(str(out / "work" / f"seed_{tiny[0].name}.gguf"), env)
        path, log = str(out / "work" / f"input_{j}.gguf"), str(out / "work" / f"input_{j}.log")
        try:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                seed, data, mutation = input_for(i, run_seed, tiny, real, real_every)
                write_mutant(seed, data, path)
                limit = real_timeout if seed is real else timeout
                reply = w.run({"path": path, "timeout": limit, "mem_mb": mem_mb, "log": log, "n_threads": n_threads})
                outcome = classify(reply)
                shutil.rmtree(Path(path).with_suffix(".powerinfer"), ignore_errors=True)  # no caches across inputs
                with lock:
                    _count(summary, i, seed, data, mutation, path, log, reply, outcome, out, run_seed)
                    if progress and summary.inputs % 500 == 0:
                        print(f"{summary.inputs} inputs, {dict(summary.outcomes)}", file=sys.stderr, flush=True)
        finally:
            w.close()

    threads = [threading.Thread(target=loop, args=(j,)) for j in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    summary.wall_s = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=1))
    return summary


def _count(
    s: Summary,
    i: int,
    seed: Seed,
    data: bytes,
    mutation: str,
    path: str,
    log: str,
    reply: dict,
    outcome: str,
    out: Path,
    run_seed: int,
) -> None:
    s.inputs += 1
    s.outcomes[outcome] += 1
    s.child_s[outcome] += reply["wall"]
    s.by_seed[seed.name][outcome] += 1
    for kind in set(_describe_kinds(mutation)):
        s.by_kind[kind][outcome] += 1
    exc = (reply.get("result") or {}).get("exception")
    if exc:
        s.exceptions[exc["type"]] += 1
        if outcome == "rejected" and path not in exc["message"]:
            s.rejected_unnamed += 1
            if len(s.unnamed_examples) < 10:
                s.unnamed_examples.append((i, mutation, f"{exc['type']}: {exc['message'][:300]}"))
    if outcome in BAD_OUTCOMES:
        s.saved.append(_save(i, seed, data, mutation, log, reply, outcome, out, run_seed))


def _save(
    i: int, seed: Seed, data: bytes, mutation: str, log: str, reply: dict, outcome: str, out: Path, run_seed: int
) -> str:
    """Save a bad input: its bytes (the mutated region only for the real model: append the
    seed file's bytes from ``tail_offset`` to rebuild it) and what happened."""
    stem = out / "crashes" / f"{run_seed}_{i:07d}_{outcome}"
    stem.with_suffix(".gguf").write_bytes(data)
    try:
        log_tail = Path(log).read_bytes()[-4000:].decode("utf-8", "replace")
    except OSError:
        log_tail = ""
    info = {
        "input": i,
        "run_seed": run_seed,
        "seed": seed.name,
        "mutation": mutation,
        "outcome": outcome,
        "status": reply["status"],
        "result": reply["result"],
        "log_tail": log_tail,
        "tail_path": seed.tail_path,
        "tail_offset": seed.tail_offset,
        "rebuild": f"python -m tests.fuzz --seed {run_seed} --start {i} --inputs 1",
    }
    stem.with_suffix(".json").write_text(json.dumps(info, indent=1))
    return str(stem.with_suffix(".gguf"))
