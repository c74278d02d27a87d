"""Open Inference Protocol (KServe v2) REST handlers, incl. the repository extension."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from agent import __version__
from agent.http.body import request_body
from agent.node.batching import rows_of
from agent.node.call import V2_REST, Call, Decoded, Target, is_timeout, timeout_parameter
from agent.node.hostpaths import public_fields
from agent.node.repository import unlisted
from agent.node.routes import NODE, counted, model_ref, send_body, send_relayed, served_headers
from agent.node.routing.trust import http_mark
from agent.validation import ascii_int
from agent.node.tensors import (BadRequest, decode_v2_request, encode_v2_response, json_object,
                                parse_json)

if TYPE_CHECKING:
    from agent.node.node import Node

#: A v2 JSON body up to this size is read for its ``timeout`` parameter when it is
#: passed on undecoded (the client's deadline); a larger one is passed on unread (its
#: deadline is the peer's to keep).
READ_DEADLINE_BYTES = 64 * 1024


class V2Inputs(Decoded):
    """A v2 body (JSON, or JSON and the binary extension's data), decoded where the call
    is served here: on the event loop, or a large one off it (``offload.Decoder``)."""

    def __init__(self, body: bytes | bytearray, header_length: int | None,
                 decoder: Any) -> None:
        self.body, self.header_length, self.decoder = body, header_length, decoder
        self.tensors, self.rows = {}, 1
        self.meta: dict[str, Any] = {}  # the request JSON less its input data

    async def read(self, call: Call, target: Target) -> None:
        self.tensors, self.meta = await self.decoder.run(
            len(self.body), decode_v2_request, self.body, self.header_length,
            target.limits())
        self.rows = rows_of(self.tensors)
        call.parameters, call.request_id = self.meta["parameters"], self.meta["id"]
        call.timeout = timeout_parameter(call.parameters)

    def said_timeout(self) -> float | None:
        """The ``timeout`` parameter of a small body's JSON (``READ_DEADLINE_BYTES``)."""
        body, length = self.body, self.header_length
        head = body if length is None else body[:length]
        if len(head) > READ_DEADLINE_BYTES:
            return None
        try:
            raw = (orjson.loads(head).get("parameters") or {}).get("timeout")
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return None  # (the serving node answers the body's fault)
        return raw / 1e6 if is_timeout(raw) else None


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


@counted(V2_REST)
async def infer(request: web.Request) -> web.StreamResponse:
    """Read the v2 request into a ``Call``, hand it to the front desk, encode its answer
    (an app's with its response parameters beside the request's; a peer's as it came)."""
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
    inputs = V2Inputs(body, header_length, node.decoder)
    call = Call(name, version, V2_REST, arrived, inputs, body=body, headers=request.headers,
                mark=http_mark(request))
    answer = await node.desk.infer(call)
    if answer.relayed is not None:
        return await send_relayed(request, answer)
    meta = inputs.meta
    if answer.parameters is not None:
        meta = {**meta, "id": answer.request_id,
                "parameters": {**meta["parameters"], **answer.parameters}}
    out, header_len = await node.decoder.run(
        sum(a.nbytes for a in answer.outputs.values()), encode_v2_response, name,
        answer.version, answer.outputs, meta)
    headers = served_headers(node, call, answer)
    if header_len is None:
        return await send_body(request, out, "application/json", headers)
    headers["Inference-Header-Content-Length"] = str(header_len)
    return await send_body(request, out, "application/octet-stream", headers)


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
