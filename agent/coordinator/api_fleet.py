"""The coordinator's fleet routes: sizing (Ribbon) and provisioning (MArk).

    POST /v1/sizing          the cheapest pool of node kinds for the forecast load
                             (``sizing.parse_sizing_request`` for the body); the search
                             runs in a worker thread, one at a time
    GET  /v1/provisioning    what to launch and stop now, cost per hour before and after

Both need the admin token like every coordinator path but ``/v1/health`` (the app's
middleware); errors are the app's ``{"error": ...}`` (400 naming the field, 409 when
there is nothing to plan from).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from agent.coordinator.catalog import CatalogError
from agent.coordinator.planner import Planner
from agent.coordinator.sizing import parse_sizing_request, provision_fleet, size_fleet
from agent.http.body import request_body
from agent.validation import load_json

SIZING_LOCK: web.AppKey[asyncio.Lock] = web.AppKey("sizing_lock", asyncio.Lock)
#: Where ``add_routes`` finds the app's key of its ``Coordinator`` (the app passes it:
#: this module never imports the app, which imports it).
COORDINATOR_KEY: web.AppKey[web.AppKey] = web.AppKey("fleet_coordinator_key", web.AppKey)


def _coordinator(request: web.Request):
    return request.app[request.app[COORDINATOR_KEY]]


def _reader(co) -> Planner:
    """A ``Planner`` over the coordinator's store, for its view (live reports, models,
    forecasts) only: plans are made elsewhere (``co.planner``)."""
    return Planner(co.store, co.config, clock=co.clock)


async def sizing_post(request: web.Request) -> web.Response:
    co = _coordinator(request)
    raw = await request_body(request)
    try:
        body = load_json(raw) if raw.strip() else {}
    except ValueError as exc:
        raise CatalogError(f"body is not valid JSON: {exc}") from None
    sizing = parse_sizing_request(body, co.config)
    async with request.app[SIZING_LOCK]:
        await asyncio.to_thread(co.writer.flush)
        result = await asyncio.to_thread(size_fleet, _reader(co), co.config, co.clock(),
                                         sizing)
    return web.json_response(result)


async def provisioning_get(request: web.Request) -> web.Response:
    co = _coordinator(request)
    await asyncio.to_thread(co.writer.flush)
    result = await asyncio.to_thread(provision_fleet, _reader(co), co.config, co.clock())
    return web.json_response(result)


def add_routes(app: web.Application, coordinator: web.AppKey) -> None:
    """Add the fleet routes to the coordinator's ``app``, whose ``Coordinator`` is
    ``app[coordinator]``."""
    app[COORDINATOR_KEY] = coordinator
    app[SIZING_LOCK] = asyncio.Lock()
    app.router.add_post("/v1/sizing", sizing_post)
    app.router.add_get("/v1/provisioning", provisioning_get)
