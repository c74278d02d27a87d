"""Cache admin (``/v1/cache``), ``/v1/memory``, ``/v1/disk``, the twin's record
(``/v1/trace``, ``/v1/profiles``) and curve (``/v1/whatif``), and ``/metrics``."""

from __future__ import annotations

import math

from aiohttp import web

from agent.http.body import request_body
from agent.node.cache import UnknownModel
from agent.node.hostpaths import public_fields
from agent.node.record import profiles_csv
from agent.node.repository import unlisted
from agent.node.routes import NODE
from agent.validation import ascii_int
from agent.node.tensors import BadRequest, parse_json
from agent.units import iso_time


def _version(request: web.Request) -> int | None:
    raw = request.query.get("version")
    if raw is None:
        return None
    try:
        return ascii_int(raw, "version")
    except ValueError as exc:
        raise UnknownModel(str(exc)) from None


def _describe(node, entry) -> dict:
    """The cache's view of a model and its batching/SLO figures; state ``invalid`` (and
    ``error`` why) for one the repository cannot serve (its config.yaml, its files)."""
    described = {**node.cache.describe(entry), **node.serving.describe(entry),
                 "routing": node.router.describe_model(entry.name)}
    described["last_used"] = iso_time(described["last_used"])
    if entry.spec.error and described["state"] in ("unloaded", "failed"):
        described["state"] = "invalid"
    return public_fields(node, described)


def _unlisted(spec) -> dict:
    """A model with no version to show (``agent.node.repository.unlisted``): state
    ``invalid`` (its config) or ``pending`` (its source not listed yet), and why; what
    is not known is null."""
    return {"name": spec.name, "version": None, "backend": spec.backend,
            "device": spec.config.device, "state": "invalid" if spec.error else "pending",
            "error": spec.error or spec.pending, "size_bytes": None,
            "size_estimated": False, "load_seconds": None, "loads": 0, "hits": 0,
            "misses": 0, "evictions": 0, "request_rate": None, "utility": None,
            "pinned": spec.config.pin, "in_flight": 0}


async def cache_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    entries = node.cache.listing()
    return web.json_response([_describe(node, e) for e in entries] + [
        public_fields(node, _unlisted(spec))
        for spec in unlisted(node.cache.specs, {e.name for e in entries}).values()])


async def cache_get(request: web.Request) -> web.Response:
    node = request.app[NODE]
    entry = node.cache.entry(request.match_info["name"], _version(request))
    return web.json_response({**_describe(node, entry),
                              "versions": list(entry.spec.versions),
                              "memory": node.cache.memory().get(entry.device)})


async def cache_workers(request: web.Request) -> web.Response:
    """``POST /v1/cache/{name}/workers {"workers": N}``: run its batches on N workers."""
    node = request.app[NODE]
    entry = node.cache.entry(request.match_info["name"], _version(request))
    body = parse_json(await request_body(request) or b"{}")
    workers = body.get("workers") if isinstance(body, dict) else None
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise BadRequest(f"expected a JSON object {{\"workers\": N}} with 1 <= N <= 256, "
                         f"got {body!r}")
    node.serving.set_workers(entry, workers)
    return web.json_response(_describe(node, entry))


async def cache_action(request: web.Request) -> web.Response:
    node = request.app[NODE]
    name, action = request.match_info["name"], request.match_info["action"]
    version = _version(request)
    if action == "evict":
        entry = await node.cache.evict(name, version)
    else:
        entry = node.cache.set_pinned(name, action == "pin", version)
        node.schedule_persist()
    return web.json_response(_describe(node, entry))


async def memory(request: web.Request) -> web.Response:
    """``GET /v1/memory``: per device, the budget and what holds it (read-only, public
    like ``/metrics``; the dashboard's bars); under ``cpu``, ``request_bodies``: the
    bytes of request bodies in flight and their bound."""
    node = request.app[NODE]
    memory = node.cache.memory()
    memory.setdefault("cpu", {})["request_bodies"] = node.body_memory.describe()
    return web.json_response(memory)


def _since(request: web.Request, now: float) -> float:
    """The ``since`` query parameter (Unix seconds, default: everything kept); 400 for
    one that is no number or lies in the future."""
    raw = request.query.get("since")
    if raw is None:
        return 0.0
    try:
        since = float(raw)
    except ValueError:
        since = float("nan")
    if not math.isfinite(since):
        raise BadRequest(f"since must be Unix seconds (a number), got {raw!r}")
    if since > now:
        raise BadRequest(f"since={raw} is in the future: the agent's clock reads {now:.3f}")
    return since


async def trace(request: web.Request) -> web.Response:
    """``GET /v1/trace?since=UNIX``: the requests recorded since then, as the
    simulator's trace CSV (``agent.node.record``); admin."""
    record = request.app[NODE].serving.record
    requests = record.since(_since(request, record.wall_clock()))
    return web.Response(text=requests.to_csv(), content_type="text/csv")


async def profiles(request: web.Request) -> web.Response:
    """``GET /v1/profiles``: each model's measured profile as the simulator's profiles
    CSV; admin."""
    return web.Response(text=profiles_csv(request.app[NODE].serving.profiles()),
                        content_type="text/csv")


async def whatif(request: web.Request) -> web.Response:
    """``GET /v1/whatif``: the last hour through the twin at a few multiples of the cpu
    budget (``agent.node.whatif``; the dashboard's curve); read scope."""
    return web.json_response(await request.app[NODE].whatif.curve())


async def disk(request: web.Request) -> web.Response:
    """``GET /v1/disk``: the disk tier (read-only): its budget and figures, the model
    versions on disk, the pulls under way with their progress, and each sourced
    model's listing (its versions, or why its source could not be listed)."""
    node = request.app[NODE]
    tier = node.disk
    return web.json_response({**tier.summary(), "holdings": tier.holdings(),
                              "pulling": [{**p, "started": iso_time(p["started"])}
                                          for p in tier.pulling()],
                              "sources": [public_fields(node, {**s, "listed_at": iso_time(
                                  s["listed_at"])}) for s in tier.listings.describe()],
                              "pull_errors": [public_fields(node, e)
                                              for e in tier.pull_errors()]})


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    node = request.app[NODE]
    auth = "\n".join(node.guard.metrics_lines("edgeagent")).encode() + b"\n"
    return web.Response(body=node.metrics.render() + auth,
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v1/cache", cache_list)
    r.add_get("/v1/cache/{name}", cache_get)
    r.add_post("/v1/cache/{name}/{action:pin|unpin|evict}", cache_action)
    r.add_post("/v1/cache/{name}/workers", cache_workers)
    r.add_get("/v1/memory", memory)
    r.add_get("/v1/trace", trace)
    r.add_get("/v1/profiles", profiles)
    r.add_get("/v1/whatif", whatif)
    r.add_get("/v1/disk", disk)
    r.add_get("/metrics", metrics)
