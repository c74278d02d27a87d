"""The front desk: where every inference request comes in.

Each front end (v2 REST ``api_v2``, v2 gRPC ``grpc_v2``, TF Serving REST
``api_tfserving``) reads its protocol into one ``Call`` (``agent.node.call``) and hands
it to ``FrontDesk.infer(call)``, the one entry point that serves it: it asks
``servable``, the one place that decides what serves a name (a model of the repository,
through the cache and batching: ``ModelServable``; a selection app: ``AppServable``),
and awaits its ``infer``.

A peer node that runs the model under the plan is the next servable, and ``servable`` is
where it is chosen: anything with an async ``infer(call) -> Answer`` fits. A ``Call``
keeps what a forwarder passes on: the body as received (undecoded, where the front end
has one: the v2 JSON or binary body, the TF predict body, the gRPC message) with the
headers that frame it, the client's deadline (``timeout``), request id, parameters, the
protocol it came in by and the caller (``identity``); an ``Answer`` names the node that
served it (``served_by``), for the front end to say so.

A model's statistics (Triton's extension and the twin's request record) are counted
where it is served (``Serving.infer``), every request alike: one whose input does not
fit the model's known signature is refused before it can cause a load and counted as a
failure, whatever protocol brought it. The endpoint counter of ``/metrics`` is
``FrontDesk.count``, which the HTTP and gRPC wrappers call once per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from agent.backends.base import TensorSpec
from agent.node.cache import State
from agent.node.call import Answer, Call
from agent.node.tensors import Limits

if TYPE_CHECKING:
    from agent.node.metrics import Metrics
    from agent.node.routing import Router
    from agent.node.selection.app import SelectionApp
    from agent.node.selection.apps import SelectionApps
    from agent.node.serving import Serving

#: The platform a model's metadata names, by backend.
PLATFORMS = {"onnx": "onnxruntime_onnx", "tfserving": "tensorflow_savedmodel",
             "synthetic": "synthetic"}


class Servable(Protocol):
    """What serves a name: a cached model, a selection app (next, a peer node)."""

    async def infer(self, call: Call) -> Answer: ...

    async def metadata(self) -> dict[str, Any]:
        """The v2 metadata document (name, versions, platform, inputs, outputs)."""

    def unready(self) -> str | None:
        """Why it cannot serve now (None: it can)."""

    async def signature(self) -> list[TensorSpec] | None:
        """Its inputs where known without a load (None: not yet)."""

    async def unload(self) -> None:
        """Free what it holds (the repository extension's unload)."""


class ModelServable:
    """A model of the repository, served through the cache and batching."""

    def __init__(self, serving: Serving, name: str, version: int | None) -> None:
        self.serving, self.name, self.version = serving, name, version
        self.entry = serving.cache.entry(name, version)  # UnknownModel (404)

    async def infer(self, call: Call) -> Answer:
        entry, outputs = await self.serving.infer(call)
        return Answer(outputs, self.name, entry.version, call.request_id)

    async def metadata(self) -> dict[str, Any]:
        """The signature is read from the loaded model: a cold model loads."""
        entry = self.entry
        if entry.metadata is None:
            entry = await self.serving.cache.ensure_loaded(self.name, self.version)
        return {"name": self.name, "versions": [str(v) for v in entry.spec.versions],
                "platform": PLATFORMS.get(entry.spec.backend or "", "unknown"),
                **entry.metadata}

    def unready(self) -> str | None:
        state = self.entry.state
        return None if state is State.READY else f"model {self.entry.key} is {state.value}"

    async def signature(self) -> list[TensorSpec] | None:
        return self.entry.signature

    async def unload(self) -> None:
        await self.serving.cache.evict(self.name, self.version)


class AppServable:
    """A selection app: its members called through ``Serving`` as clients would (or on
    the node the plan runs them on: ``router``)."""

    def __init__(self, serving: Serving, app: SelectionApp, router: Router) -> None:
        self.serving, self.app, self.router = serving, app, router

    async def infer(self, call: Call) -> Answer:
        return await self.app.infer(self.serving, call, self.router)

    async def metadata(self) -> dict[str, Any]:
        app = self.app
        await app.ensure_valid(self.serving, self.router)
        return {"name": app.name, "versions": ["1"], "platform": "selection",
                "inputs": [s.as_json() for s in app.inputs],
                "outputs": [app.output.as_json()] if app.output else []}

    def unready(self) -> str | None:
        return self.app.error

    async def signature(self) -> list[TensorSpec] | None:
        await self.app.ensure_valid(self.serving, self.router)
        return self.app.inputs

    async def unload(self) -> None:
        """An app holds no memory of its own."""


class FrontDesk:
    """Finds what serves a call and hands it over; counts every inference request."""

    def __init__(self, serving: Serving, apps: SelectionApps, metrics: Metrics,
                 router: Router) -> None:
        self.serving, self.apps, self.metrics, self.router = serving, apps, metrics, router

    def servable(self, name: str, version: int | None = None) -> Servable:
        """What serves ``name``: its selection app, else its model; ``UnknownModel``
        (404) for neither, or for a version it lacks."""
        return self.app(name, version) or ModelServable(self.serving, name, version)

    def app(self, name: str, version: int | None = None) -> AppServable | None:
        """``name``'s selection app (None: ``name`` is no app): the one place that tells
        an app from a model."""
        if name not in self.apps.apps:
            return None
        return AppServable(self.serving, self.apps.app(name, version), self.router)

    def limits(self, name: str, version: int | None) -> Limits:
        """What one request for ``name`` may decode to (a name it does not know gets
        the agent's defaults: that request answers 404 once decoded)."""
        return self.serving.request_limits(name, version)

    def knows(self, name: str) -> bool:
        """A model or an app of this node, or a model its routing table names."""
        return (name in self.apps.apps or name in self.serving.cache.specs
                or self.router.knows(name))

    async def infer(self, call: Call) -> Answer:
        """Serve ``call``: the front ends' one entry point."""
        return await self.servable(call.model, call.version).infer(call)

    def count(self, name: str, protocol: str, code: int, seconds: float | None,
              version: int | None = None) -> None:
        """Count one inference request that came in by ``protocol`` and was answered
        with ``code`` (``seconds``: timed where it succeeded)."""
        self.metrics.observe(name if self.knows(name) else "<unknown>", protocol, code,
                             seconds, version)
