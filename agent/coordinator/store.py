"""The coordinator's state in SQLite (WAL): nodes and their last report, a bounded
arrival-rate history, the model catalog and the plans made.

The arrival history is kept per model in bins of ``rate_step_s`` seconds aligned to
multiples of the step (``rate_bins``): a node's ``(t_end, seconds, count)`` point is
spread over the bins it overlaps in proportion to the overlap and added to the fleet's
sum, so planning reads one row per model and bin whatever the fleet's size. Reports are
written in batches (``write_reports``: one transaction for many reports); old bins are
pruned by ``prune`` (an indexed range), which the caller runs periodically.

A node's row holds its last report and summary, when that report came (``reported``)
and when the node was last heard from (``last_seen``: a report or a lease, which
``write_reports`` moves on without touching the report).

Schema changes are migrations by version (``PRAGMA user_version``): ``MIGRATIONS[i]``
takes a database from version i to i + 1, each in one transaction, so an old state
directory is upgraded in place on start. Times are the coordinator's wall clock,
passed in by the caller (``now``), never read here.

``PostgresStore`` (``agent.coordinator.stores``, which also holds ``open_store``: the
store a config names) is the same store on PostgreSQL for several coordinators sharing
one database.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import orjson

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.plan import Plan, directive_rows
from agent.coordinator.ratebins import spread
from agent.coordinator.rolloutstore import RolloutRecords
from agent.errors import AgentError

log = logging.getLogger("edgeagent.coordinator.store")


class StoreUnavailable(AgentError):
    """The database does not answer (PostgreSQL down): 503, try again shortly. Its
    message (the database's host, user, name) goes to the log; the answer says only
    that the store is failing."""

    status = 503
    retry_after = 5.0
    public = "the store is failing (its error is in the coordinator's log); try again later"

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL,
        report TEXT NOT NULL            -- the last report body, JSON
    );
    CREATE TABLE rates (                -- arrivals: count requests in (t_end - seconds, t_end]
        node TEXT NOT NULL,
        model TEXT NOT NULL,
        t_end REAL NOT NULL,
        seconds REAL NOT NULL,
        count REAL NOT NULL
    );
    CREATE INDEX rates_by_model ON rates (model, t_end);
    CREATE INDEX rates_by_time ON rates (t_end);
    CREATE TABLE models (
        name TEXT PRIMARY KEY,
        slo_ms REAL NOT NULL,
        percentile REAL NOT NULL,
        priority REAL NOT NULL,
        cpu_per_replica REAL NOT NULL,
        memory_per_replica_bytes REAL NOT NULL,
        proc_ms REAL,
        updated REAL NOT NULL
    );
    CREATE TABLE plans (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created REAL NOT NULL,
        kind TEXT NOT NULL,             -- long-term, reactive or manual
        plan TEXT NOT NULL              -- JSON, see plan.Plan
    );
    """,
    # 2: the raw per-node points become per-model bins (the history restarts).
    """
    DROP TABLE rates;
    CREATE TABLE rate_bins (            -- arrivals summed over nodes: count in [t, t + step)
        model TEXT NOT NULL,
        step REAL NOT NULL,
        t REAL NOT NULL,
        count REAL NOT NULL,
        PRIMARY KEY (model, step, t)
    );
    CREATE INDEX rate_bins_by_time ON rate_bins (t);
    """,
    # 3: each node's summary beside its report (summary.py: what the planner reads).
    """
    ALTER TABLE nodes ADD COLUMN summary TEXT;
    CREATE INDEX nodes_by_last_seen ON nodes (last_seen);
    """,
    # 4: node identity: each node's own report token and one-time join tokens, by hash.
    """
    CREATE TABLE node_credentials (
        node TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL,           -- of the node's token (agent.security.credentials)
        created REAL NOT NULL
    );
    CREATE TABLE join_tokens (
        sha256 TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        not_after REAL NOT NULL
    );
    """,
    # 5: where a catalogued model comes from (catalog.py: nodes pull it from there).
    """
    ALTER TABLE models ADD COLUMN source TEXT;
    ALTER TABLE models ADD COLUMN source_options TEXT;  -- JSON object
    ALTER TABLE models ADD COLUMN version INTEGER;
    ALTER TABLE models ADD COLUMN digest TEXT;
    ALTER TABLE models ADD COLUMN config TEXT;          -- JSON object: config.yaml keys
    """,
    # 6: revoked node certificates: those naming a node, issued (notBefore) up to a time.
    """
    CREATE TABLE revoked_certificates (
        node TEXT PRIMARY KEY,
        issued_before REAL NOT NULL     -- a certificate issued at or before it is refused
    );
    """,
    # 7: leases: last_seen moves with a node's leases, reported with its full reports.
    """
    ALTER TABLE nodes ADD COLUMN reported REAL;
    UPDATE nodes SET reported = last_seen;
    """,
    # 8: rollouts (rollout.py: a version moved in waves) and the versions they marked bad.
    """
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        model TEXT NOT NULL,
        state TEXT NOT NULL,            -- running, paused, completed, rolled_back, aborted
        doc TEXT NOT NULL,              -- JSON, rollout.Rollout.to_json
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE INDEX rollouts_by_model ON rollouts (model, id);
    CREATE UNIQUE INDEX rollouts_one_active ON rollouts (model)
        WHERE state IN ('running', 'paused');
    CREATE TABLE bad_versions (
        model TEXT NOT NULL,
        version INTEGER NOT NULL,
        digest TEXT,
        reason TEXT NOT NULL,
        rollout INTEGER,                -- the rollout that rolled it back
        marked REAL NOT NULL,
        PRIMARY KEY (model, version)
    );
    ALTER TABLE models ADD COLUMN rollout TEXT;         -- JSON: the entry's rollout settings
    """,
    # 9: the reactive check's marks (Store.live_marks) from the index alone.
    """
    DROP INDEX nodes_by_last_seen;
    CREATE INDEX nodes_marks ON nodes (last_seen, reported, name);
    """,
)

