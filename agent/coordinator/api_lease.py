"""``POST /v1/nodes/{name}/lease``: a node renews its lease between full reports
(``agent.wire``, "Leases"; ``agent.coordinator.leases``). Checked as a report is (the
node's own credential, or admin; the lane past the middleware chain), refused early
alike while the coordinator is overloaded or its store fails, and answered from
memory: the node stays live, its directives stand or change, and ``last_seen`` is
written with the next group commit."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agent.coordinator.ingest import parse_lease_body, refuse_while_store_fails
from agent.coordinator.leases import SEND_REPORT
from agent.http.body import request_body

LEASE_PATH = "/v1/nodes/{name}/lease"
#: Where ``add_routes`` finds the app's key of its ``Coordinator`` (as api_fleet).
COORDINATOR_KEY: web.AppKey[web.AppKey] = web.AppKey("lease_coordinator_key", web.AppKey)


async def node_lease(request: web.Request) -> web.Response:
    co: Any = request.app[request.app[COORDINATOR_KEY]]
    co.shedder.check(co.writer.queued())  # before any work: 503 + Retry-After
    body = renew_lease(co, request.match_info["name"], bytes(await request_body(request)))
    return web.Response(body=body, content_type="application/json")


def renew_lease(co: Any, name: str, raw: bytes) -> bytes:
    """The answer to ``name``'s lease ``raw``, the lease renewed where it stands."""
    lease = parse_lease_body(name, raw)
    refuse_while_store_fails(co.writer.healthy)
    body, _ = co.fleet.answer_lease(name, lease)
    if body is not SEND_REPORT:
        now = co.clock()
        co.fleet.renew(name, now)
        co.writer.renew(name, now)
        co.leases += 1
    return body


def take_renewed(co: Any, batch: list[tuple[str, float, bytes | None]]) -> None:
    """Leases a report worker renewed (node, when, the directives' JSON where they
    changed): recorded and written as if renewed here."""
    fleet, writer = co.fleet, co.writer
    for node, now, body in batch:
        if fleet.renew(node, now):
            writer.renew(node, now)
            if body is not None:
                fleet.answered(node, body)


def add_routes(app: web.Application, coordinator: web.AppKey) -> None:
    app[COORDINATOR_KEY] = coordinator
    app.router.add_post(LEASE_PATH, node_lease)
