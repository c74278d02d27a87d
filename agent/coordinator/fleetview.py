"""The live fleet as a plan reads it, from each node's stored summary decoded once.

A plan needs, per node, its capacity and address, and per model the nodes that hold it
(whether resident there), its largest size and whether it runs on CPUs only, their busy
seconds and requests (the processing time), when the first of those nodes was last
heard from (where its forecast ends), the rates of the nodes that renew leases, and the
nodes holding or pulling its files. ``FleetView`` holds exactly that, summed in the
store's node order from each node's ``NodeFacts`` (what ``summary.expand`` and the
``NodeReport`` methods would give the planner), so a plan is the same as one made from
every node's ``NodeReport`` (``tests/test_planner_golden.py``). ``FleetReader`` keeps
each live node's facts from one plan to the next (``KeptNodes``: decoded once per
stored report) and sums them with numpy: at 100,000 nodes a plan no longer decodes a
million model reports, only those of the nodes that sent a full report since the last.

A node that renews leases was last heard from at ``now`` or at its stored ``last_seen``
plus ``lease_lag_s``, whichever is sooner: the store gets its leases only every
``lease_write_s`` (``agent.coordinator.ingest``), so the stored time may lag its last
lease by that much, and never leads it. A node that sends only full reports was last
heard from at its stored time.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Iterable

import numpy as np
import orjson

from agent.coordinator.keptnodes import KeptNodes
from agent.coordinator.store import Store
from agent.coordinator.summary import renews_leases, summarize
from agent.wire import NodeReport, parse_report

#: The columns of ``NodeFacts.held``: a model's index, resident (1/0), on the CPU
#: (1/0), its size, busy seconds and requests processed (``busy_seconds_per_request``).
MODEL, RESIDENT, CPU, SIZE, SECONDS, DONE = range(6)


#: A reader starts its model names afresh (its next read decodes every node again) when
#: it knows more than this many times those its last view held, plus the slack: the
#: names of models no live node reports any more are not kept for ever.
MODELS_KEPT_FACTOR, MODELS_KEPT_SLACK = 2, 1000


class Models:
    """Model names as indices (``index``), in the order first met (``names``)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def of(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i


class NodeFacts:
    """What a plan reads of one node's stored report (see the module docstring)."""

    __slots__ = ("reported", "renews", "capacity", "peer", "held", "rates", "files")

    def __init__(self, reported: float | None, summary: list[Any], models: Models,
                 rates: Iterable[tuple[str, float]] | None = None) -> None:
        """From its decoded summary (``summary.summarize``'s lists); ``rates``: its
        report's ``report_rates`` (None: those of the report ``summary.expand`` makes
        of it)."""
        cores, memory, _, listed, *held = summary
        disk, pulling, routed, peer, summary_rates = (held + [[], [], [], None, None])[:5]
        self.reported = reported  # when its full report came (None: before that was kept)
        self.renews = renews_leases(summary)
        self.capacity = (cores, memory)
        self.peer = (peer[0], peer[1]) if peer else None
        row: list[float] = []  # the rows of ``held``, one after the other
        for name, device, resident, size, batches, _ in listed:
            seconds = done = 0  # sum()'s start, then in the batches' order
            for b, (count, busy) in batches:
                seconds += busy
                done += b * count
            row += (models.of(name), resident, device == "cpu", size, seconds, done)
        self.held = np.array(row, dtype=float).reshape(-1, 6)
        if rates is None:
            rates = expanded_rates(listed, routed, summary_rates) if summary_rates else ()
        row = []
        for m, r in rates:
            row += (models.of(m), r)
        self.rates = np.array(row, dtype=float).reshape(-1, 2)
        self.files = tuple(name for name, *_ in (*disk, *pulling))

    @classmethod
    def of_row(cls, node: str, summary: str | bytes | None, report: str | bytes | None,
               reported: float | None, models: Models) -> NodeFacts:
        """From a ``Store.node_summaries`` row: its summary, else its report validated."""
        if summary is not None:
            return cls(reported, orjson.loads(summary), models)
        parsed = parse_report(node, report)
        return cls(reported, orjson.loads(summarize(parsed)), models, report_rates(parsed))


class Held:
    """One model on the live nodes that hold it (in the store's node order)."""

    __slots__ = ("nodes", "end", "seconds", "done", "largest", "cpu_only")

    def __init__(self, nodes: dict[str, bool], end: float, seconds: float, done: float,
                 largest: float, cpu_only: bool) -> None:
        self.nodes = nodes  # node -> whether the model is resident there
        self.end = end  # when the first of those nodes was last heard from
        #: busy seconds and requests processed, summed over the nodes in order (each
        #: node's ``ModelReport.busy_seconds_per_request``)
        self.seconds, self.done = seconds, done
        self.largest = largest  # its largest reported size
        self.cpu_only = cpu_only  # every node runs it on the CPU


class FleetView:
    """The live nodes (in the store's order) and, per model, what the plan reads, at
    ``now`` with the stored times of leases at most ``lease_lag_s`` behind (0: every
    lease is in the store; see the module docstring). ``nodes``: ``(name, last_seen,
    its NodeFacts)`` in the store's node order, their model indices in ``models``."""

    def __init__(self, nodes: list[tuple[str, float, NodeFacts]], models: Models,
                 now: float = math.inf, lease_lag_s: float = 0.0) -> None:
        self.capacity: dict[str, tuple[float, float]] = {}  # node -> (cores, memory)
        self.peers: dict[str, tuple[str, str | None]] = {}  # node -> (url, grpc)
        self.files: dict[str, set[str]] = {}  # model -> nodes holding or pulling its files
        names, seen, reported, renews, held, rates = [], [], [], [], [], []
        for name, last_seen, facts in nodes:
            names.append(name)
            seen.append(last_seen)
            reported.append(last_seen if facts.reported is None else facts.reported)
            renews.append(facts.renews)
            held.append(facts.held)
            rates.append(facts.rates)
            self.capacity[name] = facts.capacity
            if facts.peer:
                self.peers[name] = facts.peer
            for model in facts.files:
                self.files.setdefault(model, set()).add(name)
        seen_at = np.array(seen, dtype=float)
        heard = np.where(renews, np.maximum(seen_at, np.minimum(now, seen_at + lease_lag_s)),
                         seen_at)  # ``heard_until`` of each node that renews leases
        self.held = _held(names, heard, held, models.names)
        self.tails = _tails(np.array(reported, dtype=float), rates, models.names)

    def __len__(self) -> int:
        return len(self.capacity)


def _grouped(models: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """(the rows' order by model, stable: node order within one; ``(model, start,
    stop)`` of each model's rows in that order)."""
    order = np.argsort(models, kind="stable")
    counts = np.bincount(models)
    stops = np.cumsum(counts)
    return order, [(m, int(stops[m] - counts[m]), int(stops[m]))
                   for m in np.flatnonzero(counts).tolist()]


def _held(names: list[str], heard: np.ndarray, held: list[np.ndarray],
          models: list[str]) -> dict[str, Held]:
    """model -> ``Held``, from each node's ``NodeFacts.held`` (in node order)."""
    rows = np.concatenate(held) if held else np.empty((0, 6))
    node = np.repeat(np.arange(len(held)), [len(h) for h in held])
    index = rows[:, MODEL].astype(np.intp)
    k = len(models)
    end, largest = np.full(k, math.inf), np.full(k, -math.inf)
    np.minimum.at(end, index, heard[node])
    np.maximum.at(largest, index, rows[:, SIZE])
    # bincount adds each row's weight in the rows' order: the sums of the nodes in order
    seconds = np.bincount(index, weights=rows[:, SECONDS], minlength=k)
    done = np.bincount(index, weights=rows[:, DONE], minlength=k)
    gpu = np.bincount(index, weights=1.0 - rows[:, CPU], minlength=k)
    order, groups = _grouped(index)
    holders = [names[i] for i in node[order].tolist()]
    resident = (rows[order, RESIDENT] > 0).tolist()
    return {models[m]: Held(dict(zip(holders[a:b], resident[a:b])), float(end[m]),
                            float(seconds[m]), float(done[m]), float(largest[m]),
                            not gpu[m])
            for m, a, b in groups}


def _tails(reported: np.ndarray, rates: list[np.ndarray], models: list[str]
           ) -> dict[str, np.ndarray]:
    """model -> its ``(reported, rate)`` rows (an array), one per node that gave it a
    rate, in node order."""
    rows = np.concatenate(rates) if rates else np.empty((0, 2))
    since = np.repeat(reported, [len(r) for r in rates])
    order, groups = _grouped(rows[:, 0].astype(np.intp))
    pairs = np.column_stack([since[order], rows[order, 1]])
    return {models[m]: pairs[a:b] for m, a, b in groups}


class FleetReader:
    """The fleet's view for each plan from the facts of its live nodes, each decoded
    once per stored report (``KeptNodes``)."""

    def __init__(self, store: Store) -> None:
        self.models = Models()
        self.kept: KeptNodes[NodeFacts] = KeptNodes(store, self._decode)

    def _decode(self, node: str, summary: str | bytes | None, report: str | bytes | None,
                reported: float | None) -> NodeFacts:
        return NodeFacts.of_row(node, summary, report, reported, self.models)

    def read(self, since: float, now: float, timeout: float, lease_lag_s: float
             ) -> FleetView:
        """The view at ``now`` of the nodes heard from at or after ``since`` and within
        ``timeout`` of ``now``."""
        live = sorted((row for row in self.kept.live(since) if now - row[1] <= timeout),
                      key=itemgetter(0))  # by name: the store's node order
        view = FleetView(live, self.models, now, lease_lag_s)
        if len(self.models.names) > MODELS_KEPT_FACTOR * len(view.held.keys() | view.tails) \
                + MODELS_KEPT_SLACK:  # names no live node reports: forget them all
            self.models = Models()
            self.kept.clear()
        return view


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
