"""A node's report as the planner needs it: compact, and already validated.

Ingestion validates every report (``agent.wire.parse_report``) and keeps, beside the
report as sent, its ``summary``: capacity (cores, CPU memory; not the GPUs, which the
planner does not use), node type, and per model its device, residency, size, batch
counts and latency percentiles (no arrivals: the planner reads those from the store's
rate bins). The store writes it with the node's row, so the planning process (or any
coordinator sharing a PostgreSQL store) reads a few hundred bytes per node and builds
the planner's ``NodeReport`` from it without validating the report again.

The format is JSON: ``[cores, cpu_memory_bytes, node_type, [[model, device, resident,
size_bytes, [[batch, [count, seconds]], ...], [[percentile, ms], ...]], ...]]``.
"""

from __future__ import annotations

import dataclasses

import orjson

from agent.wire import ModelReport, NodeCapacity, NodeReport


def summarize(report: NodeReport) -> bytes:
    """The summary of a validated ``report``."""
    return orjson.dumps([
        report.capacity.cores, report.capacity.cpu_memory_bytes, report.node_type,
        [(name, m.device, m.resident, m.size_bytes, list(m.batches.items()),
          list(m.latency_ms.items())) for name, m in report.models.items()]])


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelReport)
             if f.default is not dataclasses.MISSING}


def _model(name: str, device: str, resident: bool, size: float, batches: list,
           latency: list) -> ModelReport:
    """A ``ModelReport`` of trusted values, its fields set at once (its frozen
    dataclass ``__init__`` sets them one by one: a plan of 10,000 nodes makes 100,000)."""
    model = object.__new__(ModelReport)
    vars(model).update(_DEFAULTS, name=name, device=device, resident=resident,
                       size_bytes=size, batches={b: (n, s) for b, (n, s) in batches},
                       latency_ms={q: ms for q, ms in latency})
    return model


def expand(node: str, summary: bytes | str) -> NodeReport:
    """The planner's ``NodeReport`` of ``node`` from its ``summary`` (trusted: it was
    written from a validated report); fields the summary leaves out take their
    defaults."""
    cores, memory, node_type, models = orjson.loads(summary)
    return NodeReport(node, NodeCapacity(cores, memory),
                      {m[0]: _model(*m) for m in models}, node_type)
