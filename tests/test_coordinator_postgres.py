"""Several coordinator processes on one real PostgreSQL (a throwaway cluster,
tests/pgcluster.py; skipped where no server binary is found): all answer reports with
directives, exactly one plans (the advisory lock), another takes over within 15 s when
the leader is killed, and a PostgreSQL restart mid-ingestion loses no report that was
answered 200."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPORT, CoordinatorProcess, request, reserved_port, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def coordinators(postgres, tmp_path):
    """``start(n)``: n coordinators on one fresh database; stopped after the test."""
    started: list[CoordinatorProcess] = []

    def start(n: int, store: str | None = None) -> list[CoordinatorProcess]:
        store = store or postgres.new_database()
        for i in range(n):
            started.append(CoordinatorProcess(store, tmp_path / f"co{len(started)}"))
        return started[-n:]

    yield start
    for co in started:
        co.stop()


def report(co: CoordinatorProcess, node: str):
    status, body, headers = co.post(f"/v1/nodes/{node}/report", REPORT)
    return status, body


def test_two_coordinators_share_one_database_and_one_plans(coordinators):
    a, b = coordinators(2)
    assert (a.plans(), b.plans()) == (True, False)  # the first took the lock
    assert request(b.url + "/v1/models/a", "PUT", {"slo_ms": 200})[0] == 201
    for i in range(10):  # nodes report to either; both answer with directives
        for co in (a, b):
            status, body = report(co, f"edge-{i}-{co.port}")
            assert status == 200 and body["node"] == f"edge-{i}-{co.port}"
    # the leader's reactive loop makes the first plan
    wait_for(lambda: a.get("/v1/plan")[0] == 200, 20, "the leader plans")

    def covering_both():
        """The id of a plan over nodes that reported to either coordinator. The
        follower's reports reach the database with its next group commit (every 0.5 s),
        which may come after the leader's first plan: then ask the leader again."""
        plan = a.get("/v1/plan")[1]
        if all(any(n.endswith(str(co.port)) for n in plan["assignment"]) for co in (a, b)):
            return plan["id"]
        a.post("/v1/plan")
        return None

    plan_id = wait_for(covering_both, 10, "a plan covers the nodes of both")
    wait_for(lambda: b.get("/v1/plan")[1].get("id") == plan_id, 5, "the follower adopts")
    assignment = a.get("/v1/plan")[1]["assignment"]
    # a node the plan gives workers (it may place them all on nodes that reported to a:
    # any node may report to either), reporting to the follower
    planned = next(n for n, workers in assignment.items() if workers)
    status, directives = report(b, planned)
    assert status == 200 and directives["plan_id"] == plan_id and directives["workers"]
    # a follower does not plan: it says who does
    status, body, _ = b.post("/v1/plan")
    assert status == 409 and "another coordinator" in body["error"]
    status, body, _ = a.post("/v1/plan")
    assert status == 200 and body["id"] > plan_id
    wait_for(lambda: b.get("/v1/plan")[1]["id"] == body["id"], 5, "the follower adopts")
    assert (a.plans(), b.plans()) == (True, False)


