"""What the reactive check reads of each live node, kept from one check to the next.

Every ``reactive_interval_s`` the planner takes the nodes heard from since its last
check (a report or a lease) and the worst latency they measured per model at the
plan's SLO percentile. With leases nearly every node is heard from at every check
while few send a new full report, so ``ReactiveView`` keeps per node what the check
needs of its stored summary: whether it renews leases (``summary.renews_leases``) and
its worst latency per model at the plan's percentiles (its models' and the requests it
forwarded), decoded once per stored report. A check reads each live node's name,
``last_seen`` and ``reported`` (``Store.live_marks``, from an index) and the summaries
(or reports, where a node has none) of only the nodes whose ``reported`` differs from
the one decoded (``Store.node_summaries``); when the plan's percentiles change, every
node's is decoded again. Nodes no longer live (or deleted) are dropped at each check:
a few hundred bytes per live node.

The check decides as reading every row would: ``reported`` changes with each full
report the store keeps (``Store.write_reports``), except where a report replaces one
with the very same ``reported`` time, which a coordinator's clock does not give twice.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import orjson

from agent.coordinator.store import Store
from agent.coordinator.summary import decoded_latency, renews_leases, report_latency
from agent.wire import latency_at, latency_points, parse_report


class NodeLatency:
    """One node's stored report as the reactive check reads it, at some percentiles."""

    __slots__ = ("reported", "renews", "models", "worst")

    def __init__(self, reported: float | None, renews: bool, models: np.ndarray,
                 worst: np.ndarray) -> None:
        self.reported = reported  # the ``reported`` of the row it was decoded from
        self.renews = renews  # the node renews leases
        self.models = models  # the plan's models it measured (their indices)
        self.worst = worst  # the worst latency of each at its percentile

    @classmethod
    def decoded(cls, name: str, summary: str | bytes | None, report: str | bytes | None,
                reported: float | None, percentiles: dict[str, float],
                index: dict[str, int]) -> "NodeLatency":
        """From a ``Store.node_summaries`` row (its summary, else its report validated)
        at ``percentiles`` (model -> SLO percentile; ``index``: model -> its index)."""
        if summary is not None:
            decoded = orjson.loads(summary)
            renews, measured = renews_leases(decoded), decoded_latency(decoded)
        else:
            parsed = parse_report(name, report)
            renews, measured = parsed.report_id is not None, report_latency(parsed)
        worst: dict[str, float] = {}
        for model, latency_ms in measured:
            percentile = percentiles.get(model)
            if percentile is None:
                continue
            v = latency_at(latency_points(latency_ms), percentile)
            if v is not None and v > worst.get(model, -math.inf):
                worst[model] = v
        return cls(reported, renews, np.array([index[m] for m in worst], dtype=np.intp),
                   np.array(list(worst.values()), dtype=float))


class ReactiveView:
    """Per live node, its ``NodeLatency`` as of the last check (see the module
    docstring); ``store``: the coordinator's ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes: dict[str, NodeLatency] = {}
        self.percentiles: dict[str, float] = {}  # those the kept nodes were decoded at
        self.models: list[str] = []  # their models, in order
        self._index: dict[str, int] = {}  # model -> its place in ``models``

    def live(self, since: float, percentiles: dict[str, float]
             ) -> list[tuple[str, float, NodeLatency]]:
        """``(name, last_seen, its NodeLatency)`` of the nodes heard from at or after
        ``since``, at ``percentiles`` (the plan's: model -> SLO percentile), decoding
        only the reports new since the last call (every one where the percentiles
        changed); the nodes not among them are forgotten."""
        if percentiles != self.percentiles:
            self.nodes, self.percentiles = {}, dict(percentiles)
            self.models = list(percentiles)
            self._index = {m: i for i, m in enumerate(self.models)}
        marks = self.store.live_marks(since)
        kept = self.nodes
        stale = {name for name, _, reported in marks
                 if (entry := kept.get(name)) is None or entry.reported != reported}
        fresh = {name: NodeLatency.decoded(name, summary, report, reported,
                                           self.percentiles, self._index)
                 for name, summary, report, reported in self.store.node_summaries(stale)}
        out, nodes = [], {}
        for name, seen, _ in marks:
            entry = fresh.get(name) if name in stale else kept[name]
            if entry is None:
                continue  # deleted since its mark was read
            nodes[name] = entry
            out.append((name, seen, entry))
        self.nodes = nodes
        return out

    def worst(self, heard: Iterable[NodeLatency]) -> dict[str, float]:
        """model -> the worst latency at its percentile (models without one skipped)
        that the nodes ``heard`` (of the last ``live``) measured, their models' and the
        requests they forwarded (the client's wait, hop and all)."""
        heard = list(heard)
        if not heard:
            return {}
        out = np.full(len(self.models), -np.inf)
        np.fmax.at(out, np.concatenate([e.models for e in heard]),
                   np.concatenate([e.worst for e in heard]))
        return {self.models[i]: float(out[i]) for i in np.flatnonzero(out > -np.inf)}
