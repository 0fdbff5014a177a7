"""What the endpoints share: the served model (:class:`ServerState`: the ``Llama``, its
batching worker, name and sizes) and the two ways a request runs on its worker, one answer
(:meth:`ServerState.run_once`) or an SSE stream (:meth:`ServerState.run_stream`)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, List, Optional

from fastapi import Request
from sse_starlette.sse import EventSourceResponse

from .errors import APIError, error_from_exception, log_error
from .worker import ModelWorker


class ServerState:
    """One served model. ``disconnect_poll_s``: how often a non-streaming request checks
    that its client is still there, where the ASGI server does not tell it (uvicorn does)."""

    def __init__(
        self,
        llm,
        model_alias: str,
        max_queue: int,
        api_key: Optional[str],
        disconnect_poll_s: float = 0.1,
        parallel: Optional[int] = None,
    ):
        self.llm = llm
        self.model_alias = model_alias
        self.api_key = api_key
        self.disconnect_poll_s = disconnect_poll_s
        self.worker = ModelWorker(llm, max_queue=max_queue, parallel=parallel)
        self.created = int(time.time())
        self.n_vocab = int(llm.n_vocab())
        self.n_ctx = int(llm.n_ctx())  # the total, split across the slots
        self.n_ctx_slot = self.worker.n_ctx_slot  # what one request may use

    async def run_once(
        self, request: Request, fn: Callable, exclusive: bool = False, prompt: Optional[List[int]] = None
    ):
        """Run ``fn(llm)`` on the worker (in a slot, chosen for ``prompt``, its prompt tokens
        when known; ``exclusive``: on the served Llama, alone) and return its result; a
        client that disconnects meanwhile cancels it."""
        job = self.worker.submit(fn, exclusive=exclusive, prompt=prompt)
        item = asyncio.ensure_future(job.items.get())
        # the disconnect is awaited, not polled: no wake-ups of the event loop while the
        # request runs (they would take a core from the engine's threads)
        gone = asyncio.ensure_future(_disconnected(request, self.disconnect_poll_s))
        try:
            await asyncio.wait((item, gone), return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                job.cancel.set()
                raise APIError(499, "client closed the request")
            kind, value = item.result()
            if kind == "item":
                return value
            if kind == "error":
                raise _answer(value)
            raise APIError(499, "cancelled")
        finally:
            item.cancel()
            gone.cancel()
            job.cancel.set()  # no-op when finished; stops a job whose caller was cancelled

    async def run_stream(
        self,
        request: Request,
        fn: Callable,
        fmt: Callable[[Any], Optional[dict]],
        done: Optional[str] = "[DONE]",
        prompt: Optional[List[int]] = None,
    ):
        """Run ``fn(llm)`` (an iterator) on the worker (``prompt`` as for :meth:`run_once`)
        and answer an SSE stream of ``fmt(chunk)``. Errors before the first chunk are
        answered as JSON errors."""
        job = self.worker.submit(fn, prompt=prompt)
        try:
            kind, first = await job.items.get()
        except BaseException:
            job.cancel.set()
            raise
        if kind == "error":
            job.cancel.set()
            raise _answer(first)

        async def events():
            try:
                kind_, value = kind, first
                while kind_ == "item":
                    data = fmt(value)
                    if data is not None:
                        yield {"data": json.dumps(data, ensure_ascii=False)}
                    kind_, value = await job.items.get()
                if kind_ == "error":
                    err = error_from_exception(value)
                    log_error(request, err, value)
                    yield {"data": json.dumps(err.body())}
                elif done is not None:
                    yield {"data": done}
            finally:
                job.cancel.set()  # client gone (task cancelled) or finished

        return EventSourceResponse(events(), ping=15, sep="\n")


async def _disconnected(request: Request, poll_s: float) -> None:
    """Returns once the client of ``request`` (whose body was read) has disconnected: the
    ASGI server's ``receive`` answers ``http.disconnect`` then. Where ``receive`` answers
    anything else (it does not wait), it is asked again every ``poll_s`` seconds; where it
    fails, ``request.is_disconnected()`` is."""
    try:
        while True:
            message = await request.receive()
            if message.get("type") == "http.disconnect":
                return
            await asyncio.sleep(poll_s)
    except Exception:  # any failure: the poll below still notices a disconnect
        pass
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)


def _answer(e: BaseException) -> APIError:
    """The APIError for ``e``, raised by the worker, with ``e`` as its cause (the
    error handler logs a fault's traceback from it)."""
    err = error_from_exception(e)
    if err is not e:
        err.__cause__ = e
    return err


def budget_in_effect(llm):
    """The ``vram_budget`` the served model runs under, as given, for ``/props`` and
    ``/v1/models``: None when nothing is on a device (no device found, or CPU only),
    where a given budget was ignored; the plan's budget in bytes (int) when the placement
    came from ``n_gpu_layers`` rather than a ``vram_budget``."""
    dev = llm.stats().get("device")
    if not dev:
        return None
    return llm.vram_budget if llm.vram_budget is not None else dev.get("budget_bytes")
