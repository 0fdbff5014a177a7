"""Replicas of the server on Ray Serve (the ``[ray]`` extra: ``pip install '.[ray]'``).

Each replica is a Ray actor that loads the model and serves the same FastAPI app as
``powerinfer-backend serve`` (:func:`~powerinfer_backend.server.app.create_app`, through
``serve.ingress``), with ``--parallel`` slots of its own; Ray's HTTP proxy spreads the
requests over the replicas. Every response names the replica that answered in an
``X-Replica-Id`` header. docs/serving.md says when replicas are worth their memory
(each holds the weights' pages and its own KV cache) and has a KubeRay example.

From Python::

    from ray import serve
    from powerinfer_backend.server.ray import deployment
    serve.run(deployment("model.gguf", num_replicas=2, parallel=4), route_prefix="/")

From a Serve config (``serve run`` / KubeRay ``serveConfigV2``):
``import_path: powerinfer_backend.server.ray:app_builder`` with ``args`` = the keywords
of :func:`deployment`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

try:  # the [ray] extra
    from ray import serve
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("Ray Serve replicas need Ray: pip install '.[ray]' (ray[serve])") from e

#: the response header that names the replica
REPLICA_HEADER = "x-replica-id"


class ReplicaHeader:
    """ASGI middleware adding ``X-Replica-Id: <replica_id>`` to every HTTP response (an
    ASGI wrapper, not Starlette's BaseHTTPMiddleware, which hides client disconnects
    from the app's handlers)."""

    def __init__(self, app, replica_id: str):
        self.app = app
        self.value = replica_id.encode("latin-1")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", ()), (REPLICA_HEADER.encode(), self.value)])
            await send(message)

        await self.app(scope, receive, send_named)


def _replica_id() -> str:
    ctx = serve.get_replica_context()
    rid = getattr(ctx, "replica_id", None)
    return str(getattr(rid, "unique_id", None) or getattr(ctx, "replica_tag", "replica"))


def deployment(
    model: Optional[str] = None,
    *,
    num_replicas: int = 2,
    num_cpus: float = 1.0,
    parallel: int = 1,
    n_ctx: int = 2048,
    n_threads: Optional[int] = None,
    max_queue: int = 16,
    api_key: Optional[str] = None,
    model_alias: Optional[str] = None,
    name: str = "powerinfer",
    **llama_kwargs: Any,
):
    """A bound Ray Serve application: ``num_replicas`` replicas, each a
    :class:`~powerinfer_backend.Llama` (``model``: a GGUF path readable on every node;
    default: the embedded SmolLM2; ``n_ctx`` total over ``parallel`` slots,
    ``llama_kwargs``: any other Llama keyword) behind ``create_app``.

    ``num_cpus``: Ray CPUs reserved per replica (``n_threads`` defaults to it, rounded,
    at least 1), so replicas on one node do not oversubscribe its cores.

    Raises:
        ValueError: num_replicas < 1, num_cpus <= 0 or parallel < 1 (here, before Ray
            starts a replica); the model's own errors are raised in the replica.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if not num_cpus > 0:
        raise ValueError(f"num_cpus must be > 0, got {num_cpus}")
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    threads = int(n_threads) if n_threads else max(1, round(num_cpus))
    kwargs = dict(n_ctx=n_ctx, n_threads=threads, verbose=False, **llama_kwargs)
    if parallel > 1:
        kwargs["n_seq_max"] = parallel
    app_kwargs = dict(max_queue=max_queue, api_key=api_key, model_alias=model_alias, parallel=parallel)

    def build_app():  # runs in each replica, when Ray starts it
        from ..llama import Llama
        from ..loader.models import default_model_path
        from .app import create_app

        llm = Llama(model or default_model_path(), **kwargs)
        app = create_app(llm, **app_kwargs)
        app.add_middleware(ReplicaHeader, replica_id=_replica_id())
        return app

    ingress = serve.ingress(build_app)()
    return serve.deployment(
        name=name,
        num_replicas=int(num_replicas),
        ray_actor_options={"num_cpus": float(num_cpus)},
        max_ongoing_requests=max(1, parallel + max_queue),
    )(ingress).bind()


def app_builder(args: Dict[str, Any]):
    """Ray Serve's application builder (``import_path: powerinfer_backend.server.ray:app_builder``):
    ``args`` are :func:`deployment`'s keywords."""
    return deployment(**dict(args))
