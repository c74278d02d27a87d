"""The coordinator's store, one suite over SQLite and PostgreSQL (a throwaway cluster,
tests/pgcluster.py; those cases skip where no server binary is found): round trips,
restart persistence, migrations, bounds."""

from __future__ import annotations

import random
import sqlite3

import orjson
import pytest

from agent.coordinator import store as store_module
from agent.coordinator.catalog import ModelSLO
from agent.coordinator.ingest import ReportWriter, report_record
from agent.coordinator.store import ReportRecord
from agent.coordinator.stores import PostgresStore, open_store
from agent.wire import parse_report


@pytest.fixture(params=["sqlite", "postgresql"])
def path(request, tmp_path):
    """Where a store lives: a SQLite file, or a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return tmp_path / "state" / "co.sqlite3"
    return request.getfixturevalue("postgres").new_database()


def Store(path, **kw):  # noqa: N802 - the store ``path`` names, as the coordinator opens it
    return open_store(path, **kw)


def columns(s, table: str) -> list[str]:
    if isinstance(s, PostgresStore):
        return [r[0] for r in s._query("SELECT column_name FROM information_schema.columns "
                                       "WHERE table_name = ?", (table,))]
    return [row[1] for row in s._query(f"PRAGMA table_info({table})")]


def test_round_trips_and_restart(path):
    s = Store(path, rate_step_s=5)
    assert s.version == len(store_module.MIGRATIONS)
    if not isinstance(s, PostgresStore):
        assert s._query("PRAGMA journal_mode")[0][0] == "wal"
    slo = ModelSLO("a", slo_ms=100, percentile=99.9, priority=2, proc_ms=12.5)
    assert s.put_model(slo, now=1.0) is True
    assert s.put_model(ModelSLO("b", slo_ms=50), now=1.0) is True
    assert s.put_model(slo, now=2.0) is False
    report = {"capacity": {"cores": 2}, "models": {"a": {"resident": True}}}
    s.record_report("n1", report, {"a": [(10.0, 5.0, 50.0)]}, now=11.0, keep_s=100)
    s.record_report("n1", report, {"a": [(15.0, 5.0, 60.0)]}, now=16.0, keep_s=100)
    plan_id = s.save_plan({"models": {"a": {"replicas": 3}}}, "manual", now=17.0)
    s.close()

    s = Store(path, rate_step_s=5)  # a restart sees everything
    assert s.models() == [slo, ModelSLO("b", slo_ms=50)]
    assert s.model("a") == slo and s.model("zz") is None
    [node] = s.nodes()
    assert (node.name, node.first_seen, node.last_seen, node.report) == ("n1", 11.0, 16.0, report)
    assert s.rate_bins("a") == [(5.0, 50.0), (10.0, 60.0)]  # [t, t + 5) bins
    assert s.rate_bins("a", since=6) == [(10.0, 60.0)]
    assert s.rate_bins("b") == []
    assert s.history_bins(since=-1e9) == {"a": [(5.0, 50.0), (10.0, 60.0)]}  # one query
    assert s.history_bins(since=6) == {"a": s.rate_bins("a", since=6)}
    current = s.current_plan()
    assert (current.id, current.kind, current.created, current.plan) == \
        (plan_id, "manual", 17.0, {"models": {"a": {"replicas": 3}}})
    assert s.delete_model("b") and not s.delete_model("b")
    assert s.delete_node("n1") and s.nodes() == [] and not s.delete_node("n1")
    s.close()


def test_rate_history_is_bounded_by_time(path):
    s = Store(path, rate_step_s=5)
    for t in range(5, 100, 5):
        s.record_report("n", {}, {"a": [(float(t), 5.0, 1.0)]}, now=float(t), keep_s=30)
    # bins that end at or after now - keep_s stay: [60, 65) ... [90, 95)
    assert [t for t, _ in s.rate_bins("a")] == [60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0]


def test_reports_from_many_nodes_add_up_in_one_batch(path):
    s = Store(path, rate_step_s=10)
    records = [store_module.ReportRecord(f"n{i}", {"i": i, "r": r},
                                         {"a": [(100.0 + r, 5.0, 10.0)]}, 100.0 + r)
               for r in range(2) for i in range(50)]
    assert s.write_reports(records) == 100
    rows = s.nodes()
    assert len(rows) == 50 and all(row.report["r"] == 1 for row in rows)  # the latest
    assert all((row.first_seen, row.last_seen) == (100.0, 101.0) for row in rows)
    # 10 in (95, 100]: all in [90, 100); 10 in (96, 101]: 4/5 there, 1/5 in [100, 110)
    assert s.rate_bins("a") == [(90.0, pytest.approx(50 * 10 + 50 * 8)),
                                (100.0, pytest.approx(50 * 2))]


def test_an_older_report_never_replaces_a_newer_one(path):
    """Two report workers' batches may reach the writer out of order: a node's report
    answered earlier, in the same batch after its newer one or in a later batch, does
    not replace the newer one (by its answer time)."""
    s = Store(path, rate_step_s=10)
    rec = store_module.ReportRecord
    s.write_reports([rec("n", {"r": 2}, {}, 102.0), rec("n", {"r": 1}, {}, 101.0)])
    assert [row.report for row in s.nodes()] == [{"r": 2}]
    s.write_reports([rec("n", {"r": 0}, {}, 100.0), rec("m", {"r": 0}, {}, 100.0)])
    assert {row.name: (row.report, row.last_seen) for row in s.nodes()} == {
        "n": ({"r": 2}, 102.0), "m": ({"r": 0}, 100.0)}
    s.write_reports([rec("n", {"r": 3}, {}, 103.0)])
    assert [row.report for row in s.nodes() if row.name == "n"] == [{"r": 3}]


def test_leases_move_last_seen_on_and_an_older_report_stays_older(path):
    """A lease moves a node's ``last_seen`` on, never back, and leaves its report; a
    report older than the one held is ignored even where a lease since made
    ``last_seen`` newer than both; a newer report replaces it, ``last_seen`` kept."""
    s = Store(path, rate_step_s=10)
    rec = store_module.ReportRecord
    s.write_reports([rec("n", {"r": 2}, {}, 102.0)])
    s.write_reports([], {"n": 110.0, "gone": 111.0})  # an unknown node's lease: nothing
    s.write_reports([], {"n": 105.0})  # an older lease (another worker's, late)
    [row] = s.nodes()
    assert (row.report, row.reported, row.last_seen) == ({"r": 2}, 102.0, 110.0)
    s.write_reports([rec("n", {"r": 1}, {}, 101.0)], {"n": 108.0})
    [row] = s.nodes()
    assert (row.report, row.reported, row.last_seen) == ({"r": 2}, 102.0, 110.0)
    s.write_reports([rec("n", {"r": 3}, {}, 104.0)])  # newer than the report held
    [row] = s.nodes()
    assert (row.report, row.reported, row.last_seen) == ({"r": 3}, 104.0, 110.0)
    assert [r[4] for r in s.live_nodes(109.0)] == [104.0]
    s.close()
    [row] = Store(path, rate_step_s=10).nodes()  # as written
    assert (row.reported, row.last_seen) == (104.0, 110.0)


def test_a_lease_within_lease_write_s_writes_nothing_and_a_stop_writes_it(path):
    """``lease_write_s``: a lease writes ``last_seen`` only once the one last written is
    that old, one within it is held (a stop writes it); a full report always writes; a
    restarted writer's first lease writes; a node silent past the timeout leaves the
    live nodes at most ``lease_write_s`` sooner than by its last lease, never later."""
    s = Store(path, rate_step_s=10)
    writer = ReportWriter(s, keep_s=900, lease_write_s=15)
    rec = store_module.ReportRecord

    def stored() -> float:
        writer.flush()
        [row] = s.nodes()
        return row.last_seen

    writer.submit(rec("n", {"r": 1}, {}, 100.0))
    assert stored() == 100.0
    writer.renew("n", 105.0)
    writer.renew("n", 114.5)
    assert stored() == 100.0  # within the bound: nothing written
    writer.renew("n", 115.0)
    assert stored() == 115.0  # past it: written
    writer.renew("n", 120.0)  # the node's last lease, held
    assert stored() == 115.0
    # silent since 120, with a 60 s timeout: live at 174 still, gone at 177 (3 s before
    # its last lease would say, at most lease_write_s)
    assert [r[0] for r in s.live_nodes(174.0 - 60)] == ["n"]
    assert [r[0] for r in s.live_nodes(177.0 - 60)] == []
    writer.submit(rec("n", {"r": 2}, {}, 121.0))  # a full report always writes
    assert stored() == 121.0
    writer.renew("n", 122.0)
    writer.renew("n", 118.0)  # an older lease (another worker's, late): held, never back
    writer.close()  # a stop writes the lease held
    [row] = Store(path, rate_step_s=10).nodes()
    assert (row.report, row.reported, row.last_seen) == ({"r": 2}, 121.0, 122.0)
    again = ReportWriter(s, keep_s=900, lease_write_s=15)  # after a restart ...
    again.renew("n", 123.0)  # ... the first lease writes
    again.flush()
    assert [row.last_seen for row in s.nodes()] == [123.0]
    s.close()


def test_spread_matches_the_planners_series():
    points = [(10.0, 10.0, 10.0), (30.0, 5.0, 20.0), (12.5, 5.0, 10.0)]
    assert store_module.spread(points, 5.0) == {0.0: 5.0, 5.0: 10.0, 10.0: 5.0, 25.0: 20.0}


def test_plans_are_bounded(path, monkeypatch):
    monkeypatch.setattr(store_module, "PLANS_KEPT", 3)
    s = Store(path)
    ids = [s.save_plan({"n": i}, "long-term", now=i) for i in range(6)]
    assert s._query("SELECT id FROM plans ORDER BY id") == [(i,) for i in ids[-3:]]
    assert s.current_plan().plan == {"n": 5}


def test_migrations_upgrade_in_place_and_refuse_newer(path, monkeypatch):
    Store(path).close()
    extra = "ALTER TABLE models ADD COLUMN note TEXT;"
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS + (extra,))
    s = Store(path)
    assert s.version == len(store_module.MIGRATIONS)
    assert "note" in columns(s, "models")
    s.close()
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:-1])
    with pytest.raises(RuntimeError, match="newer than"):
        Store(path)


def test_failed_migration_changes_nothing(path, monkeypatch):
    Store(path).close()
    bad = "CREATE TABLE t1 (x INTEGER); INSERT INTO nowhere VALUES (1);"
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS + (bad,))
    if isinstance(path, str):  # PostgreSQL
        import psycopg

        with pytest.raises(psycopg.errors.UndefinedTable):
            Store(path)
        with psycopg.connect(path) as db:
            assert db.execute("SELECT version FROM schema_version").fetchone()[0] == \
                len(store_module.MIGRATIONS) - 1
            assert db.execute("SELECT to_regclass('t1')").fetchone()[0] is None
        return
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(store_module.MIGRATIONS) - 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 't1'").fetchone() is None


def test_a_point_at_epoch_time_adds_exactly_its_count():
    """At epoch times (~1.7e9 s) ``t_end - seconds`` is a float ~2e-7 s off, so
    spreading by ``seconds`` added up to ~1e-6 too much or too little per point (seen as
    20.00002 of 20 requests in ``test_coordinator_reporter``); the overlaps are now
    shared by the span the clock's floats hold."""
    rng = random.Random(5)
    points = [(1.7e9 + rng.uniform(0, 1e5), round(rng.uniform(0.05, 12.0), 6),
               float(rng.randint(1, 500))) for _ in range(2000)]
    for step in (1.0, 5.0, 0.25):
        bins = store_module.spread(points, step)
        assert sum(bins.values()) == pytest.approx(sum(c for _, _, c in points), rel=1e-12)
        for t_end, seconds, count in points[:50]:
            one = store_module.spread([(t_end, seconds, count)], step)
            assert sum(one.values()) == pytest.approx(count, rel=1e-12, abs=0)


