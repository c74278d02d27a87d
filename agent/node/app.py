"""The node agent's aiohttp application: ``create_app`` assembles the ``Node``
(``agent.node.node``) and the route modules (``api_v2``, ``api_tfserving``,
``api_admin``, ``api_selection``, ``reporter``; they share ``agent.node.routes`` and
never import this module); ``prepare_process`` sets the process up before serving.

Errors: every failure is JSON ``{"error": "..."}`` with a fitting status (the
``errors`` middleware answers through ``agent.errors``, with no host path:
``agent.node.hostpaths``); 503s carry ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from agent.config import AgentConfig
from agent.http.dashboard import add_dashboard
from agent.errors import AgentError, client_disconnected, error_response, json_error
from agent.http.eventloop import handler_args
from agent.http.body import body_timeout_middleware
from agent.http.jsonnewline import json_newline
from agent.security.httpauth import carries_credential, host_check, own_names, scoped_auth
from agent.memory import tune_malloc
from agent.node.access import endpoint_need
from agent.node.hostpaths import public_message
from agent.node import (api_admin, api_routing, api_selection, api_tfserving, api_triton,
                        api_v2, reporter)
from agent.node.node import Node
from agent.node.routes import NODE, served_here

log = logging.getLogger("edgeagent.node")


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        if exc.status == 413:
            limit = request.app[NODE].config.max_request_size
            return json_error(413, f"request body over the limit of {limit} bytes")
        message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") \
            else f"{exc.reason}: {request.method} {request.path}"
        return json_error(exc.status, public_message(request.app[NODE], message),
                          {k: v for k, v in exc.headers.items() if k in ("Allow",)})
    except AgentError as exc:  # cache, input and backend errors; 503s with Retry-After
        return error_response(exc, lambda text: public_message(request.app[NODE], text))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug must answer 500, not kill the connection
        if client_disconnected(exc, request.transport):
            log.info("client went away during %s %s: %s", request.method, request.path, exc)
            return json_error(499, "client closed the request")
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal error (logged)")


auth_middleware = scoped_auth(
    lambda request: request.app[NODE].guard,
    lambda request: endpoint_need(request.method, request.path,
                                  request.app[NODE].config.auth.protect))


def prepare_process() -> None:
    """Set the agent's process up, once, before a model loads: glibc serves large
    allocations from mmap (``tune_malloc``), so an unload gives its memory back and a
    load's footprint is what the model holds. ``serve`` calls it, as do tests that
    measure footprints; ``Node`` does not."""
    tune_malloc()


def create_app(config: AgentConfig, *, node: Node | None = None, **node_kwargs: Any
               ) -> web.Application:
    """The agent's app for ``config``. ``node_kwargs`` (budgets, clock, backend_factory)
    are passed to ``Node`` for tests and benchmarks."""
    node = node or Node(config, **node_kwargs)
    read_body = body_timeout_middleware(config.read_timeout_s, config.max_request_size,
                                        memory=node.body_memory)
    names = own_names(config.host, config.allowed_hosts)
    host_middleware = host_check(lambda request: carries_credential(request,
                                                                    request.app[NODE].guard),
                                 lambda request: names)
    app = web.Application(client_max_size=config.max_request_size,
                          handler_args=handler_args(config.read_timeout_s),
                          middlewares=[json_newline, errors_middleware, host_middleware,
                                       auth_middleware, read_body])
    app[NODE] = node
    api_triton.add_routes(app)  # first: /v2/models/stats before /v2/models/{name}
    api_v2.add_routes(app)
    api_tfserving.add_routes(app)
    api_admin.add_routes(app)
    api_selection.add_routes(app)
    api_routing.add_routes(app)
    app.on_response_prepare.append(served_here)  # edgeagent-served-by on errors too
    add_dashboard(app, "node.html")
    # Before the node's hooks: the reporter stops before the cache closes.
    reporter.setup(app, app[NODE])

    async def on_startup(app: web.Application) -> None:
        await app[NODE].start()

    async def on_cleanup(app: web.Application) -> None:
        await app[NODE].close()

    app.on_startup.append(on_startup)
    async def on_shutdown(app: web.Application) -> None:
        node = app[NODE]
        node.serving.begin_shutdown(node.config.drain_seconds)

    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app
