"""OpenTelemetry traces of inference requests: opt-in (the agent config's ``tracing:``
section and the ``tracing`` extra). Off, a request reads ``CURRENT`` twice (``span``,
``queued``) and tests a few Nones: no SDK import, call or allocation.

A request's span, ``edgeagent.infer`` (kind SERVER), begins where a front end takes the
request (``Tracing.request``: HTTP in ``agent.node.routes.counted``, gRPC in
``ModelInfer``) as the child of the client's W3C ``traceparent`` (header or metadata)
when it sends one, and ends with the answer (``RequestTrace.end``). Its children, each
where its phase happens:

* ``edgeagent.cold_start``: waiting for a model that is not loaded (the cache's lease).
  Under it, for the request whose miss started the load, the load's steps:
  ``edgeagent.download`` (a sourced model's pull into the disk tier),
  ``edgeagent.load`` (pricing, a load slot and room, the backend's load) and
  ``edgeagent.first_run`` (the warm-up run that ends a load) (``LoadTrace``);
* ``edgeagent.admission`` (the queue's tail drop and bouncer);
* ``edgeagent.queue`` (waiting in the model's queue) and ``edgeagent.batch`` (the run of
  the batch it ran in) (``Queued``). A batch serves several requests, a fan-in:
  OpenTelemetry gives a span one parent and expresses other causes as links, so each
  request keeps a batch span of its own under its request span (its trace stays whole)
  and that span links to the request spans of the others in the batch (``BATCH_LINKS``).

The trace travels with the request's task as ``CURRENT`` (a context variable, as
OpenTelemetry's own context does): the cache's load task, started by a request, finds
it there, and a call to another node (a forward, a selection app's member on a peer)
passes it on (``outgoing``). A shared leaf: the SDK is imported only by ``Tracing``.
"""

from __future__ import annotations

import importlib.util
import time
from contextvars import ContextVar, Token
from typing import Any, Mapping, Sequence

from agent.extras import install_hint

#: Links a request's batch span carries to the other requests of its batch, at most.
BATCH_LINKS = 16
#: The exporter package of each OTLP protocol (``tracing.protocol``).
EXPORTERS = {"grpc": "opentelemetry.exporter.otlp.proto.grpc",
             "http/protobuf": "opentelemetry.exporter.otlp.proto.http"}
#: The tracing extra's pip names, for the hint where the metadata cannot say.
PACKAGES = ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc",
            "opentelemetry-exporter-otlp-proto-http")

#: The trace of the request the running task serves (None: none, or tracing is off).
CURRENT: ContextVar[RequestTrace | None] = ContextVar("edgeagent_trace", default=None)


def missing_sdk(protocol: str) -> str | None:
    """Why traces cannot be sent by ``protocol`` from this interpreter (the command that
    installs the extra), or None when they can."""
    for module in ("opentelemetry.sdk.trace", EXPORTERS[protocol]):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (f"needs the tracing extra ({module} is not installed): "
                    f"{install_hint('tracing', PACKAGES)}")
    return None


class Tracing:
    """The agent's tracer: spans sampled by trace id (``sample_ratio``, a caller's
    decision kept), named by ``service_name`` and ``node``, sent in batches to an OTLP
    collector, or to ``exporter`` as each ends (tests: the SDK's in-memory exporter)."""

    def __init__(self, *, service_name: str, node: str, endpoint: str | None = None,
                 protocol: str = "grpc", sample_ratio: float = 1.0,
                 exporter: Any = None) -> None:
        from opentelemetry import trace as api
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation import tracecontext

        self.api = api
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service_name,
                                      "service.instance.id": node}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.provider.add_span_processor(
            SimpleSpanProcessor(exporter) if exporter is not None
            else BatchSpanProcessor(_otlp_exporter(protocol, endpoint)))
        self.tracer = self.provider.get_tracer("edgeagent")
        self.propagator = tracecontext.TraceContextTextMapPropagator()

    def request(self, carrier: Mapping[str, str], model: str, protocol: str
                ) -> RequestTrace:
        """Begin a request's span, the child of ``carrier``'s ``traceparent`` (HTTP
        headers, gRPC metadata), as the running task's trace until ``RequestTrace.end``."""
        span = self.tracer.start_span(
            "edgeagent.infer", context=self.propagator.extract(carrier),
            kind=self.api.SpanKind.SERVER,
            attributes={"edgeagent.model": model, "edgeagent.protocol": protocol})
        trace = RequestTrace(self, span)
        trace.token = CURRENT.set(trace)
        return trace

    def close(self) -> None:
        """Send what is still buffered and stop."""
        self.provider.shutdown()


