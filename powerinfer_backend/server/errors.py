"""The server's errors: :class:`APIError` (answered in OpenAI's JSON error shape), the
mapping of exceptions raised while serving to it, the app's exception handlers, and how
each answered error is logged (:func:`log_error`: a client's mistake is one line, a
server fault keeps its traceback)."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param", "code"}}``
    (``param``: the request field at fault, or None; ``code``: the HTTP status)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_from_exception(e: BaseException) -> APIError:
    """The HTTP error for an exception raised while serving: what llama-cpp-python (and
    our ``Llama``) raise for arguments they refuse — ``ValueError``, a prompt over the
    context, ``NotImplementedError`` — is 400; anything else (``TypeError``, ``KeyError``,
    ``RuntimeError``, ...) is a bug here and 500, never hidden as the caller's fault."""
    if isinstance(e, APIError):
        return e
    msg = str(e) or type(e).__name__
    if isinstance(e, ValueError) and "exceed context window" in msg:
        return APIError(400, msg, "exceed_context_size_error")  # the type llama-server (and tgw) use
    if isinstance(e, (ValueError, NotImplementedError)):
        return APIError(400, msg)
    if isinstance(e, RuntimeError) and ("empty prompt" in msg or "embedding=True" in msg):
        return APIError(400, msg)
    return APIError(500, f"{type(e).__name__}: {msg}", "server_error")


#: the exception types :func:`error_from_exception` may answer as a client's mistake (4xx)
CLIENT_ERROR_TYPES = (ValueError, NotImplementedError, RuntimeError)

#: the server's log: uvicorn's own logger, so ``serve`` prints these lines with uvicorn's
#: (WARNING and above by default, INFO too with ``--verbose``)
log = logging.getLogger("uvicorn.error")


def log_error(request, err: APIError, cause: Optional[BaseException] = None) -> None:
    """Log the error answered to ``request``: a client's mistake (4xx, or a 5xx such as a
    full queue that no exception caused) as one WARNING line naming the endpoint, status
    and message (a client that went away, 499: INFO); a 5xx caused by an exception
    (``cause``) at ERROR with that exception's traceback."""
    where = f"{request.method} {request.url.path}"
    message = " ".join(err.message.splitlines())  # one line, whatever a parser's message held
    if err.status >= 500 and cause is not None and not isinstance(cause, APIError):
        log.error("%s: %d %s", where, err.status, message, exc_info=cause)
    else:
        log.log(logging.INFO if err.status == 499 else logging.WARNING, "%s: %d %s", where, err.status, message)


# what pydantic puts in a location for the member of a union it tried ("str",
# "list[int]", "constrained-int", "literal['a']", a model's class name)
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "tuple", "none"}


def _union_label(part) -> bool:
    return isinstance(part, str) and (part in _TYPE_NAMES or part[:1].isupper() or any(c in part for c in "[]-,'"))


def field_path(loc: Sequence) -> str:
    """A validation error location as OpenAI names a parameter: ``messages[0].content``
    (FastAPI's leading ``"body"`` and pydantic's union member labels dropped)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if _union_label(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(errors: Sequence[dict]) -> APIError:
    """The 400 for pydantic's (or FastAPI's) ``errors()``: every problem in the message
    (once each), the first one's field as ``param``."""
    if errors and errors[0].get("type") == "json_invalid":
        e = errors[0]
        return APIError(
            400,
            f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])} "
            f"(at character {e['loc'][-1]})",
        )
    details = dict.fromkeys(f"{field_path(e['loc']) or 'body'}: {e['msg']}" for e in errors)
    param = field_path(errors[0]["loc"]) if errors else ""
    return APIError(400, f"invalid request: {'; '.join(details)}", param=param or None)


def add_error_handlers(app) -> None:
    """Answer every error of ``app`` (ours, FastAPI's validation, Starlette's 404 / 405,
    any other exception) in the OpenAI shape, each logged by :func:`log_error`."""

    def answered(request, err: APIError, cause: Optional[BaseException] = None):
        log_error(request, err, cause)
        return err.response()

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return answered(request, exc, exc.__cause__)  # the cause: what the worker raised

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return answered(request, validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return answered(
            request,
            APIError(
                exc.status_code,
                str(exc.detail),
                "not_found_error" if exc.status_code == 404 else "invalid_request_error",
            ),
        )

    # Registered per type, these run in Starlette's ExceptionMiddleware, which answers
    # and is done; the handler for Exception runs in its ServerErrorMiddleware, which
    # re-raises after answering, so uvicorn logs the traceback ("Exception in ASGI
    # application"): right for a fault, wrong for a client's mistake.
    async def _refused(request, exc):
        err = error_from_exception(exc)
        if err.status >= 500:
            raise exc  # a fault after all: the 500 below, with its traceback in the log
        return answered(request, err)

    for t in CLIENT_ERROR_TYPES:
        app.add_exception_handler(t, _refused)

    @app.exception_handler(Exception)
    async def _any_error(request, exc):
        return error_from_exception(exc).response()
