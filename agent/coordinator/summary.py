"""A node's report as the planner needs it: compact, and already validated.

Ingestion validates every report (``agent.wire.parse_report``) and keeps, beside the
report as sent, its ``summary``: capacity (cores, CPU memory; not the GPUs, which the
planner does not use), node type, and per model its device, residency, size, batch
counts and latency percentiles (no arrivals: the planner reads those from the store's
rate bins). The store writes it with the node's row, so the planning process (or any
coordinator sharing a PostgreSQL store) reads a few hundred bytes per node and builds
the planner's ``NodeReport`` from it without validating the report again.

The format is JSON: ``[cores, cpu_memory_bytes, node_type, [[model, device, resident,
size_bytes, [[batch, [count, seconds]], ...], [[percentile, ms], ...]], ...], [[model,
version, bytes], ...], [[model, version], ...], [[model, [[percentile, ms], ...]], ...],
[url, grpc], [[model, rate], ...]]`` (the last five: what the node holds on disk and is
pulling, the latency of the requests it forwarded per model, ``NodeReport.routing``,
which the reactive loop watches too, where its peers reach it, which plans keep, and,
from a node that renews leases, each model's recent rate, which the planner takes it
to go on receiving until its next full report; a summary written before them has fewer
items); a percentile is its
report's key (``"p99"``; a summary written before the wire types kept the number, 99.0,
read the same way).
"""

from __future__ import annotations

import orjson

from agent.wire import (BatchCount, DiskHolding, ModelReport, NodeCapacity, NodeReport,
                        PeerAddress, Pulling, RoutedModel, RoutingReport)


def summarize(report: NodeReport) -> bytes:
    """The summary of a validated ``report``."""
    return orjson.dumps([
        report.capacity.cores, report.capacity.cpu_memory_bytes, report.node_type,
        [(name, m.device, m.resident, m.size_bytes,
          [(b, (c.count, c.seconds)) for b, c in m.batches.items()],
          [(q, ms) for q, ms in m.latency_ms.items() if ms is not None])
         for name, m in report.models.items()],
        [(h.model, h.version, h.bytes) for h in report.disk],
        [(p.model, p.version) for p in report.pulling],
        [(name, [(q, ms) for q, ms in r.latency_ms.items() if ms is not None])
         for name, r in (report.routing.models if report.routing else {}).items()
         if r.latency_ms],
        (report.peer.url, report.peer.grpc) if report.peer is not None else None,
        None if report.report_id is None else [
            (name, m.rate) for name, m in (*report.models.items(),
                                           *(report.routing.models.items()
                                             if report.routing else ()))
            if m.rate is not None]])


def _model(name: str, device: str, resident: bool, size: float, batches: list,
           latency: list, rate: float | None) -> ModelReport:
    """A ``ModelReport`` of trusted values."""
    return ModelReport(device=device, resident=resident, size_bytes=size,
                       batches={b: BatchCount(n, s) for b, (n, s) in batches},
                       latency_ms={q if type(q) is str else f"p{q:.15g}": ms
                                   for q, ms in latency}, rate=rate)


def expand(summary: bytes | str) -> NodeReport:
    """The planner's ``NodeReport`` from a ``summary`` (trusted: it was written from a
    validated report); fields the summary leaves out take their defaults."""
    cores, memory, node_type, models, *held = orjson.loads(summary)
    disk, pulling, routed, peer, rates = (held + [[], [], [], None, None])[:5]
    rates = dict(rates or ())
    names = {m[0] for m in models}
    routed = {name: RoutedModel(latency_ms=dict(latency),
                                rate=None if name in names else rates.get(name))
              for name, latency in routed}
    routed.update((name, RoutedModel(rate=rate)) for name, rate in rates.items()
                  if name not in names and name not in routed)
    routing = RoutingReport(models=routed) if routed else None
    return NodeReport(capacity=NodeCapacity(cores, memory),
                      models={m[0]: _model(*m, rates.get(m[0])) for m in models},
                      node_type=node_type,
                      disk=tuple(DiskHolding(*h) for h in disk),
                      pulling=tuple(Pulling(*p) for p in pulling), routing=routing,
                      peer=PeerAddress(*peer) if peer else None)


def renews_leases(decoded: list) -> bool:
    """Whether the node of a ``decoded`` summary renews leases (its report had a
    ``report_id``, so the summary holds its rates, even none)."""
    return len(decoded) > 8 and decoded[8] is not None


def decoded_latency(decoded: list) -> list[tuple[str, dict[str, float]]]:
    """``(model, latency_ms)`` of each model of a ``decoded`` summary and then of each
    model its node forwarded, as the ``NodeReport`` that ``expand`` makes has them (what
    the reactive check reads of a node's summary)."""
    _, _, _, models, *held = decoded
    routed = held[2] if len(held) > 2 else []
    return [*((m[0], {q if type(q) is str else f"p{q:.15g}": ms for q, ms in m[5]})
              for m in models),
            *((name, dict(latency)) for name, latency in routed)]


def report_latency(report: NodeReport) -> list[tuple[str, dict[str, float | None]]]:
    """``(model, latency_ms)`` of a report's models and then of those it forwarded."""
    routed = report.routing.models.items() if report.routing else ()
    return [(name, m.latency_ms) for name, m in (*report.models.items(), *routed)]
