"""How a node obtains its own credential (Kubernetes' bootstrap tokens, in short).

    POST /v1/join-tokens   (admin) ``{"node": "edge-7", "ttl_s": 3600}`` -> a one-time
                           join token for that node, valid ``ttl_s`` (at most a week)
    POST /v1/join          with ``Authorization: Bearer <join token>`` and optionally
                           ``{"node": "edge-7"}`` (refused 403 when it is not the
                           token's node) -> ``{"node", "token"}``: the node's own report
                           token, answered once; a former one stops working

The store keeps only hashes (``Store.add_join_token``, ``set_node_credential``), so
every coordinator on one database accepts the node at once (``Coordinator`` polls).
A failed join is counted and throttled like any failed authentication; while its peer
is throttled a join token is not even tried (nor used up).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from agent.coordinator.catalog import CatalogError
from agent.security.credentials import bearer, new_token, token_hash
from agent.security.httpauth import Need, Verdict, request_peer, respond
from agent.http.body import request_body
from agent.validation import load_json, number, only
from agent.wire import NAME

log = logging.getLogger("edgeagent.coordinator")

#: The longest a join token may live.
MAX_JOIN_TTL_S = 7 * 86400.0
_JOIN = Need("join")
#: Where ``add_routes`` finds the app's key of its ``Coordinator`` (as api_fleet).
COORDINATOR_KEY: web.AppKey[web.AppKey] = web.AppKey("join_coordinator_key", web.AppKey)


def _coordinator(request: web.Request) -> Any:
    return request.app[request.app[COORDINATOR_KEY]]


async def _body(request: web.Request, allowed: tuple[str, ...]) -> dict:
    raw = await request_body(request)
    try:
        body = load_json(raw) if raw.strip() else {}
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        only(body, allowed)
    except ValueError as exc:
        raise CatalogError(f"bad body: {exc}") from None
    return body


def _node_name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise CatalogError(f"node must be 1-128 letters, digits, '_', '.' or '-', "
                           f"got {value!r}")
    return value


async def join_tokens_post(request: web.Request) -> web.Response:
    co = _coordinator(request)
    body = await _body(request, ("node", "ttl_s"))
    node = _node_name(body.get("node"))
    try:
        ttl = number(1, MAX_JOIN_TTL_S)(body.get("ttl_s", 3600.0))
    except ValueError as exc:
        raise CatalogError(f"ttl_s {exc}") from None
    token, not_after = new_token(), co.clock() + ttl
    co.store.add_join_token(token_hash(token), node, not_after)
    log.info("join token made for node %s, valid %g s", node, ttl)
    return web.json_response({"node": node, "token": token, "not_after": not_after},
                             status=201)


async def join_post(request: web.Request) -> web.Response:
    co = _coordinator(request)
    body = await _body(request, ("node",))
    asked = _node_name(body["node"]) if "node" in body else None
    token = bearer(request.headers.get("Authorization", ""))
    peer = request_peer(request, co.workers.forward_key).address
    throttled = co.guard.throttled(peer, _JOIN)  # a throttled peer's token is not tried
    if throttled is not None:
        return respond(throttled)
    node = co.store.redeem_join_token(token_hash(token), co.clock()) if token else None
    if node is None:
        return respond(co.guard.refused(Verdict(
            401, "POST /v1/join needs 'Authorization: Bearer <join token>' with a join "
                 "token not yet used nor expired (edgeagent token join)"), peer, _JOIN))
    if asked is not None and asked != node:
        return respond(co.guard.refused(Verdict(
            403, f"this join token is node {node!r}'s, not {asked!r}'s (now used up)"),
            peer, _JOIN))
    credential = new_token()
    co.store.set_node_credential(node, token_hash(credential), co.clock())
    await co.refresh_node_credentials()
    log.info("node %s joined from %s", node, peer)
    return web.json_response({"node": node, "token": credential})


def add_routes(app: web.Application, coordinator: web.AppKey) -> None:
    app[COORDINATOR_KEY] = coordinator
    app.router.add_post("/v1/join-tokens", join_tokens_post)
    app.router.add_post("/v1/join", join_post)