PLANS_KEPT = 100
#: A lease renewed: ``last_seen`` moves on, never back (``(when, node, when)``).
_RENEW = "UPDATE nodes SET last_seen = ? WHERE name = ? AND last_seen < ?"


class ReportRecord(NamedTuple):
    """One report to write: the node, its body (JSON-able, or the JSON as received),
    its arrival points ``(t_end, seconds, count)`` by model in coordinator time (or
    their JSON, as the ``ReportWriter`` queues them), when it arrived, and its
    ``summary.summarize`` (None: the planner validates the body instead)."""

    node: str
    report: dict[str, Any] | bytes
    arrivals: dict[str, Iterable[tuple[float, float, float]]] | bytes
    now: float
    summary: bytes | None = None


def _json_text(doc: Any) -> str:
    if isinstance(doc, bytes):
        return doc.decode()
    return doc if isinstance(doc, str) else json.dumps(doc)


def _json_or_none(doc: dict[str, Any] | None) -> str | None:
    return None if doc is None else orjson.dumps(doc).decode()


def _object(text: str | None) -> dict[str, Any] | None:
    return None if text is None else orjson.loads(text)


def plan_text(plan: dict[str, Any]) -> str:
    """A plan's JSON text: orjson (a 10,000-node plan is megabytes), json where a number
    is not finite (orjson would write null, json writes Infinity and reads it back)."""
    if all(isinstance(v, str) or v is None or math.isfinite(v)
           for m in (plan.get("models") or {}).values() for v in m.values()
           if not isinstance(v, dict)) \
            and all(v is None or isinstance(v, str) or math.isfinite(v)
                    for v in plan.values() if isinstance(v, (int, float, str))):
        return orjson.dumps(plan).decode()
    return json.dumps(plan)