@pytest.mark.slow  # 30 s of the quick suite's longest worker; CI runs it in make test-slow
def test_leader_failover_within_15_s(coordinators):
    a, b = coordinators(2)
    assert request(a.url + "/v1/models/a", "PUT", {"slo_ms": 200})[0] == 201
    for i in range(6):
        assert report(b, f"edge-{i}")[0] == 200
    plan_id = wait_for(lambda: b.get("/v1/plan")[1].get("id"), 20, "a plan reaches b")
    answers: list[tuple[int, int | None]] = []
    stop = threading.Event()

    def agents():  # nodes keep reporting to the survivor every 0.2 s
        while not stop.is_set():
            for i in range(6):
                status, body = report(b, f"edge-{i}")
                answers.append((status, body.get("plan_id")))
            time.sleep(0.2)

    thread = threading.Thread(target=agents)
    thread.start()
    try:
        time.sleep(1)
        os.kill(a.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(b.plans, 15, "the survivor takes the planning lock")
        took = time.monotonic() - killed
        new = wait_for(lambda: (lambda p: p > plan_id and p)(b.get("/v1/plan")[1]["id"]),
                       15 - took, "the survivor plans")
        print(f"failover: lock after {took:.1f} s, plan {new} after "
              f"{time.monotonic() - killed:.1f} s")
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
    assert answers and all(status == 200 and plan for status, plan in answers)
    assert answers[-1][1] == new  # agents got the new leader's plan without noticing
    assert b.post("/v1/plan")[0] == 200  # and it plans on request too


def test_postgres_restart_mid_ingestion_loses_no_answered_report(postgres, coordinators):
    import psycopg

    store = postgres.new_database()
    [co] = coordinators(1, store)
    answered: list[str] = []
    refused: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def agents():  # every report from a node of its own: each is one row to find
        i = 0
        while not stop.is_set():
            node = f"edge-{i}"
            i += 1
            try:
                status, _, headers = co.post(f"/v1/nodes/{node}/report", REPORT)
            except OSError:
                continue
            if status == 200:
                answered.append(node)
            else:
                refused.append((status, headers.get("Retry-After")))
            time.sleep(0.01)

    thread = threading.Thread(target=agents)
    thread.start()
    try:
        time.sleep(1.5)
        assert co.get("/v1/health") == (200, {"ok": True, "planner": True})
        postgres.stop("fast")
        time.sleep(3)
        # the reports it refuses now, its health says too (without the store's error)
        assert co.get("/v1/health") == (503, {"ok": False, "planner": True,
                                              "store": "failing"})
        postgres.start()
        time.sleep(3)
        wait_for(lambda: co.get("/v1/health")[0] == 200, 10, "healthy again")
    finally:
        stop.set()
        thread.join()
        postgres.start_if_stopped()
    # refused while the store was down, with a Retry-After; the rest were answered
    assert refused and all(s == 503 and r for s, r in refused), refused[:5]
    assert len(answered) > 100

    def stored() -> set[str]:
        with psycopg.connect(store) as db:
            return {r[0] for r in db.execute("SELECT name FROM nodes").fetchall()}
    wait_for(lambda: set(answered) <= stored(), 15, "every answered report is written")
    assert co.post("/v1/nodes/late/report", REPORT)[0] == 200  # serving again


def test_store_config_and_lazy_import(tmp_path):
    from agent.coordinator.config import parse_coordinator_config
    from agent.validation import ConfigError

    url = "postgresql://edge@db.internal:5432/fleet"
    assert parse_coordinator_config({"store": url}).store == url
    assert parse_coordinator_config({}).store is None  # the SQLite file in state_dir
    with pytest.raises(ConfigError, match="store: must be a postgresql:// URL"):
        parse_coordinator_config({"store": "mysql://x"}, "co.yaml")
    code = ("import sys; from agent.coordinator.stores import open_store; "
            f"s = open_store({str(tmp_path / 'co.sqlite3')!r}); s.nodes(); "
            "assert 'psycopg' not in sys.modules, 'psycopg loaded'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_password_is_redacted_and_an_unreachable_database_is_unavailable():
    from agent.coordinator.store import StoreUnavailable
    from agent.coordinator.stores import open_store, redact

    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    assert redact("postgresql://edge:s3cret@db:5432/fleet") == "postgresql://edge:***@db:5432/fleet"
    assert redact("postgresql://edge@db/fleet?sslmode=require&password=s3cret&x=1") == \
        "postgresql://edge@db/fleet?sslmode=require&password=***&x=1"
    with reserved_port() as port, pytest.raises(StoreUnavailable,
                                                match=r"edge:\*\*\*@127.0.0.1") as err:
        open_store(f"postgresql://edge:s3cret@127.0.0.1:{port}/fleet")  # nothing listens
    assert "s3cret-0123456789abcdef0123456789abcdef" not in str(err.value) and err.value.status == 503