def test_question_marks_and_percents_inside_sql_text_are_kept(path):
    """The shared SQL's ``?`` placeholders become psycopg's ``%s`` only outside string
    literals, quoted identifiers and comments; a ``%`` anywhere reaches the server as one
    (a string replace turned ``'a?b'`` into ``'a%sb'``)."""
    s = Store(path)
    sql = ("SELECT 'why? 100%' AS \"col?\", ? /* a ? here */ -- and ? there\n"
           "  , 'it''s ?'")
    assert [tuple(r) for r in s._query(sql, (7,))] == [("why? 100%", 7, "it's ?")]
    s.close()


def test_node_credentials_and_join_tokens(path):
    """A join token is redeemed once and only before it expires; a node's credential is
    replaced by its next and revoked with the node; another store on the same database
    (another coordinator) sees each change in the version it polls."""
    s, other = Store(path), Store(path)
    s.add_join_token("a" * 64, "edge-1", not_after=100.0)
    s.add_join_token("b" * 64, "edge-2", not_after=10.0)
    assert other.redeem_join_token("b" * 64, now=11.0) is None  # expired
    assert other.redeem_join_token("a" * 64, now=50.0) == "edge-1"
    assert s.redeem_join_token("a" * 64, now=50.0) is None  # used
    seen = other.node_credentials_version()
    s.set_node_credential("edge-1", "c" * 64, now=50.0)
    assert other.node_credentials_version() != seen
    assert other.node_credentials() == [("edge-1", "c" * 64)]
    seen = other.node_credentials_version()
    s.set_node_credential("edge-1", "d" * 64, now=51.0)
    assert other.node_credentials_version() != seen
    assert other.node_credentials() == [("edge-1", "d" * 64)]
    assert s.revoke_node_credential("edge-1") and not s.revoke_node_credential("edge-1")
    assert other.node_credentials() == []
    s.close()
    other.close()


