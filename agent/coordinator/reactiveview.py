"""What the reactive check reads of each live node, kept from one check to the next.

Every ``reactive_interval_s`` the planner takes the nodes heard from since its last
check (a report or a lease) and the worst latency they measured per model at the
plan's SLO percentile. ``ReactiveView`` keeps per node (``KeptNodes``: decoded once per
stored report) what the check needs of its stored summary: whether it renews leases
(``summary.renews_leases``) and its worst latency per model at the plan's percentiles
(its models' and the requests it forwarded); when the plan's percentiles change, every
node's is decoded again. A few hundred bytes per live node.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import orjson

from agent.coordinator.keptnodes import KeptNodes
from agent.coordinator.store import Store
from agent.coordinator.summary import decoded_latency, renews_leases, report_latency
from agent.wire import latency_at, latency_points, parse_report


class NodeLatency:
    """One node's stored report as the reactive check reads it, at some percentiles."""

    __slots__ = ("renews", "models", "worst")

    def __init__(self, renews: bool, models: np.ndarray, worst: np.ndarray) -> None:
        self.renews = renews  # the node renews leases
        self.models = models  # the plan's models it measured (their indices)
        self.worst = worst  # the worst latency of each at its percentile

    @classmethod
    def decoded(cls, name: str, summary: str | bytes | None, report: str | bytes | None,
                percentiles: dict[str, float], index: dict[str, int]) -> "NodeLatency":
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
        return cls(renews, np.array([index[m] for m in worst], dtype=np.intp),
                   np.array(list(worst.values()), dtype=float))


class ReactiveView:
    """Per live node, its ``NodeLatency`` as of the last check (see the module
    docstring); ``store``: the coordinator's ``Store``."""

    def __init__(self, store: Store) -> None:
        self.kept: KeptNodes[NodeLatency] = KeptNodes(store, self._decode)
        self.percentiles: dict[str, float] = {}  # those the kept nodes were decoded at
        self.models: list[str] = []  # their models, in order
        self._index: dict[str, int] = {}  # model -> its place in ``models``

    def _decode(self, name: str, summary: str | bytes | None, report: str | bytes | None,
                reported: float | None) -> NodeLatency:
        return NodeLatency.decoded(name, summary, report, self.percentiles, self._index)

    def live(self, since: float, percentiles: dict[str, float]
             ) -> list[tuple[str, float, NodeLatency]]:
        """``(name, last_seen, its NodeLatency)`` of the nodes heard from at or after
        ``since``, at ``percentiles`` (the plan's: model -> SLO percentile), decoding
        only the reports new since the last call (every one where the percentiles
        changed); the nodes not among them are forgotten."""
        if percentiles != self.percentiles:
            self.kept.clear()
            self.percentiles = dict(percentiles)
            self.models = list(percentiles)
            self._index = {m: i for i, m in enumerate(self.models)}
        return self.kept.live(since)

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
