"""``powerinfer-backend serve``: one model behind OpenAI-compatible (``/v1/...``) and
llama-server-compatible (``/health``, ``/props``, ``/tokenize``, ``/detokenize``,
``/completion``) HTTP endpoints (FastAPI + uvicorn + sse-starlette; docs/serving.md).

Design:

* One worker thread owns the :class:`~powerinfer_backend.Llama` (a context serves one
  sequence) and runs requests one at a time, in arrival order, so outputs never mix and
  greedy results do not depend on what else is being served.
* A bounded queue: at most ``max_queue`` requests wait behind the running one; more get
  ``503`` with an OpenAI-style JSON error right away.
* Results travel from the worker to the event loop per chunk; a client that disconnects
  sets its job's cancel flag, which the model's token generator checks at every token
  (streaming or not), so its generation stops within one token.
* Parameters are passed to llama-cpp-python's own ``create_completion`` /
  ``create_chat_completion`` (through our ``Llama``), so they mean what they mean there.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np

try:
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
    from sse_starlette.sse import EventSourceResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("the server needs FastAPI, uvicorn and sse-starlette: "
                      "pip install 'powerinfer_backend[server]'") from e


# ---------------------------------------------------------------------------------------
# errors


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "code": self.status}},
                            status_code=self.status)


class _Cancelled(Exception):
    """Raised inside the worker when the client of the running job went away."""


def _error_from_exception(e: BaseException) -> APIError:
    if isinstance(e, APIError):
        return e
    msg = str(e) or type(e).__name__
    if isinstance(e, ValueError) and "exceed context window" in msg:
        return APIError(400, msg, "exceed_context_size_error")  # the type llama-server (and tgw) use
    if isinstance(e, (ValueError, TypeError, KeyError, NotImplementedError)):
        return APIError(400, msg)
    if isinstance(e, RuntimeError) and ("empty prompt" in msg or "embedding=True" in msg):
        return APIError(400, msg)
    return APIError(500, f"{type(e).__name__}: {msg}", "server_error")


# ---------------------------------------------------------------------------------------
# the worker: one thread, one model, a bounded queue


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


# ---------------------------------------------------------------------------------------
# request bodies (extra fields are accepted and ignored, as OpenAI clients send many)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


def _chat_message(m: Dict[str, Any]) -> Dict[str, Any]:
    """A chat message as the GGUF templates expect it: ``content`` a string. OpenAI
    clients send ``None`` (an assistant turn that only calls tools) or a list of parts
    (``{"type": "text", "text": ...}``); text parts are joined, others refused.

    Raises:
        APIError(400): no string role, or content of another shape.
    """
    if not isinstance(m.get("role"), str):
        raise APIError(400, "every message needs a string 'role'")
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, "message content parts must be {'type': 'text', 'text': str} (no images here)")
        content = "".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise APIError(400, "message 'content' must be a string, a list of text parts or null")
    return {**m, "content": content}


class _SamplingBody(_Body):
    """Sampling and stopping fields shared by /v1/completions and /v1/chat/completions."""

    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_k: int = 40
    stop: Optional[Union[str, List[str]]] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    seed: Optional[int] = None
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Optional[Dict[str, float]] = None
    grammar: Optional[str] = None
    stream: bool = False
    n: int = 1
    model: Optional[str] = None


class CompletionBody(_SamplingBody):
    prompt: Union[str, List[int], List[str]] = ""
    suffix: Optional[str] = None
    max_tokens: Optional[int] = 16
    temperature: float = 0.8
    logprobs: Optional[int] = Field(default=None, ge=0)
    echo: bool = False


class ChatBody(_SamplingBody):
    messages: List[Dict[str, Any]] = Field(min_length=1)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    functions: Optional[List[Dict[str, Any]]] = None
    function_call: Optional[Union[str, Dict[str, Any]]] = None
    response_format: Optional[Dict[str, Any]] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    temperature: float = 0.2
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0)


class EmbeddingBody(_Body):
    input: Union[str, List[str]]
    model: Optional[str] = None


class TokenizeBody(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(_Body):
    tokens: List[int]


class LlamaCompletionBody(_Body):
    """llama-server's ``/completion``."""
    prompt: Union[str, List[Union[int, str]], Dict[str, Any]] = ""
    n_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    grammar: Optional[str] = None
    json_schema: Optional[Dict[str, Any]] = None
    seed: Optional[int] = None
    ignore_eos: bool = False
    stop: Optional[Union[str, List[str]]] = None
    n_probs: int = Field(default=0, ge=0)
    post_sampling_probs: bool = False
    logit_bias: Optional[Union[List[List[Any]], Dict[str, Any]]] = None
    stream: bool = False
    cache_prompt: bool = True
    add_special: Optional[bool] = None