def test_revoked_certificates_are_kept_and_seen_by_another_store(path):
    """A node's certificates revoked up to a time, on SQLite and PostgreSQL: another
    store on the same database (another coordinator) sees it in the version it polls;
    a later revocation moves the time on, an earlier one never back."""
    s, other = Store(path), Store(path)
    seen = other.node_credentials_version()
    s.revoke_certificates("edge-1", 100.0)
    assert other.node_credentials_version() != seen
    assert other.revoked_certificates() == {"edge-1": 100.0}
    s.revoke_certificates("edge-1", 50.0)
    s.revoke_certificates("edge-2", 70.0)
    assert other.revoked_certificates() == {"edge-1": 100.0, "edge-2": 70.0}
    s.revoke_certificates("edge-1", 200.0)
    assert other.revoked_certificates()["edge-1"] == 200.0
    s.close()
    other.close()


def test_a_catalog_of_version_4_gains_the_source_columns(path, monkeypatch):
    """Migration 5: a store written before sources keeps its catalog; entries then
    hold a source, its options, version, digest and config, read back as written."""
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:4])
    Store(path).close()
    old_rows = "INSERT INTO models (name, slo_ms, percentile, priority, cpu_per_replica, " \
        "memory_per_replica_bytes, proc_ms, updated) VALUES ('old', 50, 99, 1, 1, 0, NULL, 0)"
    if isinstance(path, str):  # a row as a version-4 coordinator wrote it
        import psycopg

        with psycopg.connect(path) as db:
            db.execute(old_rows)
    else:
        with sqlite3.connect(path) as db:
            db.execute(old_rows)
    monkeypatch.undo()
    s = Store(path)
    assert s.version == len(store_module.MIGRATIONS)
    assert s.models() == [ModelSLO("old", slo_ms=50)]
    sourced = ModelSLO("new", slo_ms=80, source="s3://models/new",
                       source_options={"endpoint_url": "http://127.0.0.1:9000", "n": 2},
                       version=3, digest="sha256:" + "a" * 64,
                       config={"max_batch_size": 8, "slo": {"latency_ms": 80}})
    assert s.put_model(sourced, now=1.0) is True
    s.close()
    s = Store(path)
    assert s.models() == [sourced, ModelSLO("old", slo_ms=50)]
    assert s.model("new").pull() == {
        "source": "s3://models/new", "version": 3, "digest": "sha256:" + "a" * 64,
        "source_options": {"endpoint_url": "http://127.0.0.1:9000", "n": 2},
        "config": {"max_batch_size": 8, "slo": {"latency_ms": 80}}}
    s.close()


