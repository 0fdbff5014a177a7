"""The server's errors: :class:`APIError` (answered in OpenAI's JSON error shape), the
mapping of exceptions raised while serving to it, and the app's exception handlers."""

from __future__ import annotations

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
        return APIError(400, f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])} "
                             f"(at character {e['loc'][-1]})")
    details = dict.fromkeys(f"{field_path(e['loc']) or 'body'}: {e['msg']}" for e in errors)
    param = field_path(errors[0]["loc"]) if errors else ""
    return APIError(400, f"invalid request: {'; '.join(details)}", param=param or None)


def add_error_handlers(app) -> None:
    """Answer every error of ``app`` (ours, FastAPI's validation, Starlette's 404 / 405,
    any other exception) in the OpenAI shape."""

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return APIError(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404
                        else "invalid_request_error").response()

    @app.exception_handler(Exception)
    async def _any_error(request, exc):
        return error_from_exception(exc).response()
