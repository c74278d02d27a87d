"""What every route module of the node agent shares (``api_v2``, ``api_tfserving``,
``api_admin``, ``reporter``): the app key under which ``create_app`` stores the
``Node``, the request-counting wrapper of inference handlers, the model named in a
URL, and how an answer is sent: its body, a peer's answer relayed as it came, and the
node that served it (``edgeagent-served-by``). Statuses and JSON error bodies come from
``agent.errors``.

A leaf: route modules import it, ``agent.node.app`` assembles them; none imports the app.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from agent.backends.base import InvalidInput
from agent.errors import client_disconnected, http_status
from agent.node.call import Answer, Call
from agent.node.routing.trust import SERVE_MS, SERVED_BY
from agent.validation import ascii_int

if TYPE_CHECKING:
    from agent.node.node import Node

NODE: web.AppKey["Node"] = web.AppKey("node")


def counted(endpoint: str) -> Callable:
    """Wrap an inference handler: count every request (errors too) and time successes,
    labelled with ``endpoint`` (one of ``agent.node.metrics.ENDPOINTS``); with tracing
    on, each request is a span (``agent.tracing``)."""
    def wrap(handler: Callable) -> Callable:
        async def counted_handler(request: web.Request) -> web.StreamResponse:
            node = request.app[NODE]
            started = time.perf_counter()
            code = 500
            trace = None if node.tracing is None else node.tracing.request(  # tracing
                request.headers, request.match_info.get("name", ""), endpoint)
            try:
                response = await handler(request)
                code = response.status
                return response
            except BaseException as exc:
                code = 499 if client_disconnected(exc, request.transport) else http_status(exc)
                raise
            finally:
                node.desk.count(request.match_info.get("name", ""), endpoint, code,
                                time.perf_counter() - started if code == 200 else None,
                                _asked_version(request))
                if trace is not None:  # tracing
                    trace.end(code)
        return counted_handler
    return wrap


def _asked_version(request: web.Request) -> int | None:
    """The version in the URL for metrics: None when none (the default), -1 (no such
    version) when it is not an integer."""
    raw = request.match_info.get("version")
    if not raw:
        return None
    try:
        return ascii_int(raw, "version")
    except ValueError:
        return -1


def model_ref(request: web.Request) -> tuple[str, int | None]:
    """(model name, version or None) from the URL."""
    raw = request.match_info.get("version")
    if raw is None or raw == "":
        return request.match_info["name"], None
    try:
        return request.match_info["name"], ascii_int(raw, "version")
    except ValueError:  # malformed, not unknown: a 400
        raise InvalidInput(f"model {request.match_info['name']!r} has no version {raw!r}: "
                           "versions are integers (ASCII digits)") from None


#: Answers larger than this are written in pieces of this size, each its own step of the
#: event loop (one write of a large answer would hold the loop until it is done).
ANSWER_CHUNK = 2**20


async def send_body(request: web.Request, body: bytes | memoryview, content_type: str,
                    headers: dict[str, str] | None = None) -> web.StreamResponse:
    """The 200 answer ``body``: a plain response, or for one over ``ANSWER_CHUNK`` a
    streamed one (same Content-Length, not chunked) written a piece at a time, so that
    health checks and small requests are answered between the pieces."""
    if len(body) <= ANSWER_CHUNK:  # aiohttp sets no Content-Length for a memoryview
        return web.Response(body=bytes(body), content_type=content_type, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_type = content_type
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(body), ANSWER_CHUNK):
        await response.write(view[start:start + ANSWER_CHUNK])
    await response.write_eof()
    return response


def served_headers(node: Node, call: Call, answer: Answer) -> dict[str, str]:
    """The headers that name the node that served ``call`` and, for a call a peer
    forwarded here, how long this node took (the forwarding node's hop is the rest)."""
    headers = {SERVED_BY: answer.served_by or node.router.name}
    if call.mark is not None:
        headers[SERVE_MS] = f"{(node.serving.clock() - call.arrived) * 1000:.3f}"
    return headers


async def send_relayed(request: web.Request, answer: Answer) -> web.StreamResponse:
    """A peer's answer (``Answer.relayed``) as it came, naming the peer."""
    relayed = answer.relayed
    assert relayed is not None
    headers = {**relayed.headers, SERVED_BY: answer.served_by or ""}
    if relayed.status != 200:
        return web.Response(status=relayed.status, body=relayed.body, headers=headers)
    content_type = headers.pop("Content-Type", "application/json").split(";")[0]
    return await send_body(request, relayed.body, content_type, headers)


#: The inference paths' endings (KServe v2 and TF Serving REST).
_INFERENCE = ("/infer", ":predict")


async def served_here(request: web.Request, response: web.StreamResponse) -> None:
    """Name this node on an inference answer that names none (an error: an answer
    served names its server already); ``create_app`` hooks it to every response."""
    if SERVED_BY not in response.headers and request.path.endswith(_INFERENCE):
        response.headers[SERVED_BY] = request.app[NODE].router.name
