"""The live fleet as a plan reads it, in one pass over the nodes' stored summaries.

A plan needs, per node, its capacity and address, and per model the nodes that hold it
(whether resident there), its largest size and whether it runs on CPUs only, their busy
seconds and requests (the processing time), when the first of those nodes was last
heard from (where its forecast ends), the rates of the nodes that renew leases, and the
nodes holding or pulling its files. ``FleetView`` keeps exactly that, built from each
node's decoded summary (``summary.summarize``'s lists) without making the node's
``NodeReport`` (a 100,000-node fleet is a million model reports). A node stored without
a summary has its report validated and summarized here. What it holds is what
``summary.expand`` and the ``NodeReport`` methods would give the planner, summed in the
store's node order, so a plan is the same either way (``tests/test_planner_golden.py``).

A node that renews leases was last heard from at ``now`` or at its stored ``last_seen``
plus ``lease_lag_s``, whichever is sooner: the store gets its leases only every
``lease_write_s`` (``agent.coordinator.ingest``), so the stored time may lag its last
lease by that much, and never leads it. A node that sends only full reports was last
heard from at its stored time.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import orjson

from agent.coordinator.summary import renews_leases, summarize
from agent.wire import NodeReport, parse_report


class Held:
    """One model on the live nodes that hold it (in the store's node order)."""

    __slots__ = ("nodes", "end", "seconds", "done", "largest", "cpu_only")

    def __init__(self, end: float, size: float) -> None:
        self.nodes: dict[str, bool] = {}  # node -> whether the model is resident there
        self.end = end  # when the first of those nodes was last heard from
        #: busy seconds and requests processed, summed over the nodes in order (each
        #: node's ``ModelReport.busy_seconds_per_request``)
        self.seconds = self.done = 0.0
        self.largest = size  # its largest reported size (the first of equals)
        self.cpu_only = True  # every node runs it on the CPU


class FleetView:
    """The live nodes (in the store's order) and, per model, what the plan reads, at
    ``now`` with the stored times of leases at most ``lease_lag_s`` behind (0: every
    lease is in the store; see the module docstring)."""

    def __init__(self, now: float = math.inf, lease_lag_s: float = 0.0) -> None:
        self.now, self.lease_lag_s = now, lease_lag_s
        self.capacity: dict[str, tuple[float, float]] = {}  # node -> (cores, memory)
        self.peers: dict[str, tuple[str, str | None]] = {}  # node -> (url, grpc)
        self.held: dict[str, Held] = {}  # model -> the nodes holding it
        self.tails: dict[str, list[tuple[float, float]]] = {}  # model -> (reported, rate)
        self.files: dict[str, set[str]] = {}  # model -> nodes holding or pulling its files

    def __len__(self) -> int:
        return len(self.capacity)

    def add(self, node: str, last_seen: float, reported: float, summary: list[Any],
            rates: Iterable[tuple[str, float]] | None = None) -> None:
        """``node``'s decoded summary; ``rates``: its report's ``report_rates`` (None:
        those of the report ``summary.expand`` makes of it)."""
        cores, memory, _, models, *held = summary
        disk, pulling, routed, peer, summary_rates = (held + [[], [], [], None, None])[:5]
        if renews_leases(summary):
            last_seen = heard_until(last_seen, self.now, self.lease_lag_s)
        self.capacity[node] = (cores, memory)
        if peer:
            self.peers[node] = (peer[0], peer[1])
        by_model = self.held
        for name, device, resident, size, batches, _ in models:
            model = by_model.get(name)
            if model is None:
                model = by_model[name] = Held(last_seen, size)
            else:
                if last_seen < model.end:
                    model.end = last_seen
                if size > model.largest:
                    model.largest = size
            model.nodes[node] = resident
            if device != "cpu":
                model.cpu_only = False
            seconds = done = 0  # sum()'s start, then in the batches' order
            for b, (count, busy) in batches:
                seconds += busy
                done += b * count
            model.seconds += seconds
            model.done += done
        if disk or pulling:
            files = self.files
            for name, *_ in (*disk, *pulling):
                files.setdefault(name, set()).add(node)
        if rates is None:
            rates = expanded_rates(models, routed, summary_rates) if summary_rates else ()
        tails = self.tails
        for name, rate in rates:
            tails.setdefault(name, []).append((reported, rate))

    def add_row(self, node: str, last_seen: float, reported: float,
                summary: str | bytes | None, report: str | bytes | None) -> None:
        """A row of ``Store.live_nodes``: its summary, else its report validated now."""
        if summary is not None:
            self.add(node, last_seen, reported, orjson.loads(summary))
            return
        parsed = parse_report(node, report)
        self.add(node, last_seen, reported, orjson.loads(summarize(parsed)),
                 report_rates(parsed))


def heard_until(last_seen: float, now: float, lease_lag_s: float) -> float:
    """When a node that renews leases was last heard from, by its stored ``last_seen``
    (see the module docstring): ``now``, or ``lease_lag_s`` after the stored time where
    that is sooner; never before the stored time."""
    return max(last_seen, min(now, last_seen + lease_lag_s))


def heard_from(seen: float, renews: bool, now: float, lease_lag_s: float,
               last: float) -> float:
    """When a node stored as last seen at ``seen`` was last heard from: ``seen``, or
    later where it ``renews`` leases (``heard_until``) and ``seen`` is not after
    ``last`` (when the reactive check last heard from it)."""
    if seen > last or not lease_lag_s or seen >= now or not renews:
        return seen
    return heard_until(seen, now, lease_lag_s)


def report_rates(report: NodeReport) -> list[tuple[str, float]]:
    """``(model, rate)`` of each model a report gives a rate for (its own models and
    those it only forwards)."""
    routed = report.routing.models.items() if report.routing else ()
    return [(m, r.rate) for m, r in (*report.models.items(), *routed) if r.rate is not None]


def expanded_rates(models: list, routed: list, rates: list) -> list[tuple[str, float]]:
    """The ``(model, rate)`` pairs of a summary's report as ``summary.expand`` makes it:
    its models' rates, then those of the models it only forwards."""
    if not routed and len(rates) == len(models) \
            and all(r[0] == m[0] for r, m in zip(rates, models)):
        return rates  # one rate per model, in their order (what a summary mostly holds)
    by_model = dict(rates)
    names = {m[0] for m in models}
    out = [(m[0], by_model[m[0]]) for m in models if by_model.get(m[0]) is not None]
    forwarded = {name: None if name in names else by_model.get(name) for name, _ in routed}
    forwarded.update((name, rate) for name, rate in by_model.items()
                     if name not in names and name not in forwarded)
    out += [(name, rate) for name, rate in forwarded.items() if rate is not None]
    return out