def plan_from_text(text: str | bytes) -> dict[str, Any]:
    """The plan ``plan_text`` wrote."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # Infinity, NaN (json.dumps writes them)
        return json.loads(text)


@dataclass(frozen=True)
class NodeRow:
    name: str
    first_seen: float
    last_seen: float
    report: dict[str, Any]
    reported: float | None = None  # when the report came (None: at last_seen)


class StoredPlan:
    """A plan as stored, by id. Its forms, each made from another when first read:
    ``plan`` its JSON form (what the API shows), ``text`` that as JSON text,
    ``parsed`` the typed ``Plan``, ``rows`` each node's directive row
    (``plan.directive_rows``). A plan of 10,000 nodes reaches the coordinator as text
    and rows (made in the planning process) and its report workers as rows alone: it
    is parsed only where a request needs it, not on the way."""

    def __init__(self, id: int, created: float, kind: str,
                 plan: dict[str, Any] | None = None, *, text: str | bytes | None = None,
                 rows: dict[str, bytes] | None = None) -> None:
        if plan is None and text is None and rows is None:
            raise ValueError("a stored plan needs its JSON form, its text or its rows")
        self.id, self.created, self.kind = id, created, kind
        for name, value in (("plan", plan), ("text", text), ("rows", rows)):
            if value is not None:
                self.__dict__[name] = value  # what the cached properties would make

    def __repr__(self) -> str:
        return f"StoredPlan(id={self.id}, kind={self.kind!r}, created={self.created})"

    @cached_property
    def plan(self) -> dict[str, Any]:
        return plan_from_text(self.text)

    @cached_property
    def text(self) -> str | bytes:
        return plan_text(self.plan)

    @cached_property
    def parsed(self) -> Plan:
        return Plan.from_json(self.plan)

    @cached_property
    def rows(self) -> dict[str, bytes]:
        return directive_rows(self.plan)


class Store(RolloutRecords):
    """One SQLite database; safe to share between threads (one connection, a lock).
    ``rate_step_s``: the width of the arrival-history bins (the planner's step; a new
    step starts a new series)."""

    def __init__(self, path: str | Path, *, rate_step_s: float = 10.0) -> None:
        self.path = Path(path)
        self.rate_step_s = float(rate_step_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self.migrate()

    # -- plumbing --------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        """Apply the migrations this database has not seen, each atomically."""
        with self._lock:
            current = self.version
            if current > len(MIGRATIONS):
                raise RuntimeError(f"{self.path} has schema version {current}, newer than "
                                   f"this coordinator's {len(MIGRATIONS)}")
            for version in range(current, len(MIGRATIONS)):
                script = (f"BEGIN;\n{MIGRATIONS[version]}\n"
                          f"PRAGMA user_version = {version + 1};\nCOMMIT;")
                try:
                    self._db.executescript(script)
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise

    def _tx(self) -> "_Transaction":
        return _Transaction(self._db, self._lock)

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def leadership(self) -> "Leadership":
        """Who plans: one SQLite file has one coordinator, which always does."""
        return Leadership()

    # -- nodes and reports ----------------------------------------------------------
    def write_reports(self, records: Iterable[ReportRecord],
                      renewed: dict[str, float] | None = None) -> int:
        """Write many reports in one transaction: each node's latest report (by the time
        it was answered: batches of two report workers may come out of order, and an
        older report never replaces a newer one, queued or stored), every arrival
        point added to the model's bins, and the leases ``renewed`` (node -> when:
        ``last_seen`` moved on, never back, the report left as it is). The number of
        reports written."""
        records = list(records)
        renewals = [(t, node, t) for node, t in sorted((renewed or {}).items())]
        if not records:
            if renewals:
                with self._tx() as db:
                    db.executemany(_RENEW, renewals)
            return 0
        latest: dict[str, ReportRecord] = {}
        bins: dict[str, dict[float, float]] = {}
        for rec in records:
            if rec.node not in latest or rec.now >= latest[rec.node].now:
                latest[rec.node] = rec
            arrivals = orjson.loads(rec.arrivals) if isinstance(rec.arrivals, bytes) \
                else rec.arrivals  # their JSON, decoded one record at a time
            for model, points in arrivals.items():
                spread(points, self.rate_step_s, bins.setdefault(model, {}))
        first = {}
        for rec in records:
            first.setdefault(rec.node, rec.now)
        with self._tx() as db:
            db.executemany("INSERT INTO nodes (name, first_seen, last_seen, report, summary, "
                           "reported) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE "
                           "SET report = excluded.report, summary = excluded.summary, "
                           "reported = excluded.reported, last_seen = CASE WHEN "
                           "excluded.last_seen > nodes.last_seen THEN excluded.last_seen "
                           "ELSE nodes.last_seen END WHERE excluded.reported >= "
                           "COALESCE(nodes.reported, nodes.last_seen)",
                           [(r.node, first[r.node], r.now, _json_text(r.report),
                             None if r.summary is None else r.summary.decode(), r.now)
                            for r in sorted(latest.values(), key=lambda r: r.node)])
            db.executemany("INSERT INTO rate_bins (model, step, t, count) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT(model, step, t) DO UPDATE SET "
                           "count = rate_bins.count + excluded.count",
                           sorted((model, self.rate_step_s, t, c)  # one lock order for
                                  for model, row in bins.items()  # concurrent writers
                                  for t, c in row.items()))
            db.executemany(_RENEW, renewals)
        return len(records)

    def record_report(self, node: str, report: dict[str, Any],
                      arrivals: dict[str, list[tuple[float, float, float]]], now: float,
                      keep_s: float) -> None:
        """Write one report now and prune the history to ``keep_s`` seconds (tests and
        tools; the coordinator batches with ``write_reports`` and prunes periodically)."""
        self.write_reports([ReportRecord(node, report, arrivals, now)])
        self.prune(now - keep_s)

    def prune(self, before: float) -> int:
        """Forget history bins that end before ``before``; how many."""
        with self._tx() as db:
            return db.execute("DELETE FROM rate_bins WHERE t < ?",
                              (before - self.rate_step_s,)).rowcount

    def nodes(self) -> list[NodeRow]:
        return [NodeRow(n, f, s, orjson.loads(r), t) for n, f, s, r, t in self._query(
            "SELECT name, first_seen, last_seen, report, reported FROM nodes ORDER BY name")]

    def live_nodes(self, since: float
                   ) -> list[tuple[str, float, str | None, str | None, float | None]]:
        """``(name, last_seen, summary, report, reported)`` of the nodes heard from at
        or after ``since``, by name; ``report`` (JSON text) only where there is no
        summary; ``reported``: when the report came."""
        return self._query("SELECT name, last_seen, summary, CASE WHEN summary IS NULL "
                           "THEN report END, reported FROM nodes WHERE last_seen >= ? "
                           "ORDER BY name", (since,))

    def live_marks(self, since: float) -> list[tuple[str, float, float | None]]:
        """``(name, last_seen, reported)`` of the nodes heard from at or after ``since``
        (``live_nodes`` without their summaries and reports)."""
        return self._query("SELECT name, last_seen, reported FROM nodes WHERE last_seen >= ?",
                           (since,))

    def node_summaries(self, names: Iterable[str]
                       ) -> list[tuple[str, str | None, str | None, float | None]]:
        """``(name, summary, report, reported)`` of the named nodes the store holds, as
        ``live_nodes`` gives them (``report`` only where there is no summary)."""
        return self._named("name, summary, CASE WHEN summary IS NULL THEN report END, "
                           "reported", names)

    def node(self, name: str) -> NodeRow | None:
        rows = self._query("SELECT name, first_seen, last_seen, report, reported FROM nodes "
                           "WHERE name = ?", (name,))
        return NodeRow(*rows[0][:3], json.loads(rows[0][3]), rows[0][4]) if rows else None

    def delete_node(self, name: str) -> bool:
        """Forget ``name`` (its arrivals stay in the fleet's history)."""
        with self._tx() as db:
            return db.execute("DELETE FROM nodes WHERE name = ?", (name,)).rowcount > 0

    def rate_bins(self, model: str, since: float = -math.inf) -> list[tuple[float, float]]:
        """``(bin start, count)`` of ``model``'s history bins starting at or after
        ``since``, oldest first (bins are ``rate_step_s`` wide)."""
        return [(t, c) for t, c in self._query(
            "SELECT t, count FROM rate_bins WHERE model = ? AND step = ? AND t >= ? "
            "ORDER BY t", (model, self.rate_step_s, since))]

    def history_bins(self, since: float) -> dict[str, list[tuple[float, float]]]:
        """model -> its ``rate_bins`` since ``since``: every model's in one query (a
        plan reads them all)."""
        out: dict[str, list[tuple[float, float]]] = {}
        for model, t, count in self._query(
                "SELECT model, t, count FROM rate_bins WHERE step = ? AND t >= ? "
                "ORDER BY model, t", (self.rate_step_s, since)):
            out.setdefault(model, []).append((t, count))
        return out

    # -- node identity ---------------------------------------------------------------
    def add_join_token(self, digest: str, node: str, not_after: float) -> None:
        """A one-time token (its hash) that lets ``node`` obtain its credential."""
        with self._tx() as db:
            db.execute("INSERT INTO join_tokens (sha256, node, not_after) VALUES (?, ?, ?)",
                       (digest, node, not_after))

    def redeem_join_token(self, digest: str, now: float) -> str | None:
        """The node a join token was made for, used up (None: unknown, used or
        expired); expired tokens are dropped on the way."""
        with self._tx() as db:
            db.execute("DELETE FROM join_tokens WHERE not_after < ?", (now,))
            row = db.execute("DELETE FROM join_tokens WHERE sha256 = ? RETURNING node",
                             (digest,)).fetchone()
            return row[0] if row else None

    def set_node_credential(self, node: str, digest: str, now: float) -> None:
        """``node``'s credential from now on (a former one stops working)."""
        with self._tx() as db:
            db.execute("INSERT INTO node_credentials (node, sha256, created) VALUES (?, ?, ?) "
                       "ON CONFLICT(node) DO UPDATE SET sha256 = excluded.sha256, "
                       "created = excluded.created", (node, digest, now))

    def revoke_node_credential(self, node: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM node_credentials WHERE node = ?",
                              (node,)).rowcount > 0

    def revoke_certificates(self, node: str, now: float) -> None:
        """Refuse, from now on, every client certificate naming ``node`` that was issued
        (its notBefore) at or before ``now``: a deleted node's, never-seen ones too. A
        certificate issued later names the node again."""
        with self._tx() as db:
            db.execute("INSERT INTO revoked_certificates (node, issued_before) VALUES (?, ?) "
                       "ON CONFLICT(node) DO UPDATE SET issued_before = excluded.issued_before "
                       "WHERE excluded.issued_before > revoked_certificates.issued_before",
                       (node, now))

    def revoked_certificates(self) -> dict[str, float]:
        """``{node: issued_before}`` of every revocation."""
        return {n: t for n, t in self._query(
            "SELECT node, issued_before FROM revoked_certificates")}

    def node_credentials_version(self) -> tuple:
        """Changes whenever a node credential is set or revoked, or a node's certificates
        are (cheap: to notice one another coordinator set)."""
        return (*self._query("SELECT COUNT(*), MAX(created) FROM node_credentials")[0],
                *self._query("SELECT COUNT(*), MAX(issued_before) "
                             "FROM revoked_certificates")[0])

    def node_credentials(self) -> list[tuple[str, str]]:
        """``(node, sha256)`` of every node credential."""
        return [(n, d) for n, d in self._query(
            "SELECT node, sha256 FROM node_credentials ORDER BY node")]

    # -- catalog ---------------------------------------------------------------------
    def put_model(self, slo: ModelSLO, now: float) -> bool:
        """Insert or replace; True when the model is new."""
        with self._tx() as db:
            return self._put_model(db, slo, now)

    @staticmethod
    def _put_model(db: Any, slo: ModelSLO, now: float) -> bool:
        new = db.execute("SELECT 1 FROM models WHERE name = ?", (slo.name,)).fetchone() is None
        db.execute("INSERT INTO models (name, slo_ms, percentile, priority, "
                   "cpu_per_replica, memory_per_replica_bytes, proc_ms, source, "
                   "source_options, version, digest, config, rollout, updated) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT(name) DO UPDATE SET "
                   "slo_ms = excluded.slo_ms, percentile = excluded.percentile, "
                   "priority = excluded.priority, "
                   "cpu_per_replica = excluded.cpu_per_replica, "
                   "memory_per_replica_bytes = excluded.memory_per_replica_bytes, "
                   "proc_ms = excluded.proc_ms, source = excluded.source, "
                   "source_options = excluded.source_options, "
                   "version = excluded.version, digest = excluded.digest, "
                   "config = excluded.config, rollout = excluded.rollout, "
                   "updated = excluded.updated",
                   (slo.name, slo.slo_ms, slo.percentile, slo.priority,
                    slo.cpu_per_replica, slo.memory_per_replica_bytes, slo.proc_ms,
                    slo.source, _json_or_none(slo.source_options), slo.version,
                    slo.digest, _json_or_none(slo.config), _json_or_none(slo.rollout), now))
        return new

    def models(self) -> list[ModelSLO]:
        return [ModelSLO(*row[:8], _object(row[8]), row[9], row[10], _object(row[11]),
                         _object(row[12]))
                for row in self._query(
                    "SELECT name, slo_ms, percentile, priority, cpu_per_replica, "
                    "memory_per_replica_bytes, proc_ms, source, source_options, version, "
                    "digest, config, rollout FROM models ORDER BY name")]

    def model(self, name: str) -> ModelSLO | None:
        found = [m for m in self.models() if m.name == name]
        return found[0] if found else None

    def delete_model(self, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM models WHERE name = ?", (name,)).rowcount > 0

    def _named(self, columns: str, names: Iterable[str]) -> list[tuple]:
        """``columns`` of the named nodes the store holds (500 names a query)."""
        names, out = sorted(set(names)), []
        for at in range(0, len(names), 500):
            chunk = names[at:at + 500]
            out += self._query(f"SELECT {columns} FROM nodes WHERE name IN "
                               f"({', '.join('?' * len(chunk))})", tuple(chunk))
        return out

    def node_reports(self, names: Iterable[str]) -> list[tuple[str, float, str]]:
        """``(name, last_seen, report JSON)`` of the named nodes the store holds."""
        return self._named("name, last_seen, report", names)

    # -- plans -----------------------------------------------------------------------
    def save_plan(self, plan: dict[str, Any], kind: str, now: float) -> int:
        """Store ``plan`` as the current one (keeping the last ``PLANS_KEPT``); its id."""
        with self._tx() as db:
            plan_id = int(db.execute("INSERT INTO plans (created, kind, plan) "
                                     "VALUES (?, ?, ?) RETURNING id",
                                     (now, kind, plan_text(plan))).fetchone()[0])
            db.execute("DELETE FROM plans WHERE id <= ?", (plan_id - PLANS_KEPT,))
            return plan_id

    def current_plan(self) -> StoredPlan | None:
        rows = self._query("SELECT id, created, kind, plan FROM plans ORDER BY id DESC LIMIT 1")
        return StoredPlan(*rows[0][:3], text=rows[0][3]) if rows else None

    def current_plan_id(self) -> int | None:
        """The newest plan's id (cheap: to notice a plan another process made)."""
        rows = self._query("SELECT MAX(id) FROM plans")
        return rows[0][0] if rows else None


class Leadership:
    """The right to plan. ``check()``: whether this coordinator holds it now (taking it
    when free; never raises); ``close()`` gives it up. This base always holds it."""

    def check(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _Transaction:
    """``with store._tx() as db``: BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.lock.release()
