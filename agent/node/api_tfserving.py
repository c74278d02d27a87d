"""TF Serving REST: ``POST /v1/models/{name}[/versions/{v}]:predict`` and model status."""

from __future__ import annotations

from typing import Any

import numpy as np
from aiohttp import web

from agent.backends.base import TensorSpec
from agent.http.body import request_body
from agent.node.batching import rows_of
from agent.node.cache.lifecycle import State
from agent.node.call import TF_REST, Call, Target
from agent.node.hostpaths import public_message
from agent.node.routes import NODE, counted, model_ref, send_body, send_relayed, served_headers
from agent.node.routing.trust import http_mark
from agent.node.tensors import (NO_LIMITS, check_tf_size, decode_tf_checked, dumps,
                                encode_tf_body, encode_tf_response, json_object)

_TF_STATES = {State.READY: "AVAILABLE", State.LOADING: "LOADING",
              State.UNLOADING: "UNLOADING", State.UNLOADED: "END", State.FAILED: "END"}


class TfInputs:
    """A predict body's inputs, decoded with the signature of what serves it: at once
    where that is known (a bad body never causes a load), else parsed (malformed JSON,
    or too many rows, never cause a load either) and decoded once the model is loaded."""

    def __init__(self, raw: bytes | bytearray, decoder: Any) -> None:
        self.raw, self.decoder = raw, decoder
        self.limits = NO_LIMITS
        self.parsed: dict | None = None
        self.known: list[TensorSpec] | None = None
        self.decoded: dict[str, np.ndarray] | None = None
        self.style, self.rows = "row", 1

    async def read(self, call: Call, target: Target) -> None:
        """Decode against the signature ``target`` knows, off the event loop, or parse
        where it knows none (on a thread, never in the decoding child: its objects
        would be pickled back)."""
        decoder, self.limits = self.decoder, target.limits()
        known = await target.signature()
        if known is not None:
            self.decoded, self.style = await decoder.run(
                len(self.raw), decode_tf_checked, self.raw, known, self.limits)
            self.known, self.rows = known, rows_of(self.decoded)
        else:
            self.parsed = await decoder.run(min(len(self.raw), decoder.process_bytes),
                                            json_object, self.raw)
            check_tf_size(self.parsed, None, self.limits)

    def said_timeout(self) -> float | None:
        """TF Serving's predict has no timeout."""
        return None

    def against(self, signature: list[TensorSpec]) -> dict[str, np.ndarray]:
        if self.decoded is None or signature != self.known:
            self.decoded, self.style = decode_tf_checked(
                self.raw if self.parsed is None else self.parsed, signature, self.limits)
            self.known = signature
        return self.decoded


@counted(TF_REST)
async def predict(request: web.Request) -> web.StreamResponse:
    """A predict: its predictions, and for a selection app ``id`` and ``parameters``
    (confidence, members used and missing, default) beside them; a peer's answer as it
    came."""
    node = request.app[NODE]
    arrived = node.serving.clock()
    name, version = model_ref(request)
    raw = await request_body(request)
    inputs = TfInputs(raw, node.decoder)
    call = Call(name, version, TF_REST, arrived, inputs, body=raw, headers=request.headers,
                mark=http_mark(request))
    answer = await node.desk.infer(call)
    if answer.relayed is not None:
        return await send_relayed(request, answer)
    if answer.parameters is None:
        out = await node.decoder.run(sum(a.nbytes for a in answer.outputs.values()),
                                     encode_tf_body, answer.outputs, inputs.style)
    else:
        out = dumps({**encode_tf_response(answer.outputs, inputs.style),
                     "id": answer.request_id, "parameters": answer.parameters}, newline=True)
    return await send_body(request, out, "application/json", served_headers(node, call, answer))


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
                               "error_message": public_message(request.app[NODE],
                                                               error or "")}})
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
