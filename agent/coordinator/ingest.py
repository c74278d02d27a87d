"""Report ingestion that does not grow with the fleet.

* ``Fleet``: what the request path needs, in memory: each node's last report (as sent,
  bytes, and its model names) and the current plan with every node's directives
  precomputed when the plan is adopted (``digest``: off the event loop). A report is
  validated and answered from here, without the database.
* ``ReportWriter``: reports go to the store in batches on one writer thread (a group
  commit every ``interval_s``), and old history is pruned every ``prune_every_s`` by an
  indexed range. ``close`` writes what is queued, so a report that was answered is not
  lost on a clean stop. While the store fails (PostgreSQL down), the queue is kept and
  retried, and ``healthy`` is False: the coordinator then refuses new reports with 503.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, NamedTuple

import orjson

from agent.coordinator.plan import Plan
from agent.coordinator.store import NodeRow, ReportRecord, StoredPlan
from agent.validation import load_json
from agent.wire import Directives, NodeReport

log = logging.getLogger("edgeagent.coordinator.ingest")


class NodeState(NamedTuple):
    """A node as the request path knows it: when it was first and last heard from, its
    last report as sent (bytes) and the names of the models in it. Few objects per node
    on purpose: 10,000 nodes' parsed reports would be millions of objects for the
    garbage collector to walk on every full collection (seconds of stalled event loop);
    and a tuple of strings, bytes and floats, which the collector stops tracking at its
    first pass (a new one per report must not count towards full collections)."""

    name: str
    first_seen: float
    last_seen: float
    raw: bytes
    models: tuple[str, ...]

    @property
    def row(self) -> NodeRow:
        """The stored row (the report parsed now)."""
        return NodeRow(self.name, self.first_seen, self.last_seen, load_json(self.raw))


class Fleet:
    """Nodes and the current plan in memory; read and written on the event loop, read
    (snapshots) by the planner thread."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.nodes: dict[str, NodeState] = {}
        self.plan: StoredPlan | None = None
        self._rows: dict[str, tuple[dict[str, int], tuple[str, ...], dict[str, float]]] = {}
        self._digested: tuple[StoredPlan | None, dict] = (None, {})
        # node -> (plan id, prefetch, directives, their JSON): the last answer, reused
        # while the plan and what the node holds resident do not change it
        self._answers: dict[str, tuple[int | None, tuple[str, ...], Directives, bytes]] = {}

    def load(self, rows: list[NodeRow], plan: StoredPlan | None) -> None:
        """Start from the store's nodes and plan (their reports are parsed lazily)."""
        self.nodes = {row.name: NodeState(row.name, row.first_seen, row.last_seen,
                                          orjson.dumps(row.report),
                                          tuple((row.report.get("models") or {})))
                      for row in rows}
        self.adopt(plan)

    def digest(self, plan: StoredPlan) -> None:
        """Precompute every node's row of ``plan`` (any thread: a plan of 10,000 nodes
        takes a while; ``adopt`` then only swaps it in on the event loop)."""
        parsed: Plan = plan.parsed
        rows = {}
        for node, assigned in parsed.assignment.items():
            workers = {m: int(n) for m, n in assigned.items() if n > 0}
            drops = {m: float(parsed.models[m].drop_rate or 0.0)
                     for m in workers if m in parsed.models}
            rows[node] = (workers, tuple(sorted(workers)),
                          {m: r for m, r in drops.items() if r > 0})
        self._digested = (plan, rows)

    def adopt(self, plan: StoredPlan | None) -> None:
        """Make ``plan`` current unless a newer one is (its rows from ``digest``,
        computed now when it was not digested)."""
        if plan is None or (self.plan is not None and plan.id <= self.plan.id):
            return
        digested, rows = self._digested
        if digested is None or digested.id != plan.id:
            self.digest(plan)
            digested, rows = self._digested
        self._rows, self.plan = rows, digested
        self._digested = (None, {})

    def directives(self, node: str, resident: set[str]) -> Directives:
        """``node``'s directives under the current plan (empty without one)."""
        plan_id = self.plan.id if self.plan is not None else None
        row = self._rows.get(node)
        if row is None:
            return Directives(node=node, ttl_s=self.ttl_s, plan_id=plan_id)
        workers, pin, drops = row
        return Directives(node=node, ttl_s=self.ttl_s, plan_id=plan_id, workers=workers,
                          pin=pin, prefetch=tuple(m for m in pin if m not in resident),
                          drop_rate=drops)

    def issued(self, node: str, now: float) -> tuple[Directives | None, float | None]:
        """(``node``'s directives, when they lapse): those of its last answer, issued
        when it last reported; (None, expiry) once lapsed, (None, None) if none."""
        state, last = self.nodes.get(node), self._answers.get(node)
        if state is None or last is None:
            return None, None
        expires = state.last_seen + last[2].ttl_s
        return (last[2] if now < expires else None), expires

    def answer(self, node: str, report: NodeReport) -> tuple[Directives, bytes]:
        """``node``'s directives for ``report`` and their JSON (the same objects as
        the last answer when neither the plan nor the prefetch list changed)."""
        plan_id = self.plan.id if self.plan is not None else None
        row = self._rows.get(node)
        models = report.models
        prefetch = () if row is None else tuple(
            m for m in row[1] if m not in models or not models[m].resident)
        last = self._answers.get(node)
        if last is not None and last[0] == plan_id and last[1] == prefetch:
            return last[2], last[3]
        directives = self.directives(node, {m for m, r in models.items() if r.resident})
        body = orjson.dumps(directives.to_json())
        self._answers[node] = (plan_id, prefetch, directives, body)
        return directives, body

    def record(self, node: str, raw: bytes, report: NodeReport, now: float) -> None:
        """``node`` sent ``raw`` (validated as ``report``) at ``now``."""
        old = self.nodes.get(node)
        first = old.first_seen if old is not None else now
        self.nodes[node] = NodeState(node, first, now, raw, tuple(report.models))

    def forget(self, node: str) -> bool:
        self._answers.pop(node, None)
        return self.nodes.pop(node, None) is not None

    def rows(self) -> list[NodeRow]:
        """Every node's row, by name."""
        return [s.row for s in sorted(list(self.nodes.values()), key=lambda s: s.name)]


class ReportWriter:
    """Batches reports into the store on its own thread (see the module docstring)."""

    def __init__(self, store: Any, *, keep_s: float, interval_s: float = 0.5,
                 prune_every_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.store, self.keep_s, self.interval_s = store, keep_s, interval_s
        self.prune_every_s, self.clock = prune_every_s, clock
        self._queue: list[ReportRecord] = []
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

    def queued(self) -> int:
        return len(self._queue)

    def forget(self, node: str) -> None:
        """Drop ``node``'s queued reports (it was deleted)."""
        with self._queue_lock:
            self._queue = [r for r in self._queue if r.node != node]

    def flush(self) -> int:
        """Write everything queued now (any thread); the number written. On a store
        error the batch goes back to the head of the queue and the error is raised."""
        with self._write_lock:
            with self._queue_lock:
                batch, self._queue = self._queue, []
            if not batch:
                return 0
            try:
                self.store.write_reports(batch)
            except BaseException as exc:
                with self._queue_lock:
                    self._queue[:0] = batch
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
        """Stop the thread and write what is queued (best effort when the store is
        down: the error is logged)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001
            log.error("%d reports could not be written on stop: %s", self.queued(), exc)
