"""TF Serving REST: ``POST /v1/models/{name}[/versions/{v}]:predict`` and model status."""

from __future__ import annotations

from aiohttp import web

from agent.http.body import request_body
from agent.node.batching import rows_of
from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import State
from agent.node.routes import NODE, counted, model_ref, send_body
from agent.node.tensors import (check_tf_size, decode_tf_checked, dumps, encode_tf_body,
                                encode_tf_response, json_object)

_TF_STATES = {State.READY: "AVAILABLE", State.LOADING: "LOADING",
              State.UNLOADING: "UNLOADING", State.UNLOADED: "END", State.FAILED: "END"}


@counted("tfserving-rest")
async def predict(request: web.Request) -> web.Response:
    node = request.app[NODE]
    arrived = node.serving.clock()
    name, version = model_ref(request)
    raw = await request_body(request)
    limits = node.serving.request_limits(name, version)
    if node.selection.is_app(name):
        return await _predict_app(request, name, version, raw, arrived)
    known = node.cache.entry(name, version).signature
    body: dict | None = None
    inputs, style = None, "row"
    if known is not None:  # reject bad input before it can cause a load
        inputs, style = await node.decoder.run(len(raw), decode_tf_checked, raw, known, limits)
    else:  # malformed JSON, or too many rows, never cause a load; the parsed document
        # is kept for after the load, so it is parsed here or on a thread, never in the
        # child (its objects would be pickled back)
        body = await node.decoder.run(min(len(raw), node.decoder.process_bytes),
                                      json_object, raw)
        check_tf_size(body, None, limits)

    def prepare(entry: Entry) -> dict:
        nonlocal inputs, style
        if inputs is None or entry.backend.inputs != known:
            inputs, style = decode_tf_checked(raw if body is None else body,
                                              entry.backend.inputs, limits)
        return inputs

    _, results = await node.serving.infer(name, version, prepare, {}, arrived=arrived,
                                          rows=rows_of(inputs) if inputs else 1)
    out = await node.decoder.run(sum(a.nbytes for a in results.values()), encode_tf_body,
                                 results, style)
    return await send_body(request, out, "application/json")


async def _predict_app(request: web.Request, name: str, version: int | None, raw: bytes,
                       arrived: float) -> web.StreamResponse:
    """A selection app's predict: its answer with ``id`` and ``parameters`` (confidence,
    members used and missing, default) beside the predictions."""
    node = request.app[NODE]
    app = node.selection.app(name, version)
    await app.ensure_valid(node.serving)
    inputs, style = await node.decoder.run(len(raw), decode_tf_checked, raw, app.inputs,
                                           node.serving.request_limits(name, version))
    results, answer = await node.selection.infer(name, version, inputs, {}, arrived=arrived,
                                                 timeout=None, rid=None)
    doc = {**encode_tf_response(results, style), "id": answer.pop("id"),
           "parameters": answer}
    return await send_body(request, dumps(doc), "application/json")


async def status(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    cache = request.app[NODE].cache
    versions = [version] if version is not None else list(cache.entry(name).spec.versions)
    out = []
    for v in versions:
        entry = cache.entry(name, v)
        error = entry.life.error or entry.spec.error
        out.append({"version": str(v), "state": _TF_STATES[entry.state],
                    "status": {"error_code": "UNKNOWN" if error else "OK",
                               "error_message": error or ""}})
    return web.json_response({"model_version_status": out})


#: OIP datatype -> TensorFlow DataType enum name (TF Serving's metadata JSON).
_TF_DTYPES = {"BOOL": "DT_BOOL", "UINT8": "DT_UINT8", "UINT16": "DT_UINT16",
              "UINT32": "DT_UINT32", "UINT64": "DT_UINT64", "INT8": "DT_INT8",
              "INT16": "DT_INT16", "INT32": "DT_INT32", "INT64": "DT_INT64",
              "FP16": "DT_HALF", "FP32": "DT_FLOAT", "FP64": "DT_DOUBLE", "BYTES": "DT_STRING"}


def _tensor_info(item: dict) -> dict:
    return {"dtype": _TF_DTYPES.get(item["datatype"], "DT_INVALID"),
            "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in item["shape"]],
                             "unknown_rank": False},
            "name": item["name"]}


async def metadata(request: web.Request) -> web.Response:
    """``GET /v1/models/{name}[/versions/{v}]/metadata``: the model's signature as TF
    Serving's GetModelMetadata answers over REST (one ``serving_default`` signature);
    a model never loaded is loaded first, as for v2 metadata."""
    name, version = model_ref(request)
    cache = request.app[NODE].cache
    entry = cache.entry(name, version)
    if entry.metadata is None:
        entry = await cache.ensure_loaded(name, version)
    signature = {"inputs": {i["name"]: _tensor_info(i) for i in entry.metadata["inputs"]},
                 "outputs": {o["name"]: _tensor_info(o) for o in entry.metadata["outputs"]},
                 "method_name": "tensorflow/serving/predict"}
    return web.json_response({
        "model_spec": {"name": name, "signature_name": "", "version": str(entry.version)},
        "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}}})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/models/{name:[^/:]+}:predict", predict)
    r.add_post("/v1/models/{name:[^/:]+}/versions/{version:[^/:]+}:predict", predict)
    r.add_get("/v1/models/{name:[^/:]+}", status)
    r.add_get("/v1/models/{name:[^/:]+}/metadata", metadata)
    r.add_get("/v1/models/{name:[^/:]+}/versions/{version:[^/:]+}/metadata", metadata)
    r.add_get("/v1/models/{name:[^/:]+}/versions/{version:[^/:]+}", status)
