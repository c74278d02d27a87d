"""Open Inference Protocol (KServe v2) REST handlers, incl. the repository extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from agent import __version__
from agent.http.body import request_body
from agent.node.call import Call, Decoded, timeout_parameter
from agent.node.hostpaths import public_fields
from agent.node.repository import unlisted
from agent.node.routes import NODE, counted, model_ref, send_body
from agent.validation import ascii_int
from agent.node.tensors import (BadRequest, decode_v2_request, encode_v2_response, json_object,
                                parse_json)

if TYPE_CHECKING:
    from agent.node.node import Node

#: The headers that frame a v2 body (kept with a call for a node it may be passed on to).
FRAMING = ("Content-Type", "Inference-Header-Content-Length")


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = request.app[NODE].ready
    return web.json_response({"ready": ok}, status=200 if ok else 503)


def server_metadata_doc() -> dict:
    """The server metadata document (HTTP and gRPC)."""
    return {"name": "edgeagent", "version": __version__,
            "extensions": ["model_repository", "binary_tensor_data", "statistics",
                           "model_configuration"]}


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(server_metadata_doc())


async def model_metadata(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    servable = request.app[NODE].desk.servable(name, version)
    return web.json_response(await servable.metadata())


async def model_ready(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    why = request.app[NODE].desk.servable(name, version).unready()
    if why is not None:
        return web.json_response({"name": name, "ready": False, "error": why}, status=400)
    return web.json_response({"name": name, "ready": True})


@counted("v2")
async def infer(request: web.Request) -> web.Response:
    """Read the v2 request into a ``Call``, hand it to the front desk, encode its answer
    (an app's with its response parameters beside the request's)."""
    node = request.app[NODE]
    arrived = node.serving.clock()
    name, version = model_ref(request)
    header = request.headers.get("Inference-Header-Content-Length")
    try:
        header_length = None if header is None else ascii_int(
            header, "Inference-Header-Content-Length")
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    body = await request_body(request)
    # routing (issue 34): a model the plan runs on another node is answered there
    forwarded = await node.router.http(request, name, body)
    if forwarded is not None:
        return forwarded
    limits = node.desk.limits(name, version)
    inputs, meta = await node.decoder.run(len(body), decode_v2_request, body, header_length,
                                          limits)
    call = Call(name, version, "v2", arrived, Decoded(inputs), meta["parameters"],
                request_id=meta["id"], timeout=timeout_parameter(meta["parameters"]),
                body=body, headers={h: request.headers[h] for h in FRAMING
                                    if h in request.headers})
    answer = await node.desk.infer(call)
    if answer.parameters is not None:
        meta = {**meta, "id": answer.request_id,
                "parameters": {**meta["parameters"], **answer.parameters}}
    out, header_len = await node.decoder.run(
        sum(a.nbytes for a in answer.outputs.values()), encode_v2_response, name,
        answer.version, answer.outputs, meta)
    return await _send_answer(request, out, header_len)


async def _send_answer(request: web.Request, out: bytes, header_len: int | None
                       ) -> web.StreamResponse:
    if header_len is None:
        return await send_body(request, out, "application/json")
    return await send_body(request, out, "application/octet-stream",
                           {"Inference-Header-Content-Length": str(header_len)})


def repository_index_items(node: Node, only_ready: bool) -> list[dict]:
    """The repository index (HTTP and gRPC), after a rescan: name, version, state
    (READY, LOADING, UNLOADING, UNAVAILABLE) and the reason a model is not servable
    (``invalid: ...`` where the repository cannot serve it, versions or not)."""
    node.rescan()
    out = []
    entries = node.cache.listing()
    for entry in entries:
        state = {"ready": "READY", "loading": "LOADING", "unloading": "UNLOADING"}.get(
            entry.state.value, "UNAVAILABLE")
        if only_ready and state != "READY":
            continue
        item = {"name": entry.name, "version": str(entry.version), "state": state}
        reason = entry.life.error or entry.spec.error
        if reason:
            item["reason"] = f"invalid: {reason}" if entry.spec.error else reason
        out.append(item)
    for spec in ([] if only_ready else
                 unlisted(node.cache.specs, {e.name for e in entries}).values()):
        out.append({"name": spec.name, "version": "", "state": "UNAVAILABLE",
                    "reason": f"invalid: {spec.error}" if spec.error else spec.pending})
    for app in node.selection.apps.values():
        if only_ready and app.error:
            continue
        item = {"name": app.name, "version": "1",
                "state": "UNAVAILABLE" if app.error else "READY"}
        if app.error:
            item["reason"] = app.error
        out.append(item)
    return [public_fields(node, item) for item in out]


async def repository_index(request: web.Request) -> web.Response:
    body = await request_body(request)
    only_ready = bool(json_object(body).get("ready")) if body.strip() else False
    return web.json_response(repository_index_items(request.app[NODE], only_ready))


async def repository_load(request: web.Request) -> web.Response:
    """Load (or reload) a model; ``{"parameters": {"config": "<JSON>"}}`` overrides its
    configuration (Triton's repository extension, see ``Node.load_model``)."""
    name = request.match_info["name"]
    body = await request_body(request)
    doc = parse_json(body) if body.strip() else {}
    parameters = doc.get("parameters", {}) if isinstance(doc, dict) else None
    if not isinstance(parameters, dict):
        raise BadRequest(f"failed to load {name!r}: expected a JSON object with an optional "
                         "'parameters' object")
    await load_with_parameters(request.app[NODE], name, parameters)
    return web.json_response({})


async def load_with_parameters(node: Node, name: str, parameters: dict) -> None:
    """The repository extension's load with its ``parameters`` (HTTP and gRPC): only
    ``config`` is supported (``Node.load_model``)."""
    unknown = sorted(set(parameters) - {"config"})
    if unknown:
        raise BadRequest(f"failed to load {name!r}: unsupported load parameter(s) "
                         f"{', '.join(unknown)} (supported: config)")
    await node.load_model(name, parameters.get("config"))


async def repository_unload(request: web.Request) -> web.Response:
    await request_body(request)
    await request.app[NODE].desk.servable(request.match_info["name"]).unload()
    return web.json_response({})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2", server_metadata)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_get(prefix, model_metadata)
        r.add_get(prefix + "/ready", model_ready)
        r.add_post(prefix + "/infer", infer)
    r.add_post("/v2/repository/index", repository_index)
    r.add_post("/v2/repository/models/{name}/load", repository_load)
    r.add_post("/v2/repository/models/{name}/unload", repository_unload)
