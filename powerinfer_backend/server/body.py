"""Raw request bodies, checked and parsed before FastAPI validates them against the
declared models (:mod:`.schemas`): at most ``max_body_bytes`` (413), arrays and objects
nested at most :data:`MAX_DEPTH` deep (400 — Python's JSON parser and the validators
recurse, and a deep enough body would end in ``RecursionError``), standard JSON (400 for
``NaN`` / ``Infinity``, which Python's parser takes but JSON, OpenAI and llama-server do
not), read as JSON whatever the Content-Type says (llama-server does so; ``curl -d``
sends form-urlencoded), an empty body as ``{}``."""

from __future__ import annotations

import json

import numpy as np
from fastapi import Request
from fastapi.routing import APIRoute

from .errors import APIError

#: deepest array / object nesting accepted (JSON schemas in ``tools`` and
#: ``response_format`` nest a few levels per property; 64 leaves them ample room)
MAX_DEPTH = 64
#: default body limit: a prompt filling a 128k context is well under 1 MiB of text
DEFAULT_MAX_BODY_BYTES = 16 << 20

_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``raw`` (brackets
    inside strings not counted); linear time, numpy. For text that is not JSON the
    result is some number (the parser rejects the text afterwards)."""
    a = np.frombuffer(raw, dtype=np.uint8)
    where = np.flatnonzero(_OPEN[a])
    if where.size == 0:
        return 0
    quotes = np.flatnonzero(a == ord('"'))
    slashes = np.flatnonzero(a == ord("\\"))
    if quotes.size and slashes.size:
        # a quote is escaped when an odd number of backslashes precedes it: the length
        # of the backslash run ending right before each quote
        run_end = slashes[np.append(np.diff(slashes) != 1, True)]
        run_start = slashes[np.insert(np.diff(slashes) != 1, 0, True)]
        i = np.searchsorted(run_end, quotes - 1)
        i_ok = np.minimum(i, run_end.size - 1)
        hit = (i < run_end.size) & (run_end[i_ok] == quotes - 1)
        run = np.where(hit, run_end[i_ok] - run_start[i_ok] + 1, 0)
        quotes = quotes[run % 2 == 0]
    # a bracket after an odd number of (unescaped) quotes is inside a string
    outside = where[np.searchsorted(quotes, where) % 2 == 0]
    if outside.size == 0:
        return 0
    return int(max(0, np.cumsum(_OPEN[a[outside]], dtype=np.int64).max()))


def _content_length(scope) -> int:
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return -1
    return -1


async def read_checked_body(request: Request, max_body_bytes: int) -> bytes:
    """The whole body of ``request``, at most ``max_body_bytes`` read.

    Raises:
        APIError(413): the body (or its Content-Length) is over ``max_body_bytes``.
        APIError(400): arrays / objects nested deeper than :data:`MAX_DEPTH`.
    """
    too_big = APIError(413, f"the request body is over the limit of {max_body_bytes} bytes")
    if _content_length(request.scope) > max_body_bytes:
        raise too_big
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > max_body_bytes:
            raise too_big
        chunks.append(chunk)
    raw = b"".join(chunks)
    depth = json_depth(raw)
    if depth > MAX_DEPTH:
        raise APIError(400, f"the request body nests arrays / objects {depth} deep; at most {MAX_DEPTH} are accepted")
    return raw


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes):
    """``raw`` as standard JSON (an empty body: ``{}``).

    Raises:
        APIError(400): not UTF-8 JSON, or NaN / Infinity in it.
    """
    if not raw:
        return {}
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


class CheckedBodyRoute(APIRoute):
    """An ``APIRoute`` whose JSON body passes :func:`read_checked_body` (the limit:
    ``app.state.max_body_bytes``) and :func:`parse_json` before FastAPI validates it;
    ``app.state.check_request(request)`` (the API key), when set, runs before the body
    is read."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def checked(request: Request):
            state = request.app.state
            check = getattr(state, "check_request", None)
            if check is not None:
                await check(request)
            raw = await read_checked_body(request, getattr(state, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
            parsed = parse_json(raw)
            # FastAPI reads a body as JSON only under a JSON content type, and takes it
            # from Starlette's caches of the body and of its parsed JSON
            request.scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"] + [
                (b"content-type", b"application/json")
            ]
            request.__dict__.pop("_headers", None)
            request._body = raw or b"{}"
            request._json = parsed
            return await handler(request)

        return checked
