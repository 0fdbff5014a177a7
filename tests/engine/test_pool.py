"""The chunked worker pool under a stalled worker and when idle (native/src/threads.c;
docs/architecture.md, "Thread pool"), on SmolLM2 with exact greedy tokens."""

import resource
import time

import numpy as np
import pytest

from powerinfer_backend.engine import NativeContext, NativeModel, default_threads
from powerinfer_backend.engine import testing
from powerinfer_backend.loader import load_gguf

PROMPT = [504, 2365, 6354, 16438, 27003, 690, 260]  # "The quick brown fox jumps over the"
N_TOKENS = 12


@pytest.fixture(scope="module")
def smollm2(model_path):
    return NativeModel(load_gguf(model_path, verbose=False))


def greedy(ctx, n, before_token=None):
    """n greedy tokens after PROMPT; before_token(i) runs before the i-th decode step."""
    logits = ctx.eval(PROMPT)[-1]
    out = []
    for i in range(n):
        out.append(int(np.argmax(logits)))
        if before_token:
            before_token(i)
        logits = ctx.eval([out[-1]])[-1]
    return out


@pytest.mark.skipif(not testing.AVAILABLE, reason=testing.MISSING)
def test_stalled_worker_delays_only_its_chunk(smollm2):
    reference = greedy(NativeContext(smollm2, n_ctx=64, n_batch=64, n_threads=1), N_TOKENS)
    ctx = NativeContext(smollm2, n_ctx=64, n_batch=64, n_threads=3)
    fired = []

    def arm(i):  # stall worker 1 in the decode of token 3 (again later if it took no chunk then)
        if i >= 3 and not fired:
            _, stalled = testing.chunk_counts(ctx)
            if stalled is None:
                testing.stall(ctx, 1, 50)
            else:
                fired.append(stalled)

    t0 = time.perf_counter()
    tokens = greedy(ctx, N_TOKENS, arm)
    elapsed = time.perf_counter() - t0
    assert tokens == reference
    _, stalled = testing.chunk_counts(ctx)
    assert stalled is not None, "the stall never fired"
    assert elapsed >= 0.05  # the stall did happen inside a job
    # in the stalled job, worker 1 ran one chunk (the one it slept in); the calling thread
    # and worker 2 took all the others (4 chunks per thread)
    assert stalled[1] == 1
    assert stalled[0] + stalled[2] == 4 * 3 - 1
    total, _ = testing.chunk_counts(ctx)
    assert all(t > 0 for t in total)


def test_identical_tokens_across_thread_counts(smollm2):
    runs = {n: greedy(NativeContext(smollm2, n_ctx=64, n_batch=64, n_threads=n), 8) for n in (1, 2, 3, 5)}
    assert runs[2] == runs[1] and runs[3] == runs[1] and runs[5] == runs[1]


def test_idle_pool_uses_no_cpu(smollm2):
    ctx = NativeContext(smollm2, n_ctx=64, n_batch=64, n_threads=2)
    greedy(ctx, 4)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    time.sleep(1.0)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert cpu < 0.020 and t1 - t0 < 0.020, f"{cpu * 1e3:.1f} ms of CPU over 1 s idle"
    del ctx


def test_default_threads_counts_physical_cores():
    import os

    cpus = os.sched_getaffinity(0)
    cores = set()
    for c in cpus:
        with (
            open(f"/sys/devices/system/cpu/cpu{c}/topology/core_id") as f,
            open(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id") as g,
        ):
            cores.add((g.read().strip(), f.read().strip()))
    assert default_threads() == len(cores)
