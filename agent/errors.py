"""One way to say what went wrong, for the node agent and the coordinator alike.

- ``AgentError``: the base of every error that knows its answer: ``status`` (the HTTP
  status) and ``retry_after`` (seconds, or None). The cache's errors (``CacheError``,
  ``Shed``), the backends' (``BackendError``, ``InvalidInput``) and the coordinator's
  (``CatalogError``, ``PlanError``, ``ReportError``) and the model sources'
  (``agent.sources.errors``: 400/403/404/502/503/507) derive from it.
- ``http_status(exc)``: the one map from any exception to an HTTP status;
  ``grpc_code(exc)`` the same error as a gRPC status code name (for a gRPC endpoint).
- ``retry_after_seconds`` / ``retry_after_header``: the one ``Retry-After`` rounding
  (whole seconds, at least 1, rounded up).
- ``json_error`` / ``error_response``: the JSON ``{"error": "..."}`` answer.
- ``client_disconnected``: a client that went away mid-request (INFO, no trace, 499).
- ``json_errors_middleware``: an aiohttp app's every error answered as JSON.

A shared leaf: imports no other ``agent`` module, and aiohttp only where it builds a
response (a backend that imports this module does not load aiohttp).
"""

from __future__ import annotations

import logging
import math
import sys
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from aiohttp import web


class AgentError(Exception):
    """An error that knows its answer: ``status`` (HTTP) and ``retry_after`` (seconds
    the client should wait before retrying, or None). Subclasses set both as class
    attributes; an instance may carry its own ``retry_after``."""

    status: int = 500
    retry_after: float | None = None
    #: The answer's message in place of the error's own where that may hold what must
    #: not leave the server (a store's host, user, database); the log gets the message.
    public: str | None = None


def http_status(exc: BaseException) -> int:
    """The HTTP status ``exc`` answers with: an ``AgentError``'s own, an aiohttp
    ``HTTPException``'s own, else 500."""
    if isinstance(exc, AgentError):
        return exc.status
    web = sys.modules.get("aiohttp.web")  # not loaded: exc cannot be one of its errors
    if web is not None and isinstance(exc, web.HTTPException):
        return exc.status
    return 500


#: HTTP status -> gRPC status code name (google.rpc.Code), after the mapping in
#: googleapis' ``google/rpc/code.proto``.
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",  # the request did not arrive within read_timeout_s
    409: "FAILED_PRECONDITION",  # model in use, plan not possible in this state
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",  # a model source served bytes that fail their digest
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    507: "RESOURCE_EXHAUSTED",  # the model can never fit in its budget
}


def grpc_code(exc: BaseException) -> str:
    """The gRPC status code name for ``exc`` (through ``http_status``); UNKNOWN for a
    status without one."""
    return GRPC_CODES.get(http_status(exc), "UNKNOWN")


def retry_after_seconds(seconds: float) -> int:
    """``seconds`` as a ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(seconds))


def retry_after_header(seconds: float | None) -> dict[str, str]:
    """``{"Retry-After": ...}`` for ``seconds`` (see ``retry_after_seconds``); empty
    for None."""
    if seconds is None:
        return {}
    return {"Retry-After": str(retry_after_seconds(seconds))}


def client_disconnected(exc: BaseException, transport: object | None) -> bool:
    """Whether ``exc`` is the client going away mid-request (reading its body or writing
    the answer, with the connection lost or closing) and no fault of ours: logged at
    INFO without a trace and answered 499 (nginx's "client closed request"), which
    nobody reads."""
    return isinstance(exc, ConnectionResetError) and (
        transport is None or getattr(transport, "is_closing", lambda: True)())


def json_error(status: int, message: str, headers: dict[str, str] | None = None
               ) -> web.Response:
    """The JSON error answer: ``{"error": message}`` with ``status``."""
    from aiohttp import web
    return web.json_response({"error": message}, status=status, headers=headers)


def error_response(exc: AgentError, public: Callable[[str], str] | None = None
                   ) -> web.Response:
    """``exc``'s answer: its status, its message (its ``public`` one where it has one;
    passed through ``public``, which takes out what a client must not read),
    ``Retry-After`` when it carries one."""
    message = exc.public or str(exc)
    return json_error(http_status(exc), public(message) if public else message,
                      retry_after_header(exc.retry_after) or None)


def json_errors_middleware(log: logging.Logger,
                           lane: Callable[[web.Request], Any] | None = None) -> Any:
    """An aiohttp middleware that answers every error as JSON ``{"error": ...}``:
    aiohttp's own HTTP errors with their status ("Reason: METHOD path"), an
    ``AgentError`` by ``error_response``, a client gone mid-request 499 (logged at
    INFO), anything else 500 (logged with its trace: a bug must answer, not kill the
    connection). ``lane(request)``: a handler to run instead of the rest of the chain
    (a hot path that skips the later middlewares), or None for the chain."""
    from aiohttp import web

    @web.middleware
    async def answer_errors_as_json(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await ((lane and lane(request)) or handler)(request)
        except web.HTTPException as exc:
            if exc.status < 400 or exc.content_type == "application/json":
                raise
            return json_error(exc.status, f"{exc.reason}: {request.method} {request.path}")
        except AgentError as exc:
            if exc.public:  # the answer says less: the log says what happened
                log.warning("%s %s: %s", request.method, request.path, exc)
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - answered, not a dropped connection
            if client_disconnected(exc, request.transport):
                log.info("client went away during %s %s: %s", request.method,
                         request.path, exc)
                return json_error(499, "client closed the request")
            log.exception("unhandled error on %s %s", request.method, request.path)
            return json_error(500, "internal error (logged)")

    return answer_errors_as_json