def _validate(model_cls, body):
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as e:
        details = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())
        raise APIError(400, f"invalid request: {details}") from None


async def _json_body(request: Request):
    raw = await request.body()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


# ---------------------------------------------------------------------------------------
# parameter mapping


def _logit_bias(d: Optional[Dict[str, float]], n_vocab: int) -> Optional[Dict[int, float]]:
    if not d:
        return None
    out = {}
    for k, v in d.items():
        try:
            tok = int(k)
        except ValueError:
            raise APIError(400, f"logit_bias keys must be token ids, got {k!r}") from None
        if not 0 <= tok < n_vocab:
            raise APIError(400, f"logit_bias: token id {tok} out of range [0, {n_vocab})")
        out[tok] = float(v)
    return out


def _grammar(text: Optional[str], llm, schema: Optional[dict] = None):
    """A ``LlamaGrammar`` from GBNF text (or a JSON schema), parsed once here: llama.cpp
    only parses it when the sampler chain is built, and a grammar it cannot parse would
    then be a NULL sampler (a crash of the server process)."""
    if not text and not schema:
        return None
    import llama_cpp
    from llama_cpp import LlamaGrammar

    try:
        g = (LlamaGrammar.from_string(text, verbose=False) if text
             else LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False))
    except Exception as e:
        raise APIError(400, f"invalid grammar: {e}") from None
    vocab = getattr(getattr(llm, "_model", None), "vocab", None)
    if vocab is not None:
        probe = llama_cpp.llama_sampler_init_grammar(vocab, g._grammar.encode("utf-8"), g._root.encode("utf-8"))
        if not probe:
            raise APIError(400, "invalid grammar: llama.cpp cannot parse it")
        llama_cpp.llama_sampler_free(probe)
    return g


def _check_finite(**values) -> None:
    for k, v in values.items():
        if v is not None and not math.isfinite(v):
            raise APIError(400, f"{k} must be a finite number, got {v}")


def _sampling(b, llm, n_vocab: int) -> dict:
    _check_finite(temperature=b.temperature, top_p=b.top_p, min_p=b.min_p, typical_p=b.typical_p,
                  frequency_penalty=b.frequency_penalty, presence_penalty=b.presence_penalty,
                  repeat_penalty=b.repeat_penalty)
    if b.n != 1:
        raise APIError(400, f"n={b.n}: only n=1 is supported")
    return dict(temperature=b.temperature, top_p=b.top_p, min_p=b.min_p, typical_p=b.typical_p, top_k=b.top_k,
                stop=b.stop or [], frequency_penalty=b.frequency_penalty, presence_penalty=b.presence_penalty,
                repeat_penalty=b.repeat_penalty, seed=b.seed, mirostat_mode=b.mirostat_mode,
                mirostat_tau=b.mirostat_tau, mirostat_eta=b.mirostat_eta,
                logit_bias=_logit_bias(b.logit_bias, n_vocab), grammar=_grammar(b.grammar, llm))


# ---------------------------------------------------------------------------------------
# the application


