"""``powerinfer-backend serve``: one model behind OpenAI-compatible (``/v1/...``) and
llama-server-compatible (``/health``, ``/props``, ``/tokenize``, ``/detokenize``,
``/completion``) HTTP endpoints (FastAPI + uvicorn + sse-starlette; docs/serving.md).

Design:

* One worker (:mod:`.worker`) owns the :class:`~powerinfer_backend.Llama`'s context and
  runs up to ``parallel`` requests together (continuous batching, ``--parallel``), each
  in a slot: its own sequence of the context, sampler chain, stop handling and stream.
  Every step decodes one token of each running slot in one batched pass; requests join
  and leave between steps. A sequence's logits do not depend on the others in its
  batch, so greedy results do not depend on what else is being served.
* A bounded queue: at most ``max_queue`` requests wait for a slot; more get ``503``
  with an OpenAI-style JSON error right away.
* Results travel from the slots to the event loop per chunk; a client that disconnects
  sets its job's cancel flag: its slot leaves the next step (KV cells cleared), so its
  generation stops within one token, streaming or not.
* Parameters are passed to our ``Llama``'s ``create_completion`` /
  ``create_chat_completion``, which follow llama-cpp-python's rules, so they mean what
  they mean there.

Modules: :mod:`.worker` (the thread and its queue), :mod:`.state` (running a request on
it), :mod:`.body` (raw body limits), :mod:`.schemas` (the declared request bodies) and
:mod:`.params` (request fields to generation arguments),
:mod:`.errors`, :mod:`.routes` (OpenAI), :mod:`.compat` and :mod:`.llama_completion`
(llama-server); this one wires them into an app and serves it.
"""

from __future__ import annotations

import os
from typing import Optional

try:  # the [server] extra, checked before the modules that need it
    import fastapi  # noqa: F401 - installed?
    import greenlet  # noqa: F401 - installed?
    import pydantic  # noqa: F401 - installed?
    import sse_starlette  # noqa: F401 - installed?
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the server needs FastAPI, uvicorn, sse-starlette and greenlet: "
        "pip install 'powerinfer_backend[server]' "
        "(from a clone: pip install -e '.[server]')"
    ) from e

from fastapi import Depends, FastAPI, Request

from .. import __version__
from .body import DEFAULT_MAX_BODY_BYTES, CheckedBodyRoute
from .compat import register_llama_server
from .errors import APIError, add_error_handlers
from .routes import register_openai
from .state import ServerState


def create_app(
    llm,
    *,
    model_alias: Optional[str] = None,
    max_queue: int = 16,
    api_key: Optional[str] = None,
    disconnect_poll_s: float = 0.1,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    parallel: Optional[int] = None,
) -> FastAPI:
    """The FastAPI application serving ``llm`` (a :class:`powerinfer_backend.Llama`, or
    anything with its API). ``max_queue``: requests that may wait for a slot before
    503; ``api_key``: required as ``Authorization: Bearer`` when set;
    ``max_body_bytes``: larger request bodies get 413; ``parallel``: requests decoded
    together (default: the context's ``n_seq_max``, see ``Llama(n_seq_max=...)``).

    Raises:
        ValueError: ``parallel`` above what ``llm``'s context serves."""
    state = ServerState(
        llm,
        model_alias or os.path.basename(getattr(llm, "model_path", "model")),
        max_queue,
        api_key,
        disconnect_poll_s,
        parallel=parallel,
    )

    async def check_key(request: Request):
        # a dependency, not an HTTP middleware: Starlette's BaseHTTPMiddleware wraps
        # `receive`, and a non-streaming request (which awaits the `http.disconnect`
        # message to notice its client left) then never sees the disconnect
        if state.api_key and request.url.path not in ("/health", "/v1/health"):
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {state.api_key}" and request.headers.get("x-api-key") != state.api_key:
                raise APIError(401, "invalid or missing API key", "authentication_error")

    app = FastAPI(title="powerinfer_backend", version=__version__, dependencies=[Depends(check_key)])
    app.router.route_class = CheckedBodyRoute  # size and nesting checked before a body is parsed
    app.state.serve = state
    app.state.max_body_bytes = int(max_body_bytes)
    app.state.check_request = check_key  # also before a body is read (bodies are read before dependencies run)
    add_error_handlers(app)
    register_openai(app, state)
    register_llama_server(app, state)
    return app


def serve(args) -> int:
    """Run ``powerinfer-backend serve``: the budget (flag or environment) checked and the
    port bound before the model loads, so a bad budget or a taken port fails at once.

    Raises:
        ValueError: a bad ``$POWERINFER_VRAM_BUDGET``, slots smaller than
            :data:`MIN_SLOT_CTX` tokens, or the address cannot be bound (taken port,
            unknown host; the message names host and port).
    """
    import sys

    import uvicorn

    from .options import load_llama
    from .placement_args import env_budget

    budget = env_budget(args)
    if args.ctx_size:  # 0: the model's context, known once loaded
        check_slot_size(args.ctx_size, args.parallel)
    sock = bind_socket(args.host, args.port)
    try:
        llm = load_llama(args, budget)
        if not args.ctx_size:
            try:
                check_slot_size(llm.n_ctx(), args.parallel)
            except ValueError:
                llm.close()
                raise
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]
    app = create_app(
        llm, model_alias=args.alias, max_queue=args.max_queue, api_key=args.api_key, parallel=args.parallel
    )
    import anyio

    anyio.run(anyio.sleep, 0)  # loads anyio's asyncio backend now: lazily, it blocked the event loop in a request
    print(
        f"powerinfer-backend: serving {llm.model_path} on http://{args.host}:{port} (OpenAI API under /v1)",
        file=sys.stderr,
        flush=True,
    )
    try:
        config = uvicorn.Config(
            app,
            host=args.host,
            port=port,
            log_level="info" if args.verbose else "warning",
            access_log=args.verbose,
            timeout_graceful_shutdown=2,
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        app.state.serve.worker.stop()
        llm.close()
    return 0


#: the fewest tokens a slot may hold (``--ctx-size`` // ``--parallel``): below it every
#: request fails on the context window, so the server refuses to start
MIN_SLOT_CTX = 16


def check_slot_size(ctx_size: int, parallel: int) -> None:
    """ValueError naming both flags when ``--ctx-size`` (tokens; the model's context when
    the flag was 0) split over ``--parallel`` slots leaves fewer than :data:`MIN_SLOT_CTX`
    tokens per slot."""
    if parallel > 1 and ctx_size // parallel < MIN_SLOT_CTX:
        n = ctx_size // parallel
        raise ValueError(
            f"--ctx-size {ctx_size} split over --parallel {parallel} slots leaves "
            f"{n} token{'s' if n != 1 else ''} per slot (at least {MIN_SLOT_CTX}): raise --ctx-size "
            f"or lower --parallel"
        )


def bind_socket(host: str, port: int):
    """A listening TCP socket on ``host``:``port`` (0: a free port), bound as uvicorn binds
    (``SO_REUSEADDR``, so a port in TIME_WAIT is free).

    Raises:
        ValueError: the address cannot be bound (in use, not ours, unknown host).
    """
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ]
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as e:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port}: {e.strerror or e} (is another server running there? "
            f"choose another --port)"
        ) from None
    sock.set_inheritable(True)
    return sock
