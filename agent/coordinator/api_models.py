"""The catalog's routes::

    GET    /v1/models[/{name}]     the catalog with planned replicas, live nodes, the
                                   latency they measured, versions marked bad and
                                   routed traffic
    PUT    /v1/models/{name}       set a model's SLO (``catalog.parse_slo``); a new
                                   version of a model that serves one rolls out in waves
                                   (``rollouts.FleetRollouts``: ``rollout_id`` in the answer)
    DELETE /v1/models/{name}       remove it from the catalog (its rollout aborted)

Errors: 400 naming a bad field, 404 for a model not in the catalog, 409 for a version
marked bad or a model with a rollout under way.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web

from agent.coordinator.catalog import CatalogError, check_name, parse_slo
from agent.coordinator.rollouts import check_not_bad
from agent.errors import json_error
from agent.http.body import request_body
from agent.validation import load_json

log = logging.getLogger("edgeagent.coordinator")


async def json_body(request: web.Request) -> Any:
    """The request's body as JSON; ``CatalogError`` (400) when it is not."""
    raw = await request_body(request)
    try:
        return load_json(raw)
    except ValueError as exc:  # not JSON, nested too deep, an integer past the limit
        raise CatalogError(f"body is not valid JSON: {exc}") from None


def _json_answer(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _models_json(co: Any, slos: list[Any]) -> list[dict[str, Any]]:
    """Each of ``slos`` with its replicas and predicted latency under the current plan
    (its JSON form: a typed ``Plan`` of 10,000 nodes would take the loop seconds to
    build), the live nodes it is on, the worst latency they measured for it at its
    SLO's percentile (``measured_latency_ms``), its versions marked bad, and which node
    served how much of it over their last report interval (``routed``: per node
    ``served``, ``forwarded``, ``received``, ``fallbacks``, ``errors``; nodes that route
    only)."""
    since = co.clock() - co.config.node_timeout_s
    on, measured = co.fleet.by_model(since, {slo.name: slo.percentile for slo in slos})
    routed = co.fleet.routed_by_model(since)
    planned_models = (co.fleet.plan.plan.get("models") or {}) if co.fleet.plan else {}
    bad: dict[str, list[dict[str, Any]]] = {}
    for row in co.store.bad_versions(slos[0].name if len(slos) == 1 else None):
        bad.setdefault(row["model"], []).append(row)
    out = []
    for slo in slos:
        planned = planned_models.get(slo.name) or {}
        out.append({**slo.to_json(), "bad_versions": bad.get(slo.name, []),
                    "nodes": on.get(slo.name, []),
                    "replicas": planned.get("replicas"),
                    "predicted_latency_ms": planned.get("predicted_latency_ms"),
                    "measured_latency_ms": measured.get(slo.name),
                    "routed": routed.get(slo.name, {})})
    return out


def add_routes(app: web.Application, key: web.AppKey) -> None:
    """The routes above on ``app``, whose coordinator is ``app[key]``."""

    async def models_list(request: web.Request) -> web.Response:
        co = request.app[key]
        return _json_answer(_models_json(co, co.store.models()))

    async def model_get(request: web.Request) -> web.Response:
        co = request.app[key]
        name = check_name(request.match_info["name"])
        slo = co.store.model(name)
        if slo is None:
            return json_error(404, f"model {name!r} is not in the catalog")
        return _json_answer(_models_json(co, [slo])[0])

    async def model_put(request: web.Request) -> web.Response:
        """Add or update an entry; a new version of a model that serves one rolls out in
        waves (``rollout_id`` in the answer), a version marked bad is refused (409)."""
        co = request.app[key]
        slo = parse_slo(request.match_info["name"], await json_body(request))
        check_not_bad(co.store, slo.name, slo.version)
        before = co.store.model(slo.name)
        if co.rollouts.catalog_change(before, slo):
            rollout = await co.rollouts.start(slo.name, (slo.version, slo.digest), entry=slo)
            log.info("catalog: updated %s: rollout %d", slo, rollout.id)
            return web.json_response({**slo.to_json(), "rollout_id": rollout.id})
        created = co.store.put_model(slo, co.clock())
        log.info("catalog: %s %s", "added" if created else "updated", slo)
        await co.rollouts.refresh()
        return web.json_response(slo.to_json(), status=201 if created else 200)

    async def model_delete(request: web.Request) -> web.Response:
        co = request.app[key]
        name = check_name(request.match_info["name"])
        slo = co.store.model(name)
        if slo is None or not co.store.delete_model(name):
            return json_error(404, f"model {name!r} is not in the catalog")
        log.info("catalog: deleted %s", name)
        for rollout in co.store.rollouts(active=True, model=name):
            await co.rollouts.move(rollout.id, "abort")
        await co.rollouts.refresh()
        if slo.source is not None and co.leader and co.start_loops:
            # plan now: the plan's directives stop its pulls and drop the nodes' copies
            co.spawn(co.replan_quietly(f"catalog delete of {name}"))
        return web.json_response({"deleted": name})

    r = app.router
    r.add_get("/v1/models", models_list)
    r.add_get("/v1/models/{name}", model_get)
    r.add_put("/v1/models/{name}", model_put)
    r.add_delete("/v1/models/{name}", model_delete)
