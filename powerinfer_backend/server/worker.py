"""The model's worker: one scheduler thread runs up to ``parallel`` requests in one
context, as llama-server's loop.

* Each request is a :class:`Job`, ``fn(llm)`` returning a result or an iterator of
  chunks. A generating job runs in a slot, as a coroutine (a greenlet) of the scheduler
  thread against that slot's :class:`~.slots.SlotLlama` (its own sequence, sampler chain,
  stop handling, stream); an ``exclusive`` job (embeddings) runs on the served ``Llama``
  once no slot is busy.
* Each step the scheduler resumes every slot whose logits are ready until it asks for the
  next ones (or ends), then decodes, in one batched pass, one token of every decoding slot
  plus prompt chunks of joining slots while they fit in ``n_batch``. No slot is waited for
  by time: a slot runs only when the scheduler switches to it.
* Jobs start in arrival order; a job takes the free slot whose cached tokens share the
  longest prefix with its prompt when that covers at least :data:`SLOT_SIMILARITY` of the
  prompt, else the least recently used free slot (llama-server's rule, so a returning chat
  finds its cells); at most ``max_queue`` wait, more get 503.
* A client that leaves sets its job's cancel flag: at the next step the scheduler ends the
  slot's coroutine (:class:`~.slots.Cancelled` raised where it waits for logits) and clears
  its KV cells (``cancel_steps`` records when). A finished slot keeps its tokens, so the
  next request there reuses the common prompt prefix (llama-server's ``cache_prompt``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Callable, List, Optional, Tuple

import numpy as np
from greenlet import greenlet

from ..text.sequence import common_prefix
from .errors import APIError
from .slots import Cancelled, SeqAccess, SlotLlama, seq_access

#: the share of a prompt a slot's cached prefix must cover to be chosen for it (llama-server's
#: ``--slot-prompt-similarity`` default); below it the least recently used free slot is taken
SLOT_SIMILARITY = 0.5


class _CancelFlag(threading.Event):
    """A job's cancel flag; remembers the scheduler step at which it was set."""

    def __init__(self, clock: Callable[[], int]):
        super().__init__()
        self._clock = clock
        self.step: Optional[int] = None

    def set(self) -> None:
        if not self.is_set():
            self.step = self._clock()
        super().set()