class ServerState:
    def __init__(self, llm, model_alias: str, max_queue: int, api_key: Optional[str]):
        self.llm = llm
        self.model_alias = model_alias
        self.api_key = api_key
        self.worker = ModelWorker(llm, max_queue=max_queue)
        self.created = int(time.time())
        self.n_vocab = int(llm.n_vocab())
        self.n_ctx = int(llm.n_ctx())


def create_app(llm, *, model_alias: Optional[str] = None, max_queue: int = 16, api_key: Optional[str] = None,
               disconnect_poll_s: float = 0.1) -> FastAPI:
    """The FastAPI application serving ``llm`` (a :class:`powerinfer_backend.Llama`, or
    anything with its API). ``max_queue``: requests that may wait behind the running
    one before 503; ``api_key``: required as ``Authorization: Bearer`` when set."""
    import os

    state = ServerState(llm, model_alias or os.path.basename(getattr(llm, "model_path", "model")), max_queue,
                        api_key)
    async def check_key(request: Request):
        # a dependency, not an HTTP middleware: Starlette's BaseHTTPMiddleware wraps
        # `receive`, and request.is_disconnected() (how a non-streaming request notices
        # its client left) then never sees the disconnect
        if state.api_key and request.url.path not in ("/health", "/v1/health"):
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {state.api_key}" and request.headers.get("x-api-key") != state.api_key:
                raise APIError(401, "invalid or missing API key", "authentication_error")

    app = FastAPI(title="powerinfer_backend", version=_version(), dependencies=[Depends(check_key)])
    app.state.serve = state

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return APIError(400, f"invalid request: {exc.errors()}").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return APIError(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404
                        else "invalid_request_error").response()

    @app.exception_handler(Exception)
    async def _any_error(request, exc):
        return _error_from_exception(exc).response()

    # ---- helpers --------------------------------------------------------------------

    async def run_once(request: Request, fn: Callable):
        """Run ``fn(llm)`` on the worker and return its result; a client that
        disconnects meanwhile cancels it."""
        job = state.worker.submit(fn)
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(job.items.get(), disconnect_poll_s)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        job.cancel.set()
                        raise APIError(499, "client closed the request")
                    continue
                if kind == "item":
                    return value
                if kind == "error":
                    raise _error_from_exception(value)
                raise APIError(499, "cancelled")
        finally:
            job.cancel.set()  # no-op when finished; stops a job whose caller was cancelled

    async def run_stream(request: Request, fn: Callable, fmt: Callable[[Any], Optional[dict]],
                         done: Optional[str] = "[DONE]"):
        """Run ``fn(llm)`` (an iterator) on the worker and answer an SSE stream of
        ``fmt(chunk)``. Errors before the first chunk are answered as JSON errors."""
        job = state.worker.submit(fn)
        try:
            kind, first = await job.items.get()
        except BaseException:
            job.cancel.set()
            raise
        if kind == "error":
            job.cancel.set()
            raise _error_from_exception(first)

        async def events():
            try:
                kind_, value = kind, first
                while kind_ == "item":
                    data = fmt(value)
                    if data is not None:
                        yield {"data": json.dumps(data, ensure_ascii=False)}
                    kind_, value = await job.items.get()
                if kind_ == "error":
                    err = _error_from_exception(value)
                    yield {"data": json.dumps({"error": {"message": err.message, "type": err.type,
                                                         "code": err.status}})}
                elif done is not None:
                    yield {"data": done}
            finally:
                job.cancel.set()  # client gone (task cancelled) or finished

        return EventSourceResponse(events(), ping=15, sep="\n")

    # ---- OpenAI-compatible --------------------------------------------------------------

    def model_card():
        llm = state.llm
        meta = {"n_vocab": state.n_vocab, "n_ctx_train": int(getattr(llm.engine, "n_ctx_train", state.n_ctx)),
                "n_ctx": state.n_ctx, "n_embd": int(llm.n_embd()), "vram_budget": llm.vram_budget,
                "sparse": str(llm.sparse), "backend": llm.backend}
        return {"id": state.model_alias, "object": "model", "created": state.created, "owned_by": "powerinfer_backend",
                "meta": meta}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request):
        b = _validate(CompletionBody, await _json_body(request))
        prompt = b.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported")
            prompt = prompt[0]
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < state.n_vocab]
            if bad:
                raise APIError(400, f"prompt token id {bad[0]} out of range [0, {state.n_vocab})")
        kw = dict(_sampling(b, state.llm, state.n_vocab), suffix=b.suffix, max_tokens=b.max_tokens, logprobs=b.logprobs,
                  echo=b.echo, model=state.model_alias)

        if b.stream:
            return await run_stream(request, lambda llm: llm.create_completion(prompt, stream=True, **kw),
                                    lambda c: c)
        return await run_once(request, lambda llm: llm.create_completion(prompt, stream=False, **kw))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        b = _validate(ChatBody, await _json_body(request))
        kw = _sampling(b, state.llm, state.n_vocab)
        kw.update(max_tokens=b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens,
                  tools=b.tools, tool_choice=b.tool_choice, functions=b.functions, function_call=b.function_call,
                  response_format=_response_format(b.response_format), logprobs=b.logprobs,
                  top_logprobs=b.top_logprobs, model=state.model_alias)
        messages = [_chat_message(m) for m in b.messages]
        if b.stream:
            return await run_stream(request,
                                    lambda llm: llm.create_chat_completion(messages, stream=True, **kw), lambda c: c)
        return await run_once(request, lambda llm: llm.create_chat_completion(messages, stream=False, **kw))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request):
        b = _validate(EmbeddingBody, await _json_body(request))
        inputs = [b.input] if isinstance(b.input, str) else list(b.input)

        def work(llm):
            data, total = [], 0
            for i, text in enumerate(inputs):
                emb, n = llm.embed(text, normalize=False, return_count=True)
                v = np.asarray(emb, dtype=np.float64)
                if v.ndim == 2:  # per-token (pooling NONE): mean-pooled for the OpenAI shape
                    v = v.mean(axis=0)
                norm = float(np.linalg.norm(v))
                data.append({"object": "embedding", "index": i, "embedding": (v / norm if norm else v).tolist()})
                total += n
            return {"object": "list", "data": data, "model": state.model_alias,
                    "usage": {"prompt_tokens": total, "total_tokens": total}}

        return await run_once(request, work)

    # ---- llama-server-compatible ------------------------------------------------------

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    def stats():
        try:
            return state.llm.stats()
        except Exception:  # e.g. the context is busy in a backend that refuses concurrent reads
            return {}

    @app.get("/props")
    async def props():
        llm = state.llm
        bos = eos = ""
        try:
            bos = llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace") if llm.token_bos() >= 0 else ""
            eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace") if llm.token_eos() >= 0 else ""
        except Exception:
            pass
        return {
            "default_generation_settings": {"n_ctx": state.n_ctx, "model": state.model_alias,
                                            "params": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                                       "n_predict": -1}},
            "total_slots": 1,
            "model_path": getattr(llm, "model_path", ""),
            "model_alias": state.model_alias,
            "chat_template": llm.metadata.get("tokenizer.chat_template", ""),
            "bos_token": bos,
            "eos_token": eos,
            "build_info": f"powerinfer_backend {_version()}",
            "vram_budget": llm.vram_budget,
            "sparse": str(llm.sparse),
            "stats": stats(),
            "queue": {"waiting": state.worker.waiting, "busy": state.worker.busy, "max_queue": state.worker.max_queue},
        }

    @app.get("/stats")
    async def stats_endpoint():
        w = state.worker
        return {"sparsity": stats(), "served": w.served, "cancelled": w.cancelled, "rejected": w.rejected,
                "waiting": w.waiting, "busy": w.busy, "max_queue": w.max_queue}

    @app.post("/tokenize")
    @app.post("/extras/tokenize")
    async def tokenize(request: Request):
        b = _validate(TokenizeBody, await _json_body(request))
        toks = state.llm.tokenize(b.content.encode("utf-8"), add_bos=b.add_special, special=b.parse_special)
        if b.with_pieces:
            pieces = []
            for t in toks:
                raw = state.llm.detokenize([t], special=True)
                try:
                    piece: Union[str, List[int]] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(raw)
                pieces.append({"id": t, "piece": piece})
            return {"tokens": pieces}
        return {"tokens": toks}

    @app.post("/detokenize")
    @app.post("/extras/detokenize")
    async def detokenize(request: Request):
        b = _validate(DetokenizeBody, await _json_body(request))
        bad = [t for t in b.tokens if not 0 <= t < state.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} out of range [0, {state.n_vocab})")
        return {"content": state.llm.detokenize(b.tokens, special=True).decode("utf-8", "replace")}

    @app.post("/completion")
    @app.post("/v1/completion")
    async def llama_completion(request: Request):
        b = _validate(LlamaCompletionBody, await _json_body(request))
        return await _llama_completion(request, b, state, run_once, run_stream)

    return app


