"""The model's worker: continuous batching of up to ``parallel`` requests in one context.

* Each request is a :class:`Job`, ``fn(llm)`` returning a result or an iterator of
  chunks. A generating job runs on a slot's thread against that slot's
  :class:`~.slots.SlotLlama` (its own sequence, sampler chain, stop handling, stream);
  an ``exclusive`` job (embeddings) runs on the served ``Llama`` once no slot is busy.
* One scheduler thread owns the context. Each step it waits until every busy slot has
  asked for logits (or a short grace period passed: a slot busy in Python is not waited
  for), then decodes, in one batched pass, one token of every decoding slot plus prompt
  chunks of joining slots while they fit in ``n_batch``, and wakes those slots.
* Jobs start in arrival order in free slots; at most ``max_queue`` wait, more get 503.
* A client that leaves sets its job's cancel flag: the scheduler drops the slot from the
  next step and clears its KV cells (``cancel_steps`` records when). A finished slot
  keeps its tokens, so the next request there reuses the common prompt prefix
  (llama-server's ``cache_prompt``; with ``parallel=1`` every request does).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from typing import Callable, List, Optional

import numpy as np

from .errors import APIError
from .slots import Cancelled, SeqAccess, SlotLlama, seq_access

#: how long a step waits for a slot still busy in Python before decoding without it (s)
GRACE_S = 0.02


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
    """One request's work: ``fn(llm)`` returns a result or an iterator of chunks."""

    def __init__(self, fn: Callable, loop: asyncio.AbstractEventLoop, exclusive: bool = False,
                 clock: Callable[[], int] = lambda: 0):
        self.fn = fn
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
        self.request: Optional[_Request] = None
        self.leaving = False  # cancelled: out of the batch, KV cleared
        self.inbox: "queue.Queue[Optional[Job]]" = queue.Queue()
        self.thread = threading.Thread(target=worker._slot_loop, args=(self,), name=f"powerinfer-slot-{seq}",
                                       daemon=True)


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
        self._to_clear: List[int] = []  # seqs whose KV cells the scheduler clears next
        self._stopping = False
        self.served = self.cancelled = self.rejected = 0
        self.steps = 0  # batched passes run
        self.tokens_decoded = 0  # tokens of those passes
        self.cancel_steps: List[tuple] = []  # (step the cancel was set, step its slot left), the last 16
        self._slots = [_Slot(self, s) for s in range(self.parallel)]
        for s in self._slots:
            s.thread.start()
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
        context and the tokens its KV cells hold."""
        return [{"id": s.seq, "is_processing": s.job is not None, "n_ctx": self.access.n_ctx_seq,
                 "n_past": int(self.access.n_past(s.seq))} for s in self._slots]

    def submit(self, fn: Callable, exclusive: bool = False) -> Job:
        """Queue ``fn``; raises :class:`APIError` 503 when the queue is full."""
        job = Job(fn, asyncio.get_running_loop(), exclusive, clock=lambda: self.steps)
        with self._cv:
            # queued jobs that free slots will take at the next step are not waiting for a slot
            free = 0 if self._exclusive is not None else sum(s.job is None for s in self._slots)
            if len(self._queue) >= self.max_queue + free:
                self.rejected += 1
                raise APIError(503, f"server busy: {len(self._queue) - free} requests already waiting for a "
                                    f"slot (--max-queue {self.max_queue}); retry later", "server_busy")
            self._queue.append(job)
            self._cv.notify_all()
        return job

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            for s in self._slots:
                if s.request is not None:
                    self._finish(s, Cancelled())
            self._cv.notify_all()
        for s in self._slots:
            s.inbox.put(None)
        self._thread.join(timeout=30)

    # ---- running a job (a slot's thread, or the scheduler for an exclusive one) -------------

    def _execute(self, job: Job, llm) -> None:
        try:
            result = job.fn(llm)
            if isinstance(result, (dict, list, str, bytes, int, float, type(None))):
                job._put("item", result)
            else:
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
            job._put("end", None)
            with self._cv:
                self.served += 1
        except Cancelled:
            with self._cv:
                self.cancelled += 1
            job._put("end", None)
        except BaseException as e:  # answered to the client; the worker lives on
            job._put("error", e)

    def _slot_loop(self, slot: _Slot) -> None:
        while True:
            job = slot.inbox.get()
            if job is None:
                return
            slot.llama.job = job
            try:
                self._execute(job, slot.llama)
            finally:
                cancelled = slot.leaving or job.cancel.is_set()
                if cancelled:
                    slot.llama.forget()
                slot.llama.job = None
                with self._cv:
                    if cancelled and not slot.leaving:  # it stopped itself (between two steps)
                        self._record_cancel(job)
                        self._to_clear.append(slot.seq)
                    slot.job = None
                    slot.leaving = False
                    self._cv.notify_all()

    def _decode(self, llama: SlotLlama, n_past: int, tokens: List[int]) -> np.ndarray:
        """A slot's backend eval (:class:`.slots.SlotBackend`): waits for the steps that decode ``tokens``."""
        slot = self._slots[llama.seq]
        req = _Request(n_past, list(tokens))
        with self._cv:
            if slot.leaving or self._stopping or (slot.job is not None and slot.job.cancel.is_set()):
                raise Cancelled()
            slot.request = req
            self._cv.notify_all()
            while not req.done:
                self._cv.wait()
        if req.error is not None:
            raise req.error
        return req.rows[0] if len(req.rows) == 1 else np.concatenate(req.rows)

    # ---- the scheduler ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                with self._cv:
                    items = self._next_step()
                    if items is None:
                        return
                if self._exclusive is not None:
                    self._run_exclusive()
                    continue
                self._step(items)
            except BaseException as e:  # a failure of the scheduler itself: answered, never a hang
                with self._cv:
                    for s in self._slots:
                        if s.request is not None:
                            self._finish(s, e)

    def _next_step(self):
        """Under the lock: admit jobs, drop cancelled slots and wait for the next batch
        (its items), or an exclusive job to run ([]), or the stop (None)."""
        deadline = None
        while True:
            if self._stopping:
                return None
            while self._to_clear:  # slots whose job stopped on its own cancel check
                self.access.truncate(self._to_clear.pop(), 0)
            self._admit()
            if self._exclusive is not None:
                return []
            busy = [s for s in self._slots if s.job is not None and not s.leaving]
            for s in busy:
                if s.job.cancel.is_set():
                    self._leave(s)
            busy = [s for s in busy if not s.leaving]
            asking = [s for s in busy if s.request is not None]
            if asking and len(asking) == len(busy) or deadline is not None and time.monotonic() >= deadline:
                items = self._batch(asking)
                if items:
                    return items
                deadline = None
                continue
            if asking and deadline is None:
                deadline = time.monotonic() + GRACE_S
            self._cv.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _admit(self) -> None:
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
            free = next((s for s in self._slots if s.job is None), None)
            if free is None:
                return
            free.job = self._queue.popleft()
            free.inbox.put(free.job)

    def _leave(self, slot: _Slot) -> None:
        """A cancelled slot leaves the batch now and its KV cells are cleared."""
        slot.leaving = True
        self.access.truncate(slot.seq, 0)
        self._record_cancel(slot.job)
        if slot.request is not None:
            self._finish(slot, Cancelled())

    def _record_cancel(self, job: Job) -> None:
        self.cancel_steps = (self.cancel_steps + [(job.cancel.step, self.steps)])[-16:]

    def _finish(self, slot: _Slot, error: Optional[BaseException] = None) -> None:
        req, slot.request = slot.request, None
        req.error = error
        req.done = True
        self._cv.notify_all()

    def _batch(self, asking: List[_Slot]) -> list:
        """The items of one step: a token of every decoding slot, then prompt chunks in
        arrival order while ``n_batch`` has room. Requests that cannot run are answered
        with their error here."""
        budget = self.access.n_batch
        items = []
        # decode tokens first (latency of the running slots), then the joining prompts
        for s in sorted(asking, key=lambda s: len(s.request.rest) > 1):
            req = s.request
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
            return RuntimeError(f"slot {seq}: {req.n_keep} tokens expected in its KV cells, "
                                f"{self.access.n_past(seq)} held")
        return None

    def _step(self, items: list) -> None:
        error = None
        try:
            outs = self.access.eval(items, self._logits_all)
        except BaseException as e:  # answered to the slots of this step
            error, outs = e, [None] * len(items)
        with self._cv:
            self.steps += 1
            for (seq, toks), out in zip(items, outs):
                slot = self._slots[seq]
                req = slot.request
                if req is None:  # stopped meanwhile
                    continue
                if error is not None:
                    self._finish(slot, error)
                    continue
                self.tokens_decoded += len(toks)
                req.rest = req.rest[len(toks):]
                if self._logits_all or not req.rest:  # else a prompt chunk's logits are not needed
                    req.rows.append(out)
                if not req.rest:
                    self._finish(slot)
            self._cv.notify_all()

    def _run_exclusive(self) -> None:
        job = self._exclusive
        try:
            self._execute(job, self.llm)
        finally:
            # the served Llama used sequence 0 directly: no slot's tokens are cached now
            for s in self._slots:
                self.access.truncate(s.seq, 0)
                s.llama.forget()
            with self._cv:
                self._exclusive = None
                self._cv.notify_all()