class Job:
    """One request's work: ``fn(llm)`` returns a result or an iterator of chunks;
    ``prompt``: its prompt tokens when known (the slot choice), else None."""

    def __init__(
        self,
        fn: Callable,
        loop: asyncio.AbstractEventLoop,
        exclusive: bool = False,
        clock: Callable[[], int] = lambda: 0,
        prompt: Optional[List[int]] = None,
    ):
        self.fn = fn
        self.prompt = prompt
        self.loop = loop
        self.exclusive = exclusive
        self.cancel = _CancelFlag(clock)
        self.items: asyncio.Queue = asyncio.Queue()  # ("item", x) | ("error", e) | ("end", None)

    def _put(self, kind, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed (shutdown)
            pass


class _Request:
    """A slot's ask for the logits of ``tokens`` appended at ``n_keep``."""

    def __init__(self, n_keep: int, tokens: List[int]):
        self.n_keep = n_keep
        self.rest = tokens  # not yet decoded
        self.started = False
        self.rows: List[np.ndarray] = []
        self.done = False
        self.error: Optional[BaseException] = None


class _Slot:
    def __init__(self, worker: "ModelWorker", seq: int):
        self.seq = seq
        self.llama = SlotLlama(worker.llm, seq, worker.access.n_ctx_seq, worker._decode)
        self.job: Optional[Job] = None
        self.run: Optional[greenlet] = None  # the job's coroutine, started at its first step
        self.request: Optional[_Request] = None  # what it waits for
        self.leaving = False  # cancelled: out of the batch, KV cleared
        self.last_used = 0  # when its last job started (the worker's job count): least recent first
        self.prompt_evaluated = 0  # prompt tokens its last job evaluated (the rest were cached)


class ModelWorker:
    """Runs jobs against one :class:`Llama` in ``parallel`` slots (default: the
    context's ``n_seq_max``, 1 without parallel sequences); at most ``max_queue`` jobs
    wait for a slot.

    Raises:
        ValueError: ``parallel`` is more than the context serves (:func:`.slots.seq_access`).
    """

    def __init__(self, llm, max_queue: int = 16, parallel: Optional[int] = None):
        self.llm = llm
        self.max_queue = int(max_queue)
        if parallel is None:
            ctx = getattr(llm, "native_context", None)
            parallel = int(getattr(ctx, "n_seq_max", 1)) if hasattr(ctx, "eval_seqs") else 1
        self.access: SeqAccess = seq_access(llm, int(parallel))
        self.parallel = self.access.n_seq
        self._logits_all = bool(getattr(llm, "logits_all", False))
        self._cv = threading.Condition()
        self._queue: deque = deque()
        self._exclusive: Optional[Job] = None
        self._stopping = False
        self.served = self.cancelled = self.rejected = 0
        self.started = 0  # jobs given a slot
        self.steps = 0  # batched passes run
        self.tokens_decoded = 0  # tokens of those passes
        self.eval_s = 0.0  # seconds in those passes (the rest of a step is the slots' Python)
        self.cancel_steps: List[tuple] = []  # (step the cancel was set, step its slot left), the last 16
        self._slots = [_Slot(self, s) for s in range(self.parallel)]
        self._thread = threading.Thread(target=self._run, name="powerinfer-serve-worker", daemon=True)
        self._thread.start()

    # ---- what the endpoints read --------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return self._exclusive is not None or any(s.job is not None for s in self._slots)

    @property
    def n_ctx_slot(self) -> int:
        return self.access.n_ctx_seq

    def slots(self) -> List[dict]:
        """llama-server's ``/slots``: per slot its id, whether it runs a request, its
        context, the tokens its KV cells hold and ``n_prompt_tokens_processed``, the prompt
        tokens its last request evaluated (the rest of that prompt came from its cells)."""
        return [
            {
                "id": s.seq,
                "is_processing": s.job is not None,
                "n_ctx": self.access.n_ctx_seq,
                "n_past": int(self.access.n_past(s.seq)),
                "n_prompt_tokens_processed": s.prompt_evaluated,
            }
            for s in self._slots
        ]

    def submit(self, fn: Callable, exclusive: bool = False, prompt: Optional[List[int]] = None) -> Job:
        """Queue ``fn`` (``prompt``: its prompt tokens, for the slot choice); raises
        :class:`APIError` 503 when the queue is full."""
        job = Job(fn, asyncio.get_running_loop(), exclusive, clock=lambda: self.steps, prompt=prompt)
        with self._cv:
            # queued jobs that free slots will take at the next step are not waiting for a slot
            free = 0 if self._exclusive is not None else sum(s.job is None for s in self._slots)
            if len(self._queue) >= self.max_queue + free:
                self.rejected += 1
                waiting = len(self._queue) - free
                raise APIError(
                    503,
                    f"server busy: {waiting} request{'s' if waiting != 1 else ''} already waiting "
                    f"for a slot (--max-queue {self.max_queue}); retry later",
                    "server_busy",
                )
            self._queue.append(job)
            self._cv.notify_all()
        return job

    def stop(self) -> None:
        """End the running jobs (cancelled) and the scheduler thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    # ---- running a job (a slot's coroutine, or the scheduler for an exclusive one) -----------

    def _execute(self, job: Job, llm) -> list:
        """Run ``job`` on ``llm``, sending its chunks; returns the messages that end it, sent
        by the caller once the slot is free (a client that has its answer sees the worker
        idle)."""
        try:
            result = job.fn(llm)
            if isinstance(result, (dict, list, str, bytes, int, float, type(None))):
                with self._cv:
                    self.served += 1
                return [("item", result), ("end", None)]
            it = iter(result)
            try:
                for item in it:
                    job._put("item", item)
                    if job.cancel.is_set():
                        raise Cancelled()
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            with self._cv:
                self.served += 1
            return [("end", None)]
        except Cancelled:
            with self._cv:
                self.cancelled += 1
            return [("end", None)]
        except BaseException as e:  # answered to the client; the worker lives on
            return [("error", e)]

    def _decode(self, llama: SlotLlama, n_past: int, tokens: List[int]) -> np.ndarray:
        """A slot's backend eval (:class:`.slots.SlotBackend`), in the slot's coroutine:
        hands the scheduler the ask and resumes once the steps decoded ``tokens``."""
        slot = self._slots[llama.seq]
        if slot.leaving or self._stopping or (slot.job is not None and slot.job.cancel.is_set()):
            raise Cancelled()
        req = slot.request = _Request(n_past, list(tokens))
        assert slot.run is not None  # this runs in it
        slot.run.parent.switch()  # back to the scheduler; it switches here when req is done
        if req.error is not None:
            raise req.error
        return req.rows[0] if len(req.rows) == 1 else np.concatenate(req.rows)

    # ---- the scheduler ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._queue or any(s.job is not None for s in self._slots)):
                    self._cv.wait()
                if self._stopping:
                    break
                self._admit()
                exclusive = self._exclusive
            if exclusive is not None:
                self._run_exclusive()
                continue
            try:
                self._step()
            except BaseException as e:  # a failure of the scheduler itself: answered, never a hang
                for s in self._slots:
                    if s.request is not None and not s.request.done:
                        self._finish(s, e)
        for s in self._slots:  # stopping: the running jobs end as cancelled
            if s.job is not None:
                self._leave(s)

    def _step(self) -> None:
        """One step: drop cancelled slots, run every slot whose logits are ready until it
        asks for more or ends, then decode what they asked for in one pass."""
        for s in self._slots:
            if s.job is not None and s.job.cancel.is_set():
                self._leave(s)
        for s in self._slots:
            if s.job is not None and (s.request is None or s.request.done):
                self._resume(s)
        asking = [(s, s.request) for s in self._slots if s.request is not None and not s.request.done]
        items = self._batch(asking)
        if items:
            self._eval(items)

    def _resume(self, slot: _Slot, error: Optional[BaseException] = None) -> None:
        """Run the slot's coroutine (starting its job, or raising ``error`` where it waits)
        until it asks for logits or ends; an ended job frees the slot."""
        if slot.run is None:
            job, llama = slot.job, slot.llama
            assert job is not None  # only a slot with a job is resumed
            slot.run = greenlet(lambda: self._execute(job, llama))
            llama.job = job  # its cancel flag, checked per token
            llama.sequence.prompt_evaluated = 0
        slot.request = None
        out = slot.run.throw(error) if error is not None else slot.run.switch()
        if slot.run.dead:
            self._release(slot, out)

    def _release(self, slot: _Slot, messages: list) -> None:
        """The slot's job ended: a cancelled one forgets its tokens (the KV cells were
        cleared); then its last ``messages`` go to the client."""
        job = slot.job
        assert job is not None  # only a slot with a job is released
        slot.prompt_evaluated = slot.llama.sequence.prompt_evaluated
        if slot.leaving or job.cancel.is_set():
            slot.llama.forget()
            if not slot.leaving:  # it stopped itself at its own cancel check, between two steps
                self.access.truncate(slot.seq, 0)
                self._record_cancel(job)
        slot.llama.job = None
        with self._cv:
            slot.job, slot.run, slot.request, slot.leaving = None, None, None, False
            self._cv.notify_all()
        for kind, value in messages:
            job._put(kind, value)

    def _admit(self) -> None:
        """Under the lock: start queued jobs in free slots, in order (an exclusive one once
        no slot is busy)."""
        while self._queue:
            job = self._queue[0]
            if job.cancel.is_set():  # the client left while queued
                self._queue.popleft()
                self.cancelled += 1
                job._put("end", None)
                continue
            if job.exclusive:
                if any(s.job is not None for s in self._slots):
                    return  # in order: it waits for the slots to finish
                self._exclusive = self._queue.popleft()
                return
            free = self._choose_slot(job.prompt)
            if free is None:
                return
            free.job = self._queue.popleft()
            self.started += 1
            free.last_used = self.started

    def _choose_slot(self, prompt: Optional[List[int]]) -> Optional[_Slot]:
        """The free slot for ``prompt`` (see the module docstring), None when all are busy."""
        free = [s for s in self._slots if s.job is None]
        if not free:
            return None
        if prompt:
            best, n = max(
                ((s, common_prefix(s.llama.sequence.tokens.tolist(), prompt)) for s in free),
                key=lambda sn: (sn[1], -sn[0].last_used),
            )
            if n >= SLOT_SIMILARITY * len(prompt):
                return best
        return min(free, key=lambda s: s.last_used)

    def _leave(self, slot: _Slot) -> None:
        """A cancelled slot leaves the batch now: its KV cells are cleared and its job ends."""
        assert slot.job is not None  # only a slot with a job leaves
        slot.leaving = True
        self.access.truncate(slot.seq, 0)
        self._record_cancel(slot.job)
        if slot.run is not None:
            self._resume(slot, Cancelled())
            return
        with self._cv:  # never started
            self.cancelled += 1
        self._release(slot, [("end", None)])

    def _record_cancel(self, job: Job) -> None:
        self.cancel_steps = (self.cancel_steps + [(job.cancel.step, self.steps)])[-16:]

    def _finish(self, slot: _Slot, error: Optional[BaseException] = None) -> None:
        req = slot.request
        assert req is not None  # only a waiting slot is answered
        req.error = error
        req.done = True

    def _batch(self, asking: List[Tuple[_Slot, _Request]]) -> list:
        """The items of one step: a token of every decoding slot, then prompt chunks in
        arrival order while ``n_batch`` has room. Requests that cannot run are answered
        with their error here."""
        budget = self.access.n_batch
        items = []
        # decode tokens first (latency of the running slots), then the joining prompts
        for s, req in sorted(asking, key=lambda sr: len(sr[1].rest) > 1):
            if not req.started:
                err = self._check(s.seq, req)
                if err is not None:
                    self._finish(s, err)
                    continue
            if budget == 0:
                break
            take = min(len(req.rest), budget)
            if not req.started:
                if self.access.n_past(s.seq) != req.n_keep:
                    self.access.truncate(s.seq, req.n_keep)
                req.started = True
            items.append((s.seq, req.rest[:take]))
            budget -= take
        return items

    def _check(self, seq: int, req: _Request) -> Optional[BaseException]:
        n_vocab = self.llm.n_vocab()
        bad = next((t for t in req.rest if not 0 <= t < n_vocab), None)
        if bad is not None:
            return ValueError(f"eval: token {bad} is outside [0, {n_vocab})")
        n = req.n_keep + len(req.rest)
        if n > self.access.n_ctx_seq:
            return ValueError(f"Requested tokens ({n}) exceed context window of {self.access.n_ctx_seq}")
        if self.access.n_past(seq) < req.n_keep:
            return RuntimeError(
                f"slot {seq}: {req.n_keep} tokens expected in its KV cells, {self.access.n_past(seq)} held"
            )
        return None

    def _eval(self, items: list) -> None:
        """One batched pass over ``items``; each request gets its rows (or the error)."""
        error = None
        t0 = time.perf_counter()
        try:
            outs = self.access.eval(items, self._logits_all)
        except BaseException as e:  # answered to the slots of this step
            error, outs = e, []
        self.eval_s += time.perf_counter() - t0
        self.steps += 1
        if error is not None:
            for seq, _ in items:
                self._finish(self._slots[seq], error)
            return
        for (seq, toks), out in zip(items, outs):
            slot = self._slots[seq]
            req = slot.request
            assert req is not None  # it asked for these tokens
            self.tokens_decoded += len(toks)
            req.rest = req.rest[len(toks) :]
            if self._logits_all or not req.rest:  # else a prompt chunk's logits are not needed
                req.rows.append(out)
            if not req.rest:
                self._finish(slot)

    def _run_exclusive(self) -> None:
        job = self._exclusive
        assert job is not None  # the loop runs it once admitted
        messages: list = [("error", RuntimeError("the worker stopped"))]
        try:
            messages = self._execute(job, self.llm)
        finally:
            # the served Llama used sequence 0 directly: no slot's tokens are cached now
            for s in self._slots:
                self.access.truncate(s.seq, 0)
                s.llama.forget()
            with self._cv:
                self._exclusive = None
                self._cv.notify_all()
            for kind, value in messages:
                job._put(kind, value)