def _response_format(rf):
    if rf is None:
        return None
    t = rf.get("type")
    if t == "json_schema":  # OpenAI's newer shape: {"type": "json_schema", "json_schema": {"schema": ...}}
        js = rf.get("json_schema") or {}
        return {"type": "json_object", "schema": js.get("schema", js)}
    if t in ("json_object", "text"):
        return None if t == "text" else rf
    raise APIError(400, f"response_format type {t!r} is not supported")


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------------------------------
# llama-server /completion


def _llama_prompt(llm, prompt, add_special: Optional[bool]):
    if isinstance(prompt, dict):
        if "multimodal_data" in prompt and prompt["multimodal_data"]:
            raise APIError(400, "multimodal prompts are not supported")
        prompt = prompt.get("prompt_string", "")
    if isinstance(prompt, str):
        return llm.tokenize(prompt.encode("utf-8"), add_bos=True if add_special is None else add_special,
                            special=True)
    toks: List[int] = []
    for p in prompt:  # llama-server accepts token ids mixed with strings
        if isinstance(p, str):
            toks += llm.tokenize(p.encode("utf-8"), add_bos=False, special=True)
        else:
            toks.append(int(p))
    return toks


def _token_entry(llm, tok: int, logprob: float, probs: bool) -> dict:
    raw = llm.detokenize([tok], special=True)
    e = {"id": int(tok), "token": raw.decode("utf-8", "replace"), "bytes": list(raw)}
    if probs:
        e["prob"] = float(math.exp(logprob))
    else:
        e["logprob"] = float(logprob)
    return e


