"""What every route module of the node agent shares (``api_v2``, ``api_tfserving``,
``api_admin``, ``reporter``): the app key under which ``create_app`` stores the
``Node``, the request-counting wrapper of inference handlers, the status an exception
answers with, the JSON error body and the model named in a URL.

A leaf: route modules import it, ``agent.node.app`` assembles them; none imports the app.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from agent.backends import BackendError, InvalidInput
from agent.node.cache import CacheError, UnknownModel

if TYPE_CHECKING:
    from agent.node.node import Node

NODE: web.AppKey["Node"] = web.AppKey("node")


def error_status(exc: BaseException) -> int:
    """The HTTP status a handler's exception answers with."""
    if isinstance(exc, CacheError):
        return exc.status
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, BackendError):
        return exc.status
    if isinstance(exc, web.HTTPException):
        return exc.status
    return 500


def json_error(status: int, message: str, headers: dict[str, str] | None = None
               ) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def counted(protocol: str) -> Callable:
    """Wrap an inference handler: count every request (errors too) and time successes."""
    def wrap(handler: Callable) -> Callable:
        async def counted_handler(request: web.Request) -> web.StreamResponse:
            node = request.app[NODE]
            started = time.perf_counter()
            code = 500
            try:
                response = await handler(request)
                code = response.status
                return response
            except BaseException as exc:
                code = error_status(exc)
                raise
            finally:
                name = request.match_info.get("name", "")
                node.metrics.observe(name if name in node.cache.specs else "<unknown>",
                                     protocol, code,
                                     time.perf_counter() - started if code == 200 else None)
        return counted_handler
    return wrap


def model_ref(request: web.Request) -> tuple[str, int | None]:
    """(model name, version or None) from the URL."""
    raw = request.match_info.get("version")
    if raw is None or raw == "":
        return request.match_info["name"], None
    if not raw.isdigit():
        raise UnknownModel(f"model {request.match_info['name']!r} has no version {raw!r}: "
                           "versions are integers")
    return request.match_info["name"], int(raw)
