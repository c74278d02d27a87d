"""Triton's extensions of the v2 REST API that its tools (perf_analyzer, model
analyzer, the example clients) need: the model configuration
(``GET /v2/models/{name}[/versions/{v}]/config``, see ``agent.node.triton_config``)
and statistics (``GET /v2/models[/{name}[/versions/{v}]]/stats``, see
``agent.node.stats``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent.backends.base import TensorSpec
from agent.node.batching import has_batch_dimension
from agent.node.routes import NODE, model_ref
from agent.node.triton_config import effective_config

if TYPE_CHECKING:
    from agent.node.node import Node


def _specs(items: list[dict], declared: tuple | None) -> list[TensorSpec]:
    """The model's tensors, with the shapes a Triton config declared where it did."""
    said = {d.name: d for d in declared or ()}
    return [TensorSpec(i["name"], i["datatype"],
                       tuple(said[i["name"]].shape) if i["name"] in said else tuple(i["shape"]))
            for i in items]


async def model_config_doc(node: Node, name: str, version: int | None) -> dict[str, Any]:
    """The model's effective configuration in Triton's JSON fields (HTTP and gRPC); a
    model never loaded is loaded first (its signature comes from the model), as for
    metadata."""
    entry = node.cache.entry(name, version)
    if entry.metadata is None:
        entry = await node.cache.ensure_loaded(name, version)
    config = entry.spec.config
    inputs = _specs(entry.metadata["inputs"], config.declared_inputs)
    outputs = _specs(entry.metadata["outputs"], config.declared_outputs)
    runtime = node.serving.runtime(entry)
    batcher = runtime.batcher
    return effective_config(
        name, entry.spec.backend, config, runtime.settings, inputs, outputs,
        workers=batcher.workers if batcher is not None else runtime.workers,
        batchable=has_batch_dimension(inputs, outputs))


async def model_config(request: web.Request) -> web.Response:
    name, version = model_ref(request)
    return web.json_response(await model_config_doc(request.app[NODE], name, version))


def model_stats_doc(node: Node, name: str | None, version: int | None) -> dict[str, Any]:
    """``{"model_stats": [...]}`` (HTTP and gRPC) of one version, of a model's versions
    (those served so far and the default), or of every model (``name`` None)."""
    if name is None:
        entries = node.cache.listing()
    else:
        first = node.cache.entry(name, version)  # 404 for an unknown model or version
        entries = [first] if version is not None else [
            e for e in node.cache.listing() if e.name == name] or [first]
    return {"model_stats": [node.serving.statistics(e) for e in entries]}


async def model_stats(request: web.Request) -> web.Response:
    node = request.app[NODE]
    name, version = model_ref(request) if "name" in request.match_info else (None, None)
    return web.json_response(model_stats_doc(node, name, version))


def add_routes(app: web.Application) -> None:
    """Register before ``api_v2``'s: ``/v2/models/stats`` must win over
    ``/v2/models/{name}``."""
    r = app.router
    r.add_get("/v2/models/stats", model_stats)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_get(prefix + "/config", model_config)
        r.add_get(prefix + "/stats", model_stats)
