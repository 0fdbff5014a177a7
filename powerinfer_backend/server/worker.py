"""The model's worker: one thread runs :class:`Job` s against one ``Llama``, in arrival
order, behind a bounded queue; a job's cancel flag stops its generation within one
token."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Callable, Optional

from .errors import APIError


class _Cancelled(Exception):
    """Raised inside the worker when the client of the running job went away."""


class Job:
    """One request's work: ``fn(llm)`` returns a result or an iterator of chunks."""

    def __init__(self, fn: Callable, loop: asyncio.AbstractEventLoop):
        self.fn = fn
        self.loop = loop
        self.cancel = threading.Event()
        self.items: asyncio.Queue = asyncio.Queue()  # ("item", x) | ("error", e) | ("end", None)

    def _put(self, kind, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed (shutdown)
            pass


class ModelWorker:
    """Runs jobs on one thread against one :class:`Llama`; at most ``max_queue``
    jobs wait behind the running one."""

    def __init__(self, llm, max_queue: int = 16):
        self.llm = llm
        self.max_queue = int(max_queue)
        self._q: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0  # queued, not yet started
        self._running: Optional[Job] = None
        self.served = 0
        self.cancelled = 0
        self.rejected = 0
        # every completion / chat path of llama-cpp-python draws its tokens from
        # llm.generate: an instance attribute checking the running job's cancel flag stops
        # a generation within one token, streaming or not
        original = llm.generate

        def generate(*args, **kwargs):
            job = self._running
            for token in original(*args, **kwargs):
                if job is not None and job.cancel.is_set():
                    raise _Cancelled()
                yield token

        llm.generate = generate
        self._thread = threading.Thread(target=self._run, name="powerinfer-serve-worker", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def busy(self) -> bool:
        return self._running is not None

    def submit(self, fn: Callable) -> Job:
        """Queue ``fn``; raises :class:`APIError` 503 when the queue is full."""
        job = Job(fn, asyncio.get_running_loop())
        with self._lock:
            if self._waiting >= self.max_queue:
                self.rejected += 1
                raise APIError(503, f"server busy: {self._waiting} requests already queued (--max-queue "
                                    f"{self.max_queue}); retry later", "server_busy")
            self._waiting += 1
        self._q.put(job)
        return job

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
            if job.cancel.is_set():  # the client left while queued
                self.cancelled += 1
                job._put("end", None)
                continue
            self._running = job
            try:
                result = job.fn(self.llm)
                if isinstance(result, (dict, list, str, bytes, int, float, type(None))):
                    job._put("item", result)
                else:
                    it = iter(result)
                    try:
                        for item in it:
                            job._put("item", item)
                            if job.cancel.is_set():
                                raise _Cancelled()
                    finally:
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()
                job._put("end", None)
                self.served += 1
            except _Cancelled:
                self.cancelled += 1
                job._put("end", None)
            except BaseException as e:  # answered to the client; the worker lives on
                job._put("error", e)
            finally:
                self._running = None

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
