"""Report ingestion that does not grow with the fleet.

* ``Fleet``: what the request path needs, in memory: each node's last report (as sent,
  bytes, and its models with their reported latencies), the current plan (its per-node
  directive rows), the version table (``versions.VersionTable``: which version each
  node serves) and each node's last directives. A report is validated and answered
  from here, without the database, and so is a lease (``agent.coordinator.leases``).
* ``ReportWriter``: reports go to the store in batches on one writer thread (a group
  commit every ``interval_s``), leases with them (each node's newest renewal since the
  last commit: one row update however often it renewed; and only once the ``last_seen``
  it last wrote for the node is ``lease_write_s`` old: a renewal within that is held,
  not written), and old history is pruned every ``prune_every_s`` by an indexed range.
  ``close`` writes what is queued and held, so a report or lease that was answered is
  not lost on a clean stop. While the store fails (PostgreSQL down), the queue is kept and
  retried, and ``healthy`` is False: the coordinator then refuses new reports with 503.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Collection, NamedTuple

import orjson

from agent.coordinator.catalog import CatalogError
from agent.coordinator.leases import (SEND_REPORT, LeaseBook, basis_of, renewed,
                                      with_version)
from agent.coordinator.plan import directives_from_row, row_away
from agent.coordinator.routing import RoutingBook
from agent.coordinator.store import NodeRow, ReportRecord, StoredPlan, StoreUnavailable
from agent.coordinator.summary import summarize
from agent.coordinator.versions import VersionTable
from agent.errors import AgentError
from agent.wire import (Directives, NodeLease, NodeReport, ReportError, latency_at,
                        latency_points, parse_lease, parse_report)

log = logging.getLogger("edgeagent.coordinator.ingest")


#: A report's models as the request path keeps them: (name, its reported latencies as
#: ``wire.latency_points``) pairs.
ReportedModels = tuple[tuple[str, tuple[tuple[float, float], ...]], ...]


def reported_models(report: NodeReport) -> ReportedModels:
    """``report``'s models and their reported latencies, as ``NodeState`` keeps them."""
    return tuple((name, latency_points(m.latency_ms)) for name, m in report.models.items())


#: The figures of a model's routed traffic a report carries, in ``Routed`` order.
ROUTED_COUNTS = ("served", "forwarded", "received", "fallbacks", "errors")


class Routed(NamedTuple):
    """What the request path keeps of a routing node's report: where its peers reach it
    (``(url, grpc)``) and, per model, its routed traffic of the last interval as
    ``(model, served, forwarded, received, fallbacks, errors)``."""

    peer: tuple[str, str | None] | None
    models: tuple[tuple[str, float, float, float, float, float], ...] = ()


def _peer(routing: Routed | None) -> tuple[str, str | None] | None:
    return routing.peer if routing is not None else None


def reported_routing(report: NodeReport) -> Routed | None:
    """``report``'s address and routed traffic (None: the node neither routes nor says
    where it is reached)."""
    if report.peer is None and report.routing is None:
        return None
    models = tuple((m, r.served, r.forwarded, r.received, r.fallbacks, r.errors)
                   for m, r in (report.routing.models if report.routing else {}).items())
    peer = (report.peer.url, report.peer.grpc) if report.peer is not None else None
    return Routed(peer, models)


class NodeState(NamedTuple):
    """A node as the request path knows it: when it was first and last heard from (a
    report or a lease), its last report as sent (bytes), its models with their reported
    latencies, and when that report came (``reported``; None: at ``last_seen``). Few
    objects per node on purpose: 10,000 nodes' parsed reports would be millions of
    objects for the garbage collector to walk on every full collection (seconds of
    stalled event loop); here one object per node for it to walk (its fields: strings,
    bytes, floats and tuples of them, which the collector stops tracking)."""

    name: str
    first_seen: float
    last_seen: float
    raw: bytes
    models: ReportedModels
    routing: Routed | None = None
    reported: float | None = None

    @property
    def row(self) -> NodeRow:
        """The stored row (the report parsed now: by orjson alone, as ``raw`` passed
        validation on its way in; validating it again would cost far more)."""
        return NodeRow(self.name, self.first_seen, self.last_seen, orjson.loads(self.raw),
                       self.report_time)

    @property
    def report_time(self) -> float:
        """When its last report came."""
        return self.last_seen if self.reported is None else self.reported


