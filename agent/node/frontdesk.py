"""The front desk: where every inference request comes in.

Each front end (v2 REST ``api_v2``, v2 gRPC ``grpc_v2``, TF Serving REST
``api_tfserving``) reads its protocol into one ``Call`` (``agent.node.call``), its body
not yet decoded, and hands it to ``FrontDesk.infer(call)``, the one entry point that
serves it: ``servable_for`` decides what serves it, and ``infer`` awaits that.

What serves a call: a peer node that runs its model under the plan (``PeerServable``:
the router's choice, ``agent.node.routing``; the call goes there undecoded, one hop at
most, its answer relayed as it came, and is served here when the peer cannot), else
what serves its name here (``servable``: a selection app, ``AppServable``, or a model
of the repository, through the cache and batching: ``ModelServable``). A servable of
this node reads (decodes) the call first, for its limits and signature.

A model's statistics (Triton's extension and the twin's request record) are counted
where it is served (``Serving.infer``), every request alike: one whose input does not
fit the model's known signature is refused before it can cause a load and counted as a
failure, whatever protocol brought it. The endpoint counter of ``/metrics`` is
``FrontDesk.count``, which the HTTP and gRPC wrappers call once per request.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Protocol

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
    """What serves a name: a cached model, a selection app, a peer node."""

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
        await call.read(self)
        entry, outputs = await self.serving.infer(call)
        return Answer(outputs, self.name, entry.version, call.request_id)

    def limits(self) -> Limits:
        return self.serving.request_limits(self.name, self.version)

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
    """A selection app: its members called through ``Serving`` as clients would, or on
    the peer node the plan runs them on (``elsewhere(name, version)``: its servable,
    None where it runs here)."""

    def __init__(self, serving: Serving, app: SelectionApp,
                 elsewhere: Callable[[str, int | None], Servable | None]) -> None:
        self.serving, self.app, self.elsewhere = serving, app, elsewhere

    async def infer(self, call: Call) -> Answer:
        await call.read(self)
        return await self.app.infer(self.serving, call, self.elsewhere)

    def limits(self) -> Limits:
        """The agent's defaults (an app has no settings of its own)."""
        return self.serving.request_limits(self.app.name, None)

    async def metadata(self) -> dict[str, Any]:
        app = self.app
        await app.ensure_valid(self.serving, self.elsewhere)
        return {"name": app.name, "versions": ["1"], "platform": "selection",
                "inputs": [s.as_json() for s in app.inputs],
                "outputs": [app.output.as_json()] if app.output else []}

    def unready(self) -> str | None:
        return self.app.error

    async def signature(self) -> list[TensorSpec] | None:
        await self.app.ensure_valid(self.serving, self.elsewhere)
        return self.app.inputs

    async def unload(self) -> None:
        """An app holds no memory of its own."""


class PeerServable:
    """A peer node that runs the model under the plan (the routing table): a call goes
    there as it arrived, never decoded here, and its answer comes back as the peer gave
    it; the call is served here (``here``) when the peer cannot. A selection app's
    member call has no ``here``: a peer that cannot answer leaves it missing."""

    def __init__(self, router: Router, peer: str, name: str, version: int | None,
                 here: Callable[[], Servable] | None = None) -> None:
        self.router, self.peer, self.name, self.version = router, peer, name, version
        self.here = here

    async def infer(self, call: Call) -> Answer:
        answer = await self.router.forward(call, self.peer)
        if answer is not None:
            return answer
        assert self.here is not None, "a call without a fallback raises instead"
        return await self.here().infer(call)

    async def metadata(self) -> dict[str, Any]:
        """Its signature as the peer serves it (``{"name", "inputs", "outputs"}``)."""
        return {"name": self.name,
                **await self.router.metadata(self.peer, self.name, self.version)}

    def unready(self) -> str | None:
        return None

    async def signature(self) -> list[TensorSpec] | None:
        return [TensorSpec(s["name"], s["datatype"], tuple(s["shape"]))
                for s in (await self.metadata())["inputs"]]

    async def unload(self) -> None:
        """What a peer holds is its own."""


class FrontDesk:
    """Finds what serves a call and hands it over; counts every inference request."""

    def __init__(self, serving: Serving, apps: SelectionApps, metrics: Metrics,
                 router: Router) -> None:
        self.serving, self.apps, self.metrics, self.router = serving, apps, metrics, router

    async def infer(self, call: Call) -> Answer:
        """Serve ``call``: the front ends' one entry point."""
        return await self.servable_for(call).infer(call)

    def servable_for(self, call: Call) -> Servable:
        """What serves ``call``: the peer node the router picks for it (the mark of a
        call forwarded here judged first: ``MarkRefused``, 403), else ``servable``."""
        peer = self.router.peer_for(call)
        if peer is None:
            return self.servable(call.model, call.version)
        return PeerServable(self.router, peer, call.model, call.version,
                            functools.partial(self.servable, call.model, call.version))

    def servable(self, name: str, version: int | None = None) -> Servable:
        """What serves ``name`` here: its selection app, else its model;
        ``UnknownModel`` (404) for neither, or for a version it lacks."""
        return self.app(name, version) or ModelServable(self.serving, name, version)

    def app(self, name: str, version: int | None = None) -> AppServable | None:
        """``name``'s selection app (None: ``name`` is no app): the one place that tells
        an app from a model."""
        if name not in self.apps.apps:
            return None
        return AppServable(self.serving, self.apps.app(name, version), self.elsewhere)

    def elsewhere(self, name: str, version: int | None) -> PeerServable | None:
        """The peer node that serves a selection app's member ``name`` (None: here)."""
        peer = self.router.peer_of(name)
        return None if peer is None else PeerServable(self.router, peer, name, version)

    def knows(self, name: str) -> bool:
        """A model or an app of this node, or a model its routing table names."""
        return (name in self.apps.apps or name in self.serving.cache.specs
                or self.router.knows(name))

    def count(self, name: str, protocol: str, code: int, seconds: float | None,
              version: int | None = None) -> None:
        """Count one inference request that came in by ``protocol`` and was answered
        with ``code`` (``seconds``: timed where it succeeded)."""
        self.metrics.observe(name if self.knows(name) else "<unknown>", protocol, code,
                             seconds, version)
