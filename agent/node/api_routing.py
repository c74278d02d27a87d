"""The node's routing, seen from outside: ``GET /v1/routing`` (the table, its age,
the peers' health and every model's routed traffic) and the ``edgeagent-served-by``
header on every inference answer (``agent.node.routing``)."""

from __future__ import annotations

from aiohttp import web

from agent.node.routes import NODE

#: The inference paths' endings (KServe v2 and TF Serving REST).
_INFERENCE = ("/infer", ":predict")


async def routing_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].router.describe())


async def _served_by(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.endswith(_INFERENCE):
        request.app[NODE].router.served_http(request, response)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/routing", routing_status)
    app.on_response_prepare.append(_served_by)
