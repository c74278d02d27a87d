"""Cache admin (``/v1/cache``) and ``/metrics``."""

from __future__ import annotations

from aiohttp import web

from agent.node.app import NODE
from agent.node.cache import UnknownModel


def _version(request: web.Request) -> int | None:
    raw = request.query.get("version")
    if raw is None:
        return None
    if not raw.isdigit():
        raise UnknownModel(f"version must be an integer, got {raw!r}")
    return int(raw)


async def cache_list(request: web.Request) -> web.Response:
    cache = request.app[NODE].cache
    return web.json_response([cache.describe(e) for e in cache.listing()])


async def cache_get(request: web.Request) -> web.Response:
    cache = request.app[NODE].cache
    entry = cache.entry(request.match_info["name"], _version(request))
    return web.json_response({**cache.describe(entry),
                              "versions": list(entry.spec.versions),
                              "memory": cache.memory().get(entry.device)})


async def cache_action(request: web.Request) -> web.Response:
    node = request.app[NODE]
    name, action = request.match_info["name"], request.match_info["action"]
    version = _version(request)
    if action == "evict":
        entry = await node.cache.evict(name, version)
    else:
        entry = node.cache.set_pinned(name, action == "pin", version)
        node.schedule_persist()
    return web.json_response(node.cache.describe(entry))


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(body=request.app[NODE].metrics.render(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v1/cache", cache_list)
    r.add_get("/v1/cache/{name}", cache_get)
    r.add_post("/v1/cache/{name}/{action:pin|unpin|evict}", cache_action)
    r.add_get("/metrics", metrics)
