"""What the reactive check reads of each live node, kept from one check to the next.

Every ``reactive_interval_s`` the planner takes the nodes heard from since its last
check (a report or a lease) and the worst latency they measured per model. With
leases nearly every node is heard from at every check while few send a new full
report, so ``ReactiveView`` keeps per node what the check needs of its stored summary:
whether it renews leases (``summary.renews_leases``) and each model's latency as
``latency_points`` (its models', then those of the requests it forwarded), decoded once
per stored report. A check reads each live node's name, ``last_seen`` and ``reported``
(``Store.live_marks``) and the summaries (or reports, where a node has none) of only
the nodes whose ``reported`` differs from the one decoded (``Store.node_summaries``).
A node's value at its model's SLO percentile is kept too, until the plan's percentiles
change. Nodes no longer live (or deleted) are dropped at the next check.

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
    """One node's stored report as the reactive check reads it."""

    __slots__ = ("reported", "renews", "points", "worst")

    def __init__(self, reported: float | None, renews: bool,
                 points: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]) -> None:
        self.reported = reported  # the ``reported`` of the row it was decoded from
        self.renews = renews  # the node renews leases
        self.points = points  # (model, latency_points): its models, then forwarded
        #: the plan's models (their indices in ``ReactiveView.models``) the node measured
        #: and the worst latency of each at its SLO percentile (None: not worked out for
        #: the current percentiles)
        self.worst: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def decoded(cls, name: str, summary: str | bytes | None, report: str | bytes | None,
                reported: float | None) -> "NodeLatency":
        """From a ``Store.node_summaries`` row: its summary, else its report validated."""
        if summary is not None:
            decoded = orjson.loads(summary)
            renews, measured = renews_leases(decoded), decoded_latency(decoded)
        else:
            parsed = parse_report(name, report)
            renews, measured = parsed.report_id is not None, report_latency(parsed)
        return cls(reported, renews,
                   tuple((model, latency_points(ms)) for model, ms in measured))

    def worst_at(self, percentiles: dict[str, float], index: dict[str, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(the ``index`` of each model in ``percentiles`` that the node measured, the
        worst of its latencies at ``percentiles[model]``); kept in ``worst``."""
        worst: dict[str, float] = {}
        for model, points in self.points:
            percentile = percentiles.get(model)
            if percentile is None:
                continue
            v = latency_at(points, percentile)
            if v is not None and v > worst.get(model, -math.inf):
                worst[model] = v
        self.worst = (np.array([index[m] for m in worst], dtype=np.intp),
                      np.array(list(worst.values()), dtype=float))
        return self.worst


class ReactiveView:
    """Per live node, its ``NodeLatency`` as of the last check (see the module
    docstring); ``store``: the coordinator's ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes: dict[str, NodeLatency] = {}
        self._percentiles: dict[str, float] = {}  # those of the kept ``worst`` values
        self.models: list[str] = []  # their models, in order
        self._index: dict[str, int] = {}  # model -> its place in ``models``

    def live(self, since: float) -> list[tuple[str, float, NodeLatency]]:
        """``(name, last_seen, its NodeLatency)`` of the nodes heard from at or after
        ``since``, decoding only the reports new since the last call; the nodes not
        among them are forgotten."""
        marks = self.store.live_marks(since)
        kept = self.nodes
        stale = {name for name, _, reported in marks
                 if (entry := kept.get(name)) is None or entry.reported != reported}
        fresh = {name: NodeLatency.decoded(name, summary, report, reported)
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

    def worst(self, percentiles: dict[str, float],
              heard: Iterable[NodeLatency]) -> dict[str, float]:
        """model -> the worst latency at its ``percentiles`` entry (the plan's SLO
        percentile; models without one are skipped) that the nodes ``heard`` measured,
        their models' and the requests they forwarded (the client's wait, hop and
        all)."""
        if percentiles != self._percentiles:
            for entry in self.nodes.values():
                entry.worst = None
            self._percentiles = dict(percentiles)
            self.models = list(percentiles)
            self._index = {m: i for i, m in enumerate(self.models)}
        worst = [entry.worst or entry.worst_at(percentiles, self._index) for entry in heard]
        if not worst:
            return {}
        out = np.full(len(self.models), -np.inf)
        np.fmax.at(out, np.concatenate([w[0] for w in worst]),
                      np.concatenate([w[1] for w in worst]))
        return {self.models[i]: float(out[i]) for i in np.flatnonzero(out > -np.inf)}
