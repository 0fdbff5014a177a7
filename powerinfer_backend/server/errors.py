"""The server's errors: :class:`APIError` (answered in OpenAI's JSON error shape), the
mapping of exceptions raised while serving to it, and the app's exception handlers."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_from_exception(e: BaseException) -> APIError:
    """The HTTP error for an exception raised while serving: the caller's fault (bad
    values, a prompt over the context) is 400, anything else 500."""
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


def add_error_handlers(app) -> None:
    """Answer every error of ``app`` (ours, FastAPI's validation, Starlette's 404 / 405,
    any other exception) in the OpenAI shape."""

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
        return error_from_exception(exc).response()
