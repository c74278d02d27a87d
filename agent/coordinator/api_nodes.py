"""The nodes' routes::

    GET    /v1/nodes[/{name}]     nodes, capacity, last report, directives
                                  (?limit=N&after=NAME: a page)
    DELETE /v1/nodes/{name}       forget a node (and revoke its credential and
                                  certificates)

Errors: 400 naming a bad query parameter, 404 for an unknown node.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import orjson
from aiohttp import web

from agent.coordinator.catalog import CatalogError
from agent.errors import json_error
from agent.validation import ascii_int, only

log = logging.getLogger("edgeagent.coordinator")

#: The most nodes one page of ``GET /v1/nodes`` holds.
MAX_NODES_PAGE = 10_000


def _nodes_page(query: Any) -> tuple[str, int | None]:
    """``GET /v1/nodes``'s ``after`` (a node name: the page starts after it) and
    ``limit`` (1..MAX_NODES_PAGE; None: every node); CatalogError (400) naming a bad one."""
    try:
        only(query, ("after", "limit"), noun="query parameter")
        limit = ascii_int(query["limit"], "limit", 6) if "limit" in query else None
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    if limit is not None and not 1 <= limit <= MAX_NODES_PAGE:
        raise CatalogError(f"limit must be 1 to {MAX_NODES_PAGE}, got {limit}")
    return query.get("after", ""), limit


def add_routes(app: web.Application, key: web.AppKey) -> None:
    """The routes above on ``app``, whose coordinator is ``app[key]``."""

    async def nodes_list(request: web.Request) -> web.Response:
        """The nodes by name, a page at a time with ``?limit=N`` (``&after=NAME`` for the
        next): ``X-Total-Count`` says how many there are, and ``Link: <...>; rel="next"``
        where more follow."""
        co = request.app[key]
        after, limit = _nodes_page(request.query)
        now = co.clock()
        rows = co.fleet.rows(after, None if limit is None else limit + 1)
        headers = {"X-Total-Count": str(len(co.fleet.nodes))}
        if limit is not None and len(rows) > limit:
            rows = rows[:limit]
            query = urlencode({"after": rows[-1].name, "limit": limit})
            headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
        return web.Response(body=orjson.dumps([co.node_summary(row, now) for row in rows]),
                            content_type="application/json", headers=headers)

    async def node_get(request: web.Request) -> web.Response:
        co = request.app[key]
        state = co.fleet.nodes.get(request.match_info["name"])
        row = state.row if state is not None else None
        if row is None:
            return json_error(404, f"unknown node {request.match_info['name']!r}")
        return web.json_response(co.node_summary(row, co.clock()))

    async def node_delete(request: web.Request) -> web.Response:
        """Forget a node and end its trust: its token is revoked (it must join again) and
        every client certificate naming it issued until now is refused, here and in every
        report worker before the answer (other coordinators on the store follow within
        ``follow_interval_s``)."""
        co = request.app[key]
        name = request.match_info["name"]
        co.writer.forget(name)
        stored = co.store.delete_node(name)
        revoked = co.store.revoke_node_credential(name)  # a deleted node must join again
        if not co.fleet.forget(name) and not stored and not revoked:
            return json_error(404, f"unknown node {name!r}")
        co.store.revoke_certificates(name, co.clock())
        await co.refresh_node_credentials()
        log.info("node %s deleted: its credential and certificates revoked", name)
        return web.json_response({"deleted": name})

    r = app.router
    r.add_get("/v1/nodes", nodes_list)
    r.add_get("/v1/nodes/{name}", node_get)
    r.add_delete("/v1/nodes/{name}", node_delete)