def test_live_marks_and_node_summaries_give_what_the_reactive_check_reads(path):
    """``live_marks``: each live node's (name, last_seen, reported), a lease moving only
    the first, a full report both (on SQLite from the index alone); ``node_summaries``:
    the named nodes' summaries, or reports where a node has none, unknown names left
    out."""
    s = Store(path)
    raw = orjson.dumps({"capacity": {"cores": 2, "cpu_memory_bytes": 1e9},
                        "models": {"m": {"latency_ms": {"p99": 40.0}}}})
    s.write_reports([report_record("a", raw, parse_report("a", raw), 100.0),
                     ReportRecord("b", raw, {}, 101.0)])  # b: no summary
    s.write_reports([], {"a": 105.0})
    assert sorted(s.live_marks(100.0)) == [("a", 105.0, 100.0), ("b", 101.0, 101.0)]
    assert s.live_marks(102.0) == [("a", 105.0, 100.0)]
    rows = {row[0]: row for row in s.node_summaries(["b", "a", "gone"])}
    assert set(rows) == {"a", "b"}
    assert orjson.loads(rows["a"][1])[3][0][5] == [["p99", 40.0]] and rows["a"][2] is None
    assert rows["b"][1] is None and orjson.loads(rows["b"][2]) == orjson.loads(raw)
    assert (rows["a"][3], rows["b"][3]) == (100.0, 101.0)
    s.write_reports([report_record("a", raw, parse_report("a", raw), 110.0)])
    assert s.live_marks(102.0) == [("a", 110.0, 110.0)]
    if not isinstance(s, PostgresStore):
        plan = s._query("EXPLAIN QUERY PLAN SELECT name, last_seen, reported FROM nodes "
                        "WHERE last_seen >= ?", (0.0,))
        assert "COVERING INDEX nodes_marks" in plan[0][-1], plan
    s.close()