class Fleet:
    """Nodes and the current plan in memory; read and written on the event loop, read
    (snapshots) by the planner thread. A node's directives under a new plan are made
    at its first report under it, from its row of the plan (``StoredPlan.rows``, made
    in the planning process): adopting a plan of 10,000 nodes is a swap, not work
    holding the GIL that reports need."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.nodes: dict[str, NodeState] = {}
        self.plan: StoredPlan | None = None
        #: counts the changes of where nodes are reached (``addresses``): a node came,
        #: went, or reported another peer address
        self.address_changes = 0
        # node -> (directives, their JSON): the last answer, reused while the plan and
        # what the node holds resident do not change it; (None, JSON) where a report
        # worker answered (``answered``)
        self._answers: dict[str, tuple[Directives | None, bytes]] = {}
        # node -> the models with a source its last answer's plan runs elsewhere (a
        # change in what it holds of them changes its drop list)
        self._away: dict[str, tuple[str, ...]] = {}
        self.versions = VersionTable()
        #: node -> (the table's id, the models it pinned) of its last answer
        self._versions_of: dict[str, tuple[int, frozenset[str]]] = {}
        #: the routing table routing nodes get (``agent.coordinator.routing``)
        self.routing = RoutingBook()
        #: the nodes' bases and answer versions, for their leases
        self.leases = LeaseBook()
        # node -> (basis, plan id, version table, last answer, routing version: what its
        # last lease's answer came from; the answer's version): a lease from the same
        # is answered from it (a plan's id, not the plan: a silent node's entry would
        # keep an old plan alive)
        self._renewals: dict[str, tuple] = {}

    def load(self, rows: list[NodeRow], plan: StoredPlan | None) -> None:
        """Start from the store's nodes and plan: each report kept as bytes, its models
        and latencies read once here."""
        self.nodes = {}
        self.address_changes += 1
        for row in rows:
            raw = orjson.dumps(row.report)
            self.nodes[row.name] = NodeState(row.name, row.first_seen, row.last_seen, raw,
                                             *_stored_models(row, raw), row.reported)
        if plan is not None:
            plan.rows  # noqa: B018 - made now, not at the first report
        self.adopt(plan)

    def adopt(self, plan: StoredPlan | None) -> None:
        """Make ``plan`` current unless a newer one is."""
        if plan is None or (self.plan is not None and plan.id <= self.plan.id):
            return
        self.plan = plan

    def set_versions(self, table: VersionTable) -> None:
        """Answer with ``table``'s versions from now on (unless a newer one is used)."""
        if table.id >= self.versions.id:
            self.versions = table

    def directives(self, node: str, resident: set[str],
                   held: set[str] = frozenset()) -> Directives:  # type: ignore[assignment]
        """``node``'s directives under the current plan (empty without one) and the
        version table; ``held``: the models it reported holding (``NodeReport.held``)."""
        plan = self.plan
        if plan is None:
            return self.versions.overlay(Directives(node=node, ttl_s=self.ttl_s), held)
        return self.versions.overlay(directives_from_row(
            plan.rows.get(node), node, resident, self.ttl_s, plan.id, held), held)

    def issued(self, node: str, now: float) -> tuple[Directives | None, float | None]:
        """(``node``'s directives, when they lapse): those of its last answer, issued
        when it last reported; (None, expiry) once lapsed, (None, None) if none."""
        state, last = self.nodes.get(node), self._answers.get(node)
        if state is None or last is None:
            return None, None
        directives = last[0] or Directives.from_json(last[1])  # a worker's answer
        expires = state.last_seen + directives.ttl_s
        return (directives if now < expires else None), expires

    def answer(self, node: str, report: NodeReport) -> tuple[Directives, bytes]:
        """``node``'s directives for ``report`` and their JSON (the same objects as
        the last answer when neither the plan, the prefetch list nor the drop list
        changed), with the routing table's version, and the table itself where the
        report names another (``RoutingBook.splice``); for a report with a
        ``report_id``, the answer's version too, and its basis noted for its leases."""
        basis = basis_of(report)
        self.leases.note(node, basis)
        directives, body = self._directives_answer(
            node, {m for m, r in report.models.items() if r.resident}, report.held)
        if basis is not None:
            body = self._versioned(node, body, basis.routes)
        routing = report.routing
        return directives, self.routing.splice(body, routing is not None,
                                               routing.version if routing else None)

    def answer_lease(self, node: str, lease: NodeLease) -> tuple[bytes, bool]:
        """(The answer to ``node``'s ``lease``, whether it carries new directives):
        ``{"answer": V}`` while the answer it holds stands, the new one where it
        changed, ``SEND_REPORT`` where this process does not hold the report the lease
        names (``agent.coordinator.leases``)."""
        basis = self.leases.basis(node, lease.report) if lease.report is not None else None
        if basis is None:
            return SEND_REPORT, False
        routing = self.routing.version if basis.routes else None
        last = self._answers.get(node)
        memo = self._renewals.get(node)
        plan_id = self.plan.id if self.plan is not None else None
        if memo is not None and memo[0] is basis and memo[1] == plan_id \
                and memo[2] is self.versions and memo[3] is last and memo[4] == routing:
            body, version = last[1], memo[5]  # (what the two calls below would give)
        else:
            last = self._directives_answer(node, basis.resident, lambda: basis.held)
            body = last[1]
            version = self.leases.version(node, body, routing)
            self._renewals[node] = (basis, plan_id, self.versions, last, routing, version)
        if lease.answer == version:
            return renewed(version), False
        return self.routing.splice(with_version(body, version), basis.routes,
                                   lease.routing), True

    def _versioned(self, node: str, body: bytes, routes: bool) -> bytes:
        return with_version(body, self.leases.version(
            node, body, self.routing.version if routes else None))

    def _directives_answer(self, node: str, resident: Collection[str],
                           held: Callable[[], Collection[str]]) -> tuple[Directives, bytes]:
        """``resident``: the models the node has resident; ``held()``: those it holds
        (``NodeReport.held``; asked only where the plan moves one away)."""
        plan_id = self.plan.id if self.plan is not None else None
        last = self._answers.get(node)
        away = self._away.get(node, ())
        holds = held() if away or self.versions.models else frozenset()
        versions = (self.versions.id, self.versions.pinned(holds))
        if last is not None and last[0] is not None and last[0].plan_id == plan_id \
                and self._versions_of.get(node) == versions \
                and last[0].prefetch == tuple(m for m in last[0].pin if m not in resident) \
                and last[0].drop == tuple(m for m in away if m in holds):
            return last
        directives = self.directives(node, set(resident), set(held()))
        self._away[node] = row_away(self.plan.rows.get(node) if self.plan else None)
        self._versions_of[node] = versions
        self._answers[node] = last = (directives, orjson.dumps(directives.to_json()))
        return last

    def record(self, node: str, raw: bytes, models: ReportedModels, now: float,
               routing: Routed | None = None) -> bool:
        """``node`` sent ``raw`` (a validated report of ``models``, and ``routing``) at
        ``now``; a report older than the one held (handed over late by another report
        worker) is ignored: whether it was recorded."""
        old = self.nodes.get(node)
        if old is not None and now < old.report_time:
            return False
        first = old.first_seen if old is not None else now
        seen = now if old is None else max(now, old.last_seen)  # a lease may be newer
        self.nodes[node] = NodeState(node, first, seen, raw, models, routing, now)
        if old is None or _peer(old.routing) != _peer(routing):
            self.address_changes += 1
        return True

    def renew(self, node: str, now: float) -> bool:
        """``node`` renewed its lease at ``now`` (never moving ``last_seen`` back);
        whether the node is known here."""
        old = self.nodes.get(node)
        if old is None:
            return False
        if now > old.last_seen:
            self.nodes[node] = old._replace(last_seen=now, reported=old.report_time)
        return True

    def answered(self, node: str, body: bytes) -> None:
        """A report worker answered ``node`` with ``body`` (directives' JSON)."""
        self._answers[node] = (None, body)

    def forget(self, node: str) -> bool:
        self._answers.pop(node, None)
        self._away.pop(node, None)
        self._versions_of.pop(node, None)
        self._renewals.pop(node, None)
        self.leases.forget(node)
        self.address_changes += 1
        return self.nodes.pop(node, None) is not None

    def by_model(self, since: float, percentiles: dict[str, float] | None = None
                 ) -> tuple[dict[str, list[str]], dict[str, float]]:
        """(model -> the nodes, by name, heard from at or after ``since`` that report
        it; model of ``percentiles`` (model -> its SLO's percentile) -> the worst
        latency (ms) at that percentile (``wire.latency_at``) one of them reported):
        one pass over the fleet and the latencies kept per node, not one per model nor
        their reports parsed again."""
        percentiles = percentiles or {}
        on: dict[str, list[str]] = {}
        worst: dict[str, float] = {}
        for state in sorted(list(self.nodes.values()), key=lambda s: s.name):
            if state.last_seen < since:
                continue
            for model, points in state.models:
                on.setdefault(model, []).append(state.name)
                percentile = percentiles.get(model)
                value = latency_at(points, percentile) if percentile is not None else None
                if value is not None and value > worst.get(model, -1.0):
                    worst[model] = value
        return on, worst

    def routed_by_model(self, since: float) -> dict[str, dict[str, dict[str, float]]]:
        """model -> node -> its routed traffic of the last interval (``served``,
        ``forwarded``, ``received``, ``fallbacks``, ``errors``), for the nodes heard from
        at or after ``since``: which node served how much of each model."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for state in self.nodes.values():
            if state.last_seen < since or state.routing is None:
                continue
            for model, *counts in state.routing.models:
                out.setdefault(model, {})[state.name] = dict(zip(ROUTED_COUNTS, counts))
        return {m: dict(sorted(nodes.items())) for m, nodes in sorted(out.items())}

    def addresses(self, since: float) -> dict[str, tuple[str, str | None]]:
        """node -> where its peers reach it, for the nodes heard from at or after
        ``since`` that said so."""
        return {s.name: s.routing.peer for s in self.nodes.values()
                if s.last_seen >= since and s.routing is not None
                and s.routing.peer is not None}

    def rows(self, after: str = "", limit: int | None = None) -> list[NodeRow]:
        """The rows of the nodes named after ``after``, by name: ``limit`` of them, or
        every one (None)."""
        names = sorted(name for name in self.nodes if name > after)
        return [self.nodes[name].row for name in names[:limit]]


def _stored_models(row: NodeRow, raw: bytes) -> tuple[ReportedModels, Routed | None]:
    """A stored report's models and routing (``raw``: the report as JSON; one the wire
    schema no longer takes: no latencies, no routing)."""
    try:
        report = parse_report(row.name, raw)
    except ReportError:
        return tuple((name, ()) for name in row.report.get("models") or {}), None
    return reported_models(report), reported_routing(report)


def parse_lease_body(name: str, raw: bytes) -> NodeLease:
    """``raw`` validated as ``name``'s lease; errors as ``parse_report_body``'s."""
    try:
        return parse_lease(name, raw)
    except ReportError as exc:
        raise ReportError(None, f"lease from {name!r}: {exc}") from None
    except ValueError as exc:
        raise CatalogError(f"body is not valid JSON: {exc}") from None


def parse_report_body(name: str, raw: bytes) -> NodeReport:
    """``raw`` validated as ``name``'s report (``wire.parse_report``: decoded straight
    from the bytes); the errors say whose report it was, or that it is not JSON."""
    try:
        return parse_report(name, raw)
    except ReportError as exc:
        raise ReportError(None, f"report from {name!r}: {exc}") from None
    except ValueError as exc:  # not JSON, nested too deep, an integer past the limit
        raise CatalogError(f"body is not valid JSON: {exc}") from None


class TooManyNodes(AgentError):
    """A report from a new node while the coordinator keeps ``max_nodes`` already: 507
    (the nodes it knows report as before)."""

    status = 507


def refuse_new_node_past(known: bool, count: int, max_nodes: int, node: str) -> None:
    """``TooManyNodes`` when ``node`` is new (not ``known``) and ``count`` nodes are
    kept already."""
    if not known and count >= max_nodes:
        raise TooManyNodes(f"node {node!r} is new and the coordinator keeps {count} nodes "
                           f"already (max_nodes {max_nodes}): delete a node or raise "
                           "max_nodes")


def refuse_while_store_fails(healthy: bool) -> None:
    """``StoreUnavailable`` (503 + ``Retry-After``) unless the store takes writes: a
    report is answered only when what it says can be written. The answer says only
    that the store is failing: the writer logs its error (``ReportWriter._run``)."""
    if not healthy:
        raise StoreUnavailable("the store is failing; keep serving and report again later")


def report_record(node: str, raw: bytes, report: NodeReport, now: float) -> ReportRecord:
    """What the store keeps of ``report`` (sent as ``raw``), arrived at ``now``: its
    arrival points in coordinator time (their JSON: the record is one object for the
    garbage collector to walk while it waits for the group commit, not dozens of
    containers per report) and its summary."""
    arrivals = {m: [(now - a.age_s, a.seconds, a.count) for a in r.arrivals]
                for m, r in report.models.items() if r.arrivals}
    for m, r in (report.routing.models if report.routing else {}).items():
        if r.arrivals:  # a model the node forwards and its repository lacks
            arrivals.setdefault(m, []).extend((now - a.age_s, a.seconds, a.count)
                                              for a in r.arrivals)
    return ReportRecord(node, raw, orjson.dumps(arrivals), now, summarize(report))


class ReportWriter:
    """Batches reports into the store on its own thread (see the module docstring)."""

    def __init__(self, store: Any, *, keep_s: float, interval_s: float = 0.5,
                 prune_every_s: float = 30.0, lease_write_s: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.keep_s, self.interval_s = store, keep_s, interval_s
        self.prune_every_s, self.lease_write_s, self.clock = prune_every_s, lease_write_s, clock
        self._queue: list[ReportRecord] = []
        self._renewed: dict[str, float] = {}  # node -> its newest lease to write
        self._held: dict[str, float] = {}  # node -> its newest lease within lease_write_s
        self._seen: dict[str, float] = {}  # node -> the last_seen last queued for the store
        self._queue_lock = threading.Lock()
        self._write_lock = threading.Lock()  # one batch at a time, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned_at = -float("inf")
        self.written = 0
        self.batches = 0
        self.healthy = True
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
        self._thread.start()

    def submit(self, record: ReportRecord) -> None:
        """Queue one report (never touches the database)."""
        with self._queue_lock:
            self._queue.append(record)
            if self._seen.get(record.node, -1.0) < record.now:
                self._seen[record.node] = record.now

    def renew(self, node: str, now: float) -> None:
        """Queue ``node``'s lease renewed at ``now`` (a newer one replaces it) where
        the ``last_seen`` last queued for it is ``lease_write_s`` older; else hold it
        (written by ``close``, or with a later renewal past the bound)."""
        with self._queue_lock:
            seen = self._seen.get(node)
            if seen is not None and now - seen < self.lease_write_s:
                if self._held.get(node, -1.0) < now:
                    self._held[node] = now
                return
            self._seen[node] = now
            self._held.pop(node, None)
            if self._renewed.get(node, -1.0) < now:
                self._renewed[node] = now

    def queued(self) -> int:
        return len(self._queue)

    def forget(self, node: str) -> None:
        """Drop ``node``'s queued reports and lease (it was deleted)."""
        with self._queue_lock:
            self._queue = [r for r in self._queue if r.node != node]
            for queued in (self._renewed, self._held, self._seen):
                queued.pop(node, None)

    def flush(self) -> int:
        """Write everything queued now (any thread); the number written. On a store
        error the batch goes back to the head of the queue and the error is raised."""
        with self._write_lock:
            with self._queue_lock:
                batch, self._queue = self._queue, []
                renewed, self._renewed = self._renewed, {}
            if not batch and not renewed:
                return 0
            try:
                self.store.write_reports(batch, renewed)
            except BaseException as exc:
                with self._queue_lock:
                    self._queue[:0] = batch
                    for node, t in renewed.items():
                        if self._renewed.get(node, -1.0) < t:
                            self._renewed[node] = t
                self.healthy, self.last_error = False, f"{type(exc).__name__}: {exc}"
                raise
            self.healthy, self.last_error = True, None
            self.written += len(batch)
            self.batches += 1
            return len(batch)

    def prune(self) -> None:
        now = self.clock()
        if now - self._pruned_at >= self.prune_every_s:
            self._pruned_at = now
            self.store.prune(now - self.keep_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
                self.prune()
            except Exception as exc:  # noqa: BLE001 - the store is down: keep, retry
                log.warning("writing reports failed (%d queued, retrying): %s",
                            self.queued(), exc)

    def close(self) -> None:
        """Stop the thread and write what is queued and held (best effort when the
        store is down: the error is logged)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._queue_lock:
            held, self._held = self._held, {}
            for node, t in held.items():
                if self._renewed.get(node, -1.0) < t:
                    self._renewed[node] = t
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001
            log.error("%d reports could not be written on stop: %s", self.queued(), exc)
