"""The rollouts' routes (``rollouts.FleetRollouts`` does the work)::

    POST   /v1/rollouts                     {"model": "m", "version": 2, "digest": null,
                                             "waves": [1, "50%"], "bake_s": 60,
                                             "wave_timeout_s": 300, "traffic_share": 0.1,
                                             "gates": {...}}
                                             -> 201, the rollout (its first wave started)
    GET    /v1/rollouts                     newest first (?model=NAME, ?active=1,
                                             ?limit=N, at most 1000)
    GET    /v1/rollouts/{id}                one
    POST   /v1/rollouts/{id}/pause|resume|abort
    DELETE /v1/models/{name}/bad-versions/{version}   an operator clears a bad version

Errors: 400 naming a bad field, 404 for an unknown model or rollout, 409 for a model
with a rollout under way, a version marked bad, or a move the rollout's state refuses.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from agent.coordinator.api_models import json_body
from agent.coordinator.catalog import CatalogError, check_name
from agent.coordinator.rollouts import RolloutNotFound
from agent.errors import json_error
from agent.validation import ascii_int, only

_START_FIELDS = ("model", "version", "digest", "waves", "bake_s", "settle_s",
                 "wave_timeout_s", "traffic_share", "gates")
MAX_LISTED = 1000


def _rollout_id(request: web.Request) -> int:
    try:
        return ascii_int(request.match_info["id"], "rollout id", 18)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None


def _shown(rollout: Any, *, baseline: bool = False) -> dict[str, Any]:
    """A rollout's JSON; the per-node baselines only when asked for one rollout."""
    doc = rollout.to_json()
    if not baseline:
        doc.pop("baseline", None)
    return doc


def add_routes(app: web.Application, key: web.AppKey) -> None:
    """The routes above on ``app``, whose coordinator is ``app[key]``."""

    async def start(request: web.Request) -> web.Response:
        co = request.app[key]
        body = await json_body(request)
        if not isinstance(body, dict):
            raise CatalogError('body must be a JSON object such as {"model": "m", '
                               '"version": 2}')
        try:
            only(body, _START_FIELDS, noun="field")
        except ValueError as exc:
            raise CatalogError(str(exc)) from None
        model = check_name(body.get("model"))
        version, digest = body.get("version"), body.get("digest")
        if type(version) is not int or not 1 <= version <= 999_999_999:
            raise CatalogError(f"field 'version' must be a whole number >= 1 (the version "
                               f"to roll out), got {version!r}")
        if digest is not None:
            from agent.config import version_digest

            try:
                digest = version_digest(digest)
            except ValueError as exc:
                raise CatalogError(f"field 'digest' {exc}") from None
        given = {k: v for k, v in body.items() if k not in ("model", "version", "digest")}
        rollout = await co.rollouts.start(model, (version, digest), given)
        return web.json_response(_shown(rollout), status=201)

    async def listed(request: web.Request) -> web.Response:
        co = request.app[key]
        query = request.query
        try:
            only(query, ("model", "active", "limit"), noun="query parameter")
            limit = ascii_int(query["limit"], "limit", 4) if "limit" in query else 100
        except ValueError as exc:
            raise CatalogError(str(exc)) from None
        if not 1 <= limit <= MAX_LISTED:
            raise CatalogError(f"limit must be 1 to {MAX_LISTED}, got {limit}")
        model = check_name(query["model"]) if "model" in query else None
        active = query.get("active", "0") not in ("0", "false", "")
        rollouts = co.store.rollouts(active=active, model=model, limit=limit)
        return web.Response(body=orjson.dumps([_shown(r) for r in rollouts]),
                            content_type="application/json")

    async def one(request: web.Request) -> web.Response:
        co = request.app[key]
        rollout = co.store.rollout(_rollout_id(request))
        if rollout is None:
            raise RolloutNotFound(f"no rollout {request.match_info['id']}")
        return web.Response(body=orjson.dumps(_shown(rollout, baseline=True)),
                            content_type="application/json")

    def mover(move: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            co = request.app[key]
            rollout = await co.rollouts.move(_rollout_id(request), move)
            return web.json_response(_shown(rollout))
        return handler

    async def clear_bad(request: web.Request) -> web.Response:
        co = request.app[key]
        model = check_name(request.match_info["name"])
        try:
            version = ascii_int(request.match_info["version"], "version", 9)
        except ValueError as exc:
            raise CatalogError(str(exc)) from None
        if not co.store.clear_bad_version(model, version):
            return json_error(404, f"version {version} of {model!r} is not marked bad")
        await co.rollouts.refresh(force=True)
        return web.json_response({"cleared": {"model": model, "version": version}})

    r = app.router
    r.add_post("/v1/rollouts", start)
    r.add_get("/v1/rollouts", listed)
    r.add_get("/v1/rollouts/{id}", one)
    for move in ("pause", "resume", "abort"):
        r.add_post(f"/v1/rollouts/{{id}}/{move}", mover(move))
    r.add_delete("/v1/models/{name}/bad-versions/{version}", clear_bad)