def _otlp_exporter(protocol: str, endpoint: str | None) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore
            OTLPSpanExporter)
    return OTLPSpanExporter(endpoint=endpoint)


class RequestTrace:
    """One span of a request's trace: the request's own (``Tracing.request``) or one of
    its phases (``span``), and what its children need."""

    __slots__ = ("tracing", "span", "context", "recording", "token")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self.tracing, self.span = tracing, span
        self.context = tracing.api.set_span_in_context(span)
        self.recording = span.is_recording()  # sampled
        self.token: Token | None = None

    def end(self, code: int, model: str | None = None) -> None:
        """The request was answered with ``code`` (an HTTP status; 500 and up an
        error): its span ends, and the task's trace is what it was before."""
        span = self.span
        if model:  # gRPC: known once the message is read
            span.set_attribute("edgeagent.model", model)
        span.set_attribute("http.response.status_code", code)
        if code >= 500:
            span.set_status(self.tracing.api.Status(self.tracing.api.StatusCode.ERROR,
                                                    f"answered {code}"))
        span.end()
        if self.token is not None:
            CURRENT.reset(self.token)
            self.token = None

    def record(self, name: str, start: int, end: int, attributes: dict[str, Any],
               error: BaseException | None = None, links: Sequence[Any] = ()) -> Any:
        """A child span from ``start`` to ``end`` (ns since the epoch) that ended."""
        span = self.child(name, start, attributes, links)
        if error is not None:
            failed(span, error)
        span.end(end_time=end)
        return span

    def child(self, name: str, start: int | None = None,
              attributes: dict[str, Any] | None = None, links: Sequence[Any] = ()) -> Any:
        """A child span begun at ``start`` (None: now), to be ended by the caller."""
        return self.tracing.tracer.start_span(name, context=self.context, start_time=start,
                                              attributes=attributes, links=links)


def failed(span: Any, error: BaseException) -> None:
    """Mark ``span`` failed with ``error`` (its type and message; no traceback)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(error).__name__)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class _Nothing:
    """The phase of a request that is not traced: a ``with`` that does nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


NOTHING = _Nothing()


class _Phase:
    """A child span of a trace over a ``with`` block, the running task's trace in it."""

    __slots__ = ("parent", "name", "model", "trace", "token")

    def __init__(self, parent: RequestTrace, name: str, model: str | None) -> None:
        self.parent, self.name, self.model = parent, name, model

    def __enter__(self) -> RequestTrace:
        attributes = {"edgeagent.model": self.model} if self.model else None
        self.trace = RequestTrace(self.parent.tracing, self.parent.child(self.name,
                                                                  attributes=attributes))
        self.token = CURRENT.set(self.trace)
        return self.trace

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        CURRENT.reset(self.token)
        if error is not None:
            failed(self.trace.span, error)
        self.trace.span.end()


def span(name: str, model: str | None = None) -> _Phase | _Nothing:
    """``with span(name):`` a phase of the running task's request, a child span of its
    trace (the block's trace); nothing where there is none or it is not sampled."""
    trace = CURRENT.get()
    if trace is None or not trace.recording:
        return NOTHING
    return _Phase(trace, name, model)


def outgoing() -> list[tuple[str, str]] | tuple[()]:
    """The W3C trace context (``traceparent``, ``tracestate``) of the running task's
    request for a call it makes to another node, as headers or gRPC metadata; none
    without one."""
    trace = CURRENT.get()
    if trace is None:
        return ()
    carrier: dict[str, str] = {}
    trace.tracing.propagator.inject(carrier, context=trace.context)
    return list(carrier.items())