def _next_token_probs(llm, logits: np.ndarray, chosen: Optional[int], n_probs: int, post: bool) -> dict:
    x = logits.astype(np.float64)
    x = x - x.max()
    lp = x - np.log(np.exp(x).sum())
    top = np.argsort(-lp, kind="stable")[:n_probs]
    if chosen is None:
        chosen = int(top[0])
    out = _token_entry(llm, chosen, lp[chosen], post)
    out["top_probs" if post else "top_logprobs"] = [_token_entry(llm, int(t), lp[t], post) for t in top]
    return out


async def _llama_completion(request, b: LlamaCompletionBody, state: ServerState, run_once, run_stream):
    llm = state.llm
    tokens = _llama_prompt(llm, b.prompt, b.add_special)
    if not tokens:
        raise APIError(400, "empty prompt")
    bad = [t for t in tokens if not 0 <= t < state.n_vocab]
    if bad:
        raise APIError(400, f"prompt token id {bad[0]} out of range [0, {state.n_vocab})")
    if len(tokens) >= state.n_ctx:
        raise APIError(400, f"the prompt ({len(tokens)} tokens) exceeds the available context size "
                            f"({state.n_ctx} tokens)", "exceed_context_size_error")
    _check_finite(temperature=b.temperature, top_p=b.top_p, min_p=b.min_p, typical_p=b.typical_p,
                  repeat_penalty=b.repeat_penalty, presence_penalty=b.presence_penalty,
                  frequency_penalty=b.frequency_penalty)
    bias: Dict[int, float] = {}
    lb = b.logit_bias
    items = lb.items() if isinstance(lb, dict) else (lb or [])
    for item in items:
        tok, v = item if isinstance(lb, dict) else (item[0], item[1])
        tok = int(tok)
        if not 0 <= tok < state.n_vocab:
            raise APIError(400, f"logit_bias: token id {tok} out of range")
        bias[tok] = -math.inf if v is False else float(v)
    if b.ignore_eos:
        bias[llm.token_eos()] = -math.inf
    grammar = _grammar(b.grammar, llm, b.json_schema)
    seed = None if b.seed is None or b.seed < 0 or b.seed == 0xFFFFFFFF else b.seed
    stops = [b.stop] if isinstance(b.stop, str) else list(b.stop or [])
    n_predict = b.n_predict
    settings = dict(n_ctx=state.n_ctx, n_predict=n_predict, temperature=b.temperature, top_k=b.top_k, top_p=b.top_p,
                    min_p=b.min_p, typical_p=b.typical_p, repeat_penalty=b.repeat_penalty,
                    presence_penalty=b.presence_penalty, frequency_penalty=b.frequency_penalty, mirostat=b.mirostat,
                    seed=b.seed if b.seed is not None else 0xFFFFFFFF, stop=stops, n_probs=b.n_probs)

    def gen(llm):
        """Yield ("token", id, text, probs) per token, then ("end", stop_type, stopping_word, n_eval)."""
        if not b.cache_prompt:
            llm.reset()
        t0 = time.perf_counter()
        if n_predict == 0:  # just the prompt: its next-token distribution when asked
            llm.reset()
            llm.eval(tokens)
            probs = None
            if b.n_probs:
                probs = _next_token_probs(llm, llm._scores[-1], None, b.n_probs, b.post_sampling_probs)
            yield ("end", "limit", "", len(tokens), probs, t0)
            return
        if seed is not None:
            llm.set_seed(seed)
        else:
            import random

            llm.set_seed(random.Random().randint(0, 2 ** 32 - 2))
        if bias:
            lb_arr = np.zeros(state.n_vocab, dtype=np.single)
            for t, v in bias.items():
                lb_arr[t] = v

            def processor(input_ids, scores):
                return scores + lb_arr
            processors = [processor]
        else:
            processors = None
        out = bytearray()
        emitted = 0  # bytes of `out` already sent
        n = 0
        stop_type, word = "limit", ""
        max_hold = max((len(s.encode("utf-8")) for s in stops), default=0)
        for tok in llm.generate(tokens, top_k=b.top_k, top_p=b.top_p, min_p=b.min_p, typical_p=b.typical_p,
                                temp=b.temperature, repeat_penalty=b.repeat_penalty,
                                frequency_penalty=b.frequency_penalty, presence_penalty=b.presence_penalty,
                                mirostat_mode=b.mirostat, mirostat_tau=b.mirostat_tau, mirostat_eta=b.mirostat_eta,
                                logits_processor=processors, grammar=grammar):
            if llm._is_eog(tok):
                stop_type = "eos"
                break
            n += 1
            probs = None
            if b.n_probs:
                probs = _next_token_probs(llm, llm._scores[-1], tok, b.n_probs, b.post_sampling_probs)
            out += llm.detokenize([tok], prev_tokens=None, special=False)
            # stop strings: search the decoded text; hold back a possible stop prefix
            full = bytes(out)
            hit = None
            for s in stops:
                i = full.find(s.encode("utf-8"))
                if i >= 0 and (hit is None or i < hit[0]):
                    hit = (i, s)
            if hit is not None:
                piece = full[emitted:hit[0]]
                yield ("token", tok, piece, probs)
                stop_type, word = "word", hit[1]
                break
            safe = len(full) - max(0, max_hold - 1) if stops else len(full)
            safe = _utf8_boundary(full, max(safe, emitted))
            yield ("token", tok, full[emitted:safe], probs)
            emitted = safe
            if 0 < n_predict <= n or llm.n_tokens >= state.n_ctx:
                break
        else:  # pragma: no cover - generate is endless
            pass
        if stop_type != "word" and emitted < len(out):
            yield ("token", None, bytes(out[emitted:]), None)
        yield ("end", stop_type, word, len(tokens), None, t0, n)

    def final(stop_type, word, n_eval, probs, t0, n_pred, content: str):
        dt = time.perf_counter() - t0
        res = {"content": content, "id_slot": 0, "stop": True, "model": state.model_alias,
               "tokens_predicted": n_pred, "tokens_evaluated": n_eval, "generation_settings": settings,
               "prompt": "", "has_new_line": "\n" in content, "truncated": False, "stop_type": stop_type,
               "stopping_word": word, "tokens_cached": n_eval + n_pred,
               "timings": {"prompt_n": n_eval, "predicted_n": n_pred, "predicted_ms": dt * 1e3,
                           "predicted_per_second": n_pred / dt if dt > 0 else 0.0}}
        if probs is not None:
            res["completion_probabilities"] = [probs]
        return res

    if b.stream:
        def fmt(item):
            if item[0] == "token":
                _, tok, piece, probs = item
                d = {"content": piece.decode("utf-8", "replace"), "tokens": [] if tok is None else [tok],
                     "stop": False, "id_slot": 0, "index": 0}
                if probs is not None:
                    d["completion_probabilities"] = [probs]
                return d
            _, stop_type, word, n_eval, probs, t0, *rest = item
            return final(stop_type, word, n_eval, probs, t0, rest[0] if rest else 0, "")

        return await run_stream(request, gen, fmt, done=None)

    def collect(llm):
        pieces, toks, probs_all = [], [], []
        for item in gen(llm):
            if item[0] == "token":
                pieces.append(item[2])
                if item[1] is not None:
                    toks.append(item[1])
                if item[3] is not None:
                    probs_all.append(item[3])
            else:
                _, stop_type, word, n_eval, probs, t0, *rest = item
                res = final(stop_type, word, n_eval, probs, t0, rest[0] if rest else 0,
                            b"".join(pieces).decode("utf-8", "replace"))
                res["tokens"] = toks
                if probs_all:
                    res["completion_probabilities"] = probs_all
                return res

    return await run_once(request, collect)


def _utf8_boundary(data: bytes, end: int) -> int:
    """The largest index <= end that does not split a UTF-8 character."""
    end = min(end, len(data))
    i = end
    while i > 0 and i > end - 4:
        c = data[i - 1]
        if c < 0x80:
            return end if i == end else i
        if c >= 0xC0:  # lead byte at i-1: complete when the character fits before `end`
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return end if (i - 1) + need <= end else i - 1
        i -= 1
    return end


# ---------------------------------------------------------------------------------------
# running it


def serve(args) -> int:
    import sys

    import uvicorn

    from .options import load_llama

    llm = load_llama(args)
    app = create_app(llm, model_alias=args.alias, max_queue=args.max_queue, api_key=args.api_key)
    print(f"powerinfer-backend: serving {llm.model_path} on http://{args.host}:{args.port} "
          f"(OpenAI API under /v1)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                    access_log=args.verbose, timeout_graceful_shutdown=2)
    finally:
        app.state.serve.worker.stop()
        llm.close()
    return 0
