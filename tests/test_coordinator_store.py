"""The coordinator's SQLite store: round trips, restart persistence, migrations, bounds."""

from __future__ import annotations

import sqlite3

import pytest

from agent.coordinator import store as store_module
from agent.coordinator.catalog import ModelSLO
from agent.coordinator.store import Store


def test_round_trips_and_restart(tmp_path):
    path = tmp_path / "state" / "co.sqlite3"
    s = Store(path)
    assert s.version == len(store_module.MIGRATIONS)
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

    s = Store(path)  # a restart sees everything
    assert s.models() == [slo, ModelSLO("b", slo_ms=50)]
    assert s.model("a") == slo and s.model("zz") is None
    [node] = s.nodes()
    assert (node.name, node.first_seen, node.last_seen, node.report) == ("n1", 11.0, 16.0, report)
    assert list(s.arrivals(since=0)) == [("n1", "a", 10.0, 5.0, 50.0), ("n1", "a", 15.0, 5.0, 60.0)]
    assert list(s.arrivals(since=12, model="a")) == [("n1", "a", 15.0, 5.0, 60.0)]
    assert list(s.arrivals(since=0, model="b")) == []
    current = s.current_plan()
    assert (current.id, current.kind, current.created, current.plan) == \
        (plan_id, "manual", 17.0, {"models": {"a": {"replicas": 3}}})
    assert s.delete_model("b") and not s.delete_model("b")
    assert s.delete_node("n1") and s.nodes() == [] and list(s.arrivals(0)) == []
    s.close()


def test_rate_history_is_bounded_by_time(tmp_path):
    s = Store(tmp_path / "co.sqlite3")
    for t in range(0, 100, 5):
        s.record_report("n", {}, {"a": [(float(t), 5.0, 1.0)]}, now=float(t), keep_s=30)
    times = [p[2] for p in s.arrivals(since=-1)]
    assert times == [65.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0]  # t_end >= now - keep_s


def test_plans_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "PLANS_KEPT", 3)
    s = Store(tmp_path / "co.sqlite3")
    ids = [s.save_plan({"n": i}, "long-term", now=i) for i in range(6)]
    assert s._query("SELECT id FROM plans ORDER BY id") == [(i,) for i in ids[-3:]]
    assert s.current_plan().plan == {"n": 5}


def test_migrations_upgrade_in_place_and_refuse_newer(tmp_path, monkeypatch):
    path = tmp_path / "co.sqlite3"
    Store(path).close()
    extra = "ALTER TABLE models ADD COLUMN note TEXT;"
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS + (extra,))
    s = Store(path)
    assert s.version == 2
    assert "note" in [row[1] for row in s._query("PRAGMA table_info(models)")]
    s.close()
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:1])
    with pytest.raises(RuntimeError, match="newer than"):
        Store(path)


def test_failed_migration_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "co.sqlite3"
    Store(path).close()
    bad = "CREATE TABLE t1 (x INTEGER); INSERT INTO nowhere VALUES (1);"
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS + (bad,))
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 't1'").fetchone() is None