# -- a request in a model's queue and batch ---------------------------------------------


class Queued:
    """A traced request in a model's queue (``Pending.trace``): its queue span is
    written when its batch begins (or it is dropped), its batch span runs with it."""

    __slots__ = ("parent", "since", "batch")

    def __init__(self, parent: RequestTrace) -> None:
        self.parent, self.since = parent, time.time_ns()
        self.batch: Any = None

    def dropped(self, error: BaseException) -> None:
        """Answered ``error`` before its batch began (expired, shed, shutdown)."""
        if self.batch is None and self.since:
            self.parent.record("edgeagent.queue", self.since, time.time_ns(), {}, error)
            self.since = 0


def queued() -> Queued | None:
    """The running task's request enters a model's queue (None: not traced)."""
    trace = CURRENT.get()
    if trace is None or not trace.recording:
        return None
    return Queued(trace)


def batch_began(batch: Sequence[Any], model: str) -> list[Queued]:
    """``batch`` (``Pending``s) runs now: each traced request's queue span is written
    and its batch span begins, linked to the other requests'; returns them."""
    traced = [p.trace for p in batch if p.trace is not None]
    now = time.time_ns()
    attributes = {"edgeagent.model": model, "edgeagent.batch.requests": len(batch),
                  "edgeagent.batch.rows": sum(p.rows for p in batch)}
    links = [q.parent.tracing.api.Link(q.parent.span.get_span_context()) for q in traced]
    for i, q in enumerate(traced):
        q.parent.record("edgeagent.queue", q.since, now, {"edgeagent.model": model})
        q.since = 0
        others = (links[:i] + links[i + 1:])[:BATCH_LINKS]
        q.batch = q.parent.child("edgeagent.batch", now, attributes, others)
    return traced


def batch_ended(traced: list[Queued]) -> None:
    """The batch of ``traced`` (``batch_began``) ended."""
    now = time.time_ns()
    for q in traced:
        q.batch.end(end_time=now)


# -- a load, for the request whose miss started it --------------------------------------


class LoadTrace:
    """A load's spans under the request that started it: its download (a sourced
    model's pull), its load and its first run, one after the other."""

    __slots__ = ("parent", "model", "mark", "download")

    def __init__(self, parent: RequestTrace, model: str) -> None:
        self.parent, self.model, self.mark = parent, model, time.time_ns()
        self.download: Any = None

    def download_began(self) -> None:
        self.download = self.parent.child("edgeagent.download",
                                          attributes={"edgeagent.model": self.model})

    def download_ended(self, nbytes: int) -> None:
        self.mark = time.time_ns()
        self.download.set_attribute("edgeagent.download.bytes", nbytes)
        self.download.end(end_time=self.mark)
        self.download = None

    def loaded(self, first_run_seconds: float, attributes: dict[str, Any]) -> None:
        """The load ended now, its last ``first_run_seconds`` the first run."""
        now = time.time_ns()
        split = max(now - int(first_run_seconds * 1e9), self.mark)
        model = {"edgeagent.model": self.model}
        self.parent.record("edgeagent.load", self.mark, split, {**model, **attributes})
        self.parent.record("edgeagent.first_run", split, now, model)

    def failed(self, error: BaseException) -> None:
        """The load failed (or gave up) now: the step it was in ends with ``error``."""
        if self.download is not None:
            failed(self.download, error)
            self.download.end()
            return
        self.parent.record("edgeagent.load", self.mark, time.time_ns(),
                           {"edgeagent.model": self.model}, error)


def load_began(model: str) -> LoadTrace | None:
    """A load task begins: the spans of the request that started it (None: none, or
    not sampled). Tasks it starts from here on see no trace (the batchers of the model
    it loads outlive that request)."""
    trace = CURRENT.get()
    if trace is None:
        return None
    CURRENT.set(None)
    return LoadTrace(trace, model) if trace.recording else None
