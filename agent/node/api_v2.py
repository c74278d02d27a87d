"""Open Inference Protocol (KServe v2) REST handlers, incl. the repository extension."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from agent import __version__
from agent.backends.base import InvalidInput, check_inputs
from agent.http.body import request_body
from agent.node.batching import rows_of
from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import State
from agent.node.routes import NODE, counted, model_ref, send_body
from agent.node.serving import timeout_parameter
from agent.validation import ascii_int
from agent.node.tensors import (BadRequest, decode_v2_request, encode_v2_response, json_object,
                                parse_json)

if TYPE_CHECKING:
    from agent.node.node import Node

_PLATFORMS = {"onnx": "onnxruntime_onnx", "tfserving": "tensorflow_savedmodel",
              "synthetic": "synthetic"}


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


async def model_metadata_doc(node: Node, name: str, version: int | None) -> dict:
    """A model's metadata document (HTTP and gRPC): name, versions, platform, inputs,
    outputs. The signature is read from the loaded model: a cold model loads, as for
    infer."""
    if node.selection.is_app(name):
        app = node.selection.app(name, version)
        await app.ensure_valid(node.serving)
        return {"name": name, "versions": ["1"], "platform": "selection",
                "inputs": [s.as_json() for s in app.inputs],
                "outputs": [app.output.as_json()] if app.output else []}
    cache = node.cache
    entry = cache.entry(name, version)
    if entry.metadata is None:
        entry = await cache.ensure_loaded(name, version)
    return {"name": name, "versions": [str(v) for v in entry.spec.versions],
            "platform": _PLATFORMS.get(entry.spec.backend or "", "unknown"), **entry.metadata}


async def model_metadata(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    return web.json_response(await model_metadata_doc(request.app[NODE], name, version))


async def model_ready(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    node = request.app[NODE]
    if node.selection.is_app(name):
        app = node.selection.app(name, version)
        if app.error:
            return web.json_response({"name": name, "ready": False, "error": app.error},
                                     status=400)
        return web.json_response({"name": name, "ready": True})
    entry = node.cache.entry(name, version)
    if entry.state is not State.READY:
        return web.json_response({"name": name, "ready": False,
                                  "error": f"model {entry.key} is {entry.state.value}"},
                                 status=400)
    return web.json_response({"name": name, "ready": True})


@counted("v2")
async def infer(request: web.Request) -> web.Response:
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
    limits = node.serving.request_limits(name, version)
    inputs, meta = await node.decoder.run(len(body), decode_v2_request, body, header_length,
                                          limits)
    if node.selection.is_app(name):
        results, answer = await node.selection.infer(
            name, version, inputs, meta["parameters"], arrived=arrived,
            timeout=timeout_parameter(meta["parameters"]), rid=meta["id"])
        rid = answer.pop("id")
        meta = {**meta, "id": rid, "parameters": {**meta["parameters"], **answer}}
        out, header_len = await node.decoder.run(
            sum(a.nbytes for a in results.values()), encode_v2_response, name, 1, results,
            meta)
        return await _send_answer(request, out, header_len)
    known = node.cache.entry(name, version).signature
    if known is not None:  # reject bad input before it can cause a load
        try:
            check_inputs(known, inputs)
        except InvalidInput:
            node.serving.count_failure(name, version, arrived)
            raise
    timeout = timeout_parameter(meta["parameters"])

    def prepare(entry: Entry) -> dict:
        check_inputs(entry.backend.inputs, inputs)
        return inputs

    entry, results = await node.serving.infer(name, version, prepare, meta["parameters"],
                                              arrived=arrived, timeout=timeout,
                                              rows=rows_of(inputs))
    out, header_len = await node.decoder.run(sum(a.nbytes for a in results.values()),
                                             encode_v2_response, name, entry.version,
                                             results, meta)
    return await _send_answer(request, out, header_len)


async def _send_answer(request: web.Request, out: bytes, header_len: int | None
                       ) -> web.StreamResponse:
    if header_len is None:
        return await send_body(request, out, "application/json")
    return await send_body(request, out, "application/octet-stream",
                           {"Inference-Header-Content-Length": str(header_len)})


def repository_index_items(node: Node, only_ready: bool) -> list[dict]:
    """The repository index (HTTP and gRPC), after a rescan: name, version, state
    (READY, LOADING, UNLOADING, UNAVAILABLE) and the reason a model is not servable."""
    node.rescan()
    out = []
    for entry in node.cache.listing():
        state = {"ready": "READY", "loading": "LOADING", "unloading": "UNLOADING"}.get(
            entry.state.value, "UNAVAILABLE")
        if only_ready and state != "READY":
            continue
        item = {"name": entry.name, "version": str(entry.version), "state": state}
        reason = entry.life.error or entry.spec.error
        if reason:
            item["reason"] = reason
        out.append(item)
    for app in node.selection.apps.values():
        if only_ready and app.error:
            continue
        item = {"name": app.name, "version": "1",
                "state": "UNAVAILABLE" if app.error else "READY"}
        if app.error:
            item["reason"] = app.error
        out.append(item)
    return out


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
    node = request.app[NODE]
    if not node.selection.is_app(request.match_info["name"]):  # an app holds no memory
        await node.cache.evict(request.match_info["name"])
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
