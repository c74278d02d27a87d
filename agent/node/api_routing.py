"""The node's routing, seen from outside: ``GET /v1/routing`` (the table, its age,
the peers' health and every model's routed traffic; ``agent.node.routing``)."""

from __future__ import annotations

from aiohttp import web

from agent.node.routes import NODE


async def routing_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].router.describe())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/routing", routing_status)
