"""The warm fuzz worker: ``python -m tests.fuzz.worker [WARM.gguf]`` imports the package and
llama-cpp-python once (and loads the valid file WARM once, so that lazy imports and caches
are warm too), then for every request line on stdin (JSON: ``path``, ``timeout`` seconds,
``mem_mb``, ``log``, ``n_threads``; ``selftest``: "abort" / "hang" after the load, for the
harness's tests) forks a child that loads the file with
``Llama(path, n_ctx=32)``, evaluates two tokens when it loads, closes it, and reports on a
pipe. The worker never touches an input, so a crashing or hanging child costs only its own
fork: the worker waits at most ``timeout`` seconds (then SIGKILL) and answers one JSON line
on stdout: ``{"status": exit code (-N: signal N), "hang", "oom", "result", "wall": s}``.

Memory: the child sets RLIMIT_AS to its size at fork plus ``mem_mb``, except under
AddressSanitizer (its shadow memory needs terabytes of address space): there the worker is
started with ASan's own allocator limit in ASAN_OPTIONS (see harness.asan_env). Children
write their stdout/stderr (llama.cpp's and ggml's abort messages) to ``log``.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time
import warnings

os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml_abort would start gdb for a backtrace (> 60 s under ASan)

import contextlib

import llama_cpp  # imported once here, before the forks
import llama_cpp._internals
import llama_cpp.llama

# llama-cpp-python's verbose=False points fd 1 and 2 at /dev/null while llama.cpp loads, so
# an abort's message (GGML_ASSERT ...) would vanish: the children keep their log file instead
llama_cpp._internals.suppress_stdout_stderr = llama_cpp.llama.suppress_stdout_stderr = lambda disable=False: (
    contextlib.nullcontext()
)

from powerinfer_backend import Llama  # noqa: E402 - after llama_cpp is patched above, as the package uses it

_UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
_PROMPT = b"Hello world"


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _describe(e: BaseException) -> dict:
    return {
        "type": type(e).__name__,
        "module": type(e).__module__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "message": str(e)[:2000],
    }


def _load_and_eval(path: str, n_threads: int, result: dict) -> None:
    llm = Llama(path, n_ctx=32, n_threads=n_threads, verbose=False)
    result["loaded"] = True
    tokens = llm.tokenize(_PROMPT, add_bos=False)[:2] or [0]
    llm.eval(tokens)
    result["evaluated"] = len(tokens)
    llm.close()


def _child(path: str, n_threads: int, mem_mb: int, result_fd: int, log: str, selftest: str | None) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if mem_mb and not _UNDER_ASAN:
        limit = _vm_bytes() + (mem_mb << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore")
    result: dict = {"loaded": False}
    try:
        _load_and_eval(path, n_threads, result)
        if selftest == "abort":  # the harness's own tests: a crash and a hang it must see
            os.abort()
        if selftest == "hang":
            time.sleep(1e6)
    except BaseException as e:  # every exception is an outcome to count
        result["exception"] = _describe(e)
    os.write(result_fd, json.dumps(result).encode())
    os._exit(0)  # no interpreter teardown: the warm state belongs to the worker


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _watch(pid: int, pidfd: int, timeout: float, mem_mb: int) -> tuple[bool, bool]:
    """Wait for the child's exit: (hang, oom). Under ASan, whose RSS limits are threads
    that a fork does not copy, the child's resident growth is checked here every 50 ms."""
    if not (_UNDER_ASAN and mem_mb):
        return not select.select([pidfd], [], [], timeout)[0], False
    limit = _rss_bytes(os.getpid()) + (mem_mb << 20)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True, False
        if select.select([pidfd], [], [], min(left, 0.05))[0]:
            return False, False
        if _rss_bytes(pid) > limit:
            return False, True


def _serve_one(req: dict) -> dict:
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _child(
                req["path"], int(req.get("n_threads", 1)), int(req.get("mem_mb", 0)), w, req["log"], req.get("selftest")
            )
        finally:
            os._exit(70)
    os.close(w)
    pidfd = os.pidfd_open(pid)
    hang, oom = _watch(pid, pidfd, float(req["timeout"]), int(req.get("mem_mb", 0)))
    if hang or oom:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    wall = time.perf_counter() - t0
    chunks = []
    while True:
        b = os.read(r, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    raw = b"".join(chunks)
    try:
        result = json.loads(raw) if raw else None
    except ValueError:
        result = None
    return {"status": os.waitstatus_to_exitcode(status), "hang": hang, "oom": oom, "result": result, "wall": wall}


def main() -> None:
    out = sys.stdout
    if len(sys.argv) > 1:  # a valid file: load it once here, so that lazy imports and caches are warm
        _load_and_eval(sys.argv[1], 1, {})
    out.write(json.dumps({"ready": True, "asan": _UNDER_ASAN}) + "\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(_serve_one(json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
