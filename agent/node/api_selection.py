"""Selection apps' routes: feedback (``POST /v2/models/{app}/feedback``, inference scope)
and inspection behind the admin token (``/v1/selection``: list, show, a context, reset,
set or freeze weights). The apps themselves are ``agent.node.selection``."""

from __future__ import annotations

from aiohttp import web

from agent.http.body import request_body
from agent.node.routes import NODE, model_ref
from agent.node.tensors import BadRequest, parse_json


async def feedback(request: web.Request) -> web.Response:
    """``{"id", "labels" | "losses", "context"?}`` or ``{"feedback": [...]}`` →
    ``{"accepted": n, "unknown_ids": [...]}``."""
    name, version = model_ref(request)
    node = request.app[NODE]
    node.selection.app(name, version)  # 404 before the body is read
    doc = parse_json(await request_body(request))
    return web.json_response(node.selection.feedback(name, doc))


async def apps(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].selection.listing())


async def show(request: web.Request) -> web.Response:
    selection = request.app[NODE].selection
    name = request.match_info["name"]
    return web.json_response({**selection.app(name).describe(),
                              "contexts": selection.contexts(name)})


async def context(request: web.Request) -> web.Response:
    app = request.app[NODE].selection.app(request.match_info["name"])
    return web.json_response(app.describe(request.match_info["context"]))


async def reset(request: web.Request) -> web.Response:
    await request_body(request)
    return web.json_response(request.app[NODE].selection.reset(request.match_info["name"]))


async def weights(request: web.Request) -> web.Response:
    """``{"weights": {member: w, ...} | [w, ...], "freeze": bool}``: set the global
    weights (a canary's split), frozen (no learning) when ``freeze``."""
    app = request.app[NODE].selection.app(request.match_info["name"])
    doc = parse_json(await request_body(request))
    keys = app.keys or list(app.options.candidates)
    given = doc.get("weights") if isinstance(doc, dict) else None
    if isinstance(given, dict):
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise BadRequest(f"unknown member(s) {', '.join(unknown)}: the app's members are "
                             f"{', '.join(keys)}")
        given = [given.get(k, 0.0) for k in keys]
    freeze = doc.get("freeze", False) if isinstance(doc, dict) else None
    if not isinstance(given, list) or len(given) != len(keys) or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < 1e300
            for w in given) or not sum(given) > 0 or not isinstance(freeze, bool) or \
            set(doc) - {"weights", "freeze"}:
        raise BadRequest(f"expected {{\"weights\": {{member: w}} or [one per member, "
                         f"{len(keys)}], \"freeze\": true|false}} with weights >= 0 and "
                         "not all 0")
    app.set_weights([float(w) for w in given], freeze)
    return web.json_response(app.describe())


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v2/models/{name}/feedback", feedback)
    r.add_post("/v2/models/{name}/versions/{version}/feedback", feedback)
    r.add_get("/v1/selection", apps)
    r.add_get("/v1/selection/{name}", show)
    r.add_get("/v1/selection/{name}/contexts/{context}", context)
    r.add_post("/v1/selection/{name}/reset", reset)
    r.add_post("/v1/selection/{name}/weights", weights)
