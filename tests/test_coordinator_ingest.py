"""Ingestion at fleet scale (issue 16): reports answered from memory while the database
is busy, written in batches, kept when the store fails (503 meanwhile), written on a
clean stop; plans made in a child process that is restarted when it dies."""

from __future__ import annotations

import concurrent.futures
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request

import orjson
import pytest

from agent.coordinator.ingest import Fleet, ReportWriter, reported_models
from agent.coordinator.store import ReportRecord, Store
from agent.wire import parse_report
from tests.helpers import REPORT, Clock


def post(url: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def test_reports_are_answered_while_the_database_is_locked(start_coordinator, tmp_path):
    co = start_coordinator()
    db = sqlite3.connect(co.co.config.database, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")  # nobody else may read or write the file now
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            started = time.monotonic()
            answers = list(pool.map(
                lambda i: post(f"{co.url}/v1/nodes/n{i}/report", REPORT)[0], range(64)))
            elapsed = time.monotonic() - started
        assert answers == [200] * 64
        assert elapsed < 2.0  # answered from memory, not after the lock
        status, nodes = co.request("GET", "/v1/nodes")  # reads come from memory too
        assert status == 200 and len(nodes) == 64
    finally:
        db.execute("ROLLBACK")
        db.close()
    co.co.writer.flush()
    stored = Store(co.co.config.database)
    assert len(stored.nodes()) == 64
    stored.close()


def test_an_answered_report_is_written_on_a_clean_stop(start_coordinator):
    co = start_coordinator()
    co.co.writer.interval_s = 3600  # no periodic commit: only the stop can write it
    time.sleep(co.co.writer.interval_s and 0.7)  # the thread's current wait ends first
    assert co.co.writer.batches == 0
    assert co.request("POST", "/v1/nodes/edge-1/report", REPORT)[0] == 200
    path, step = co.co.config.database, co.co.config.rate_step_s
    co.close()
    stored = Store(path, rate_step_s=step)
    [row] = stored.nodes()
    assert row.name == "edge-1" and row.report == REPORT
    assert sum(c for _, c in stored.rate_bins("a")) == pytest.approx(100)
    stored.close()


class FlakyStore:
    """A store whose writes fail while ``down`` (PostgreSQL restarting)."""

    rate_step_s = 10.0

    def __init__(self) -> None:
        self.down = False
        self.written: list[ReportRecord] = []
        self.renewed: dict[str, float] = {}

    def write_reports(self, records, renewed=None):
        if self.down:
            raise OSError("connection refused")
        self.written.extend(records)
        self.renewed.update(renewed or {})
        return len(records)

    def prune(self, before):
        return 0


def test_writer_keeps_reports_while_the_store_fails():
    store = FlakyStore()
    writer = ReportWriter(store, keep_s=60)
    writer.submit(ReportRecord("a", {}, {}, 1.0))
    writer.renew("a", 1.5)
    store.down = True
    with pytest.raises(OSError):
        writer.flush()
    assert not writer.healthy and "connection refused" in writer.last_error
    writer.submit(ReportRecord("b", {}, {}, 2.0))
    writer.renew("a", 1.2)  # older than the one kept: the newer lease stays
    writer.renew("b", 2.5)
    assert writer.queued() == 2
    store.down = False
    assert writer.flush() == 2 and writer.healthy
    assert [r.node for r in store.written] == ["a", "b"]  # in order, none lost
    assert store.renewed == {"a": 1.5, "b": 2.5}  # each node's newest lease, kept too


def test_a_failing_store_answers_503_with_retry_after(start_coordinator):
    """A report while the store fails: 503 + Retry-After saying the store is failing,
    never the store's own error (its host, user, database: the log has it)."""
    co = start_coordinator()
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
    real = co.co.store.write_reports
    co.co.store.write_reports = lambda records, renewed=None: (_ for _ in ()).throw(
        sqlite3.OperationalError("disk I/O error at db.internal user=fleet"))
    with pytest.raises(sqlite3.OperationalError):
        co.co.writer.flush()
    assert "db.internal" in co.co.writer.last_error  # what the writer logs
    status, doc, headers = post(f"{co.url}/v1/nodes/n1/report", REPORT)
    assert status == 503 and "store is failing" in doc["error"]
    assert "db.internal" not in doc["error"] and "disk I/O" not in doc["error"]
    assert int(headers["Retry-After"]) >= 1
    co.co.store.write_reports = real
    assert co.co.writer.flush() == 1  # the acknowledged report, kept
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200


def test_planning_process_is_restarted_when_it_dies(start_coordinator):
    co = start_coordinator()
    co.request("PUT", "/v1/models/a", {"slo_ms": 100})
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
    status, first = co.request("POST", "/v1/plan")
    assert status == 200 and first["models"]["a"]["replicas"] >= 1
    proc = co.co.planner._proc
    assert proc.pid != threading.get_native_id() and proc.is_alive()
    proc.kill()
    proc.join()
    # a new planning process starts (spawned: a loaded box may take a while to import it)
    status, second = co.request("POST", "/v1/plan")
    assert status == 200 and second["id"] == first["id"] + 1
    status, directives = co.request("POST", "/v1/nodes/n1/report", REPORT)
    assert directives["plan_id"] == second["id"] and "a" in directives["workers"]


def test_a_first_report_in_the_bin_in_progress_is_planned_for(tmp_path):
    from agent.coordinator.catalog import ModelSLO
    from agent.coordinator.config import CoordinatorConfig
    from agent.coordinator.planner import Planner

    config = CoordinatorConfig(state_dir=tmp_path, rate_step_s=10)
    store = Store(config.database, rate_step_s=10)
    store.put_model(ModelSLO("a", slo_ms=100), 0)
    # 100 requests in (1003, 1008]: all inside [1000, 1010), in progress at 1008
    store.record_report("n1", {"capacity": {"cores": 4}, "models": {"a": {}}},
                        {"a": [(1008.0, 5.0, 100.0)]}, 1008.0, keep_s=900)
    planner = Planner(store, config, clock=lambda: 1008.5)
    rate, points = planner.planning_rate("a", end=1008.0)
    assert points == 1 and 5 < rate < 30  # 100 / 8 s so far
    assert planner.planning_rate("a", end=1000.5) == (0.0, 0)  # too short to be a rate
    store.close()


@pytest.mark.parametrize("where, words", [
    ("state", "models.a.state"), ("gpu", "capacity.gpus[0].x"), ("top", "x")])
def test_a_report_deep_where_no_field_is_checked_gets_400(start_coordinator, where, words):
    """The report path parses with orjson alone (a valid report nests 5 deep at most):
    depth inside the free-form places (a model's state, a GPU's extra field, an unknown
    field) is refused as a bad field, or as JSON nested too deep, never a 500."""
    co = start_coordinator()
    for depth in (70, 900, 1100, 100_000):
        deep = "[" * depth + "]" * depth
        body = json.loads(json.dumps(REPORT))
        if where == "state":
            body["models"]["a"]["state"] = "@"
        elif where == "gpu":
            body["capacity"]["gpus"] = [{"device": "cuda:0", "memory_bytes": 1, "x": "@"}]
        else:
            body["x"] = "@"
        raw = json.dumps(body).replace('"@"', deep).encode()
        status, doc = co.request("POST", "/v1/nodes/n1/report", raw=raw)
        assert status == 400, (depth, doc)
        assert words in doc["error"] or "nested deeper than" in doc["error"], doc
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
    assert co.request("GET", "/v1/nodes")[0] == 200


def _exchange(url: str, parts: list[bytes], pause: float) -> bytes:
    """Send ``parts`` on one connection ``pause`` s apart; the whole answer."""
    import socket

    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause)
            sock.sendall(part)
        answer = b""
        while not answer.endswith(b"}") and (chunk := sock.recv(65536)):
            answer += chunk
        return answer


def test_reports_that_skip_the_middlewares_keep_their_checks(start_coordinator, tmp_path):
    """A report whose body has all arrived skips the middleware chain: the token is
    still checked; one whose body is still coming takes the chain (its read timeout)."""
    token = tmp_path / "token"
    token.write_text("s3cret-0123456789abcdef0123456789abcdef\n")
    co = start_coordinator(admin_token_file=token, read_timeout_s=1.0)
    assert co.request("POST", "/v1/nodes/n1/report", REPORT, token="wrong")[0] == 401
    assert co.request("POST", "/v1/nodes/n1/report", REPORT, token="s3cret-0123456789abcdef0123456789abcdef")[0] == 200
    body = json.dumps(REPORT).encode()
    head = (f"POST /v1/nodes/n2/report HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-0123456789abcdef0123456789abcdef"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    answer = _exchange(co.url, [head + body[:10], body[10:]], pause=0.3)  # in time
    assert answer.startswith(b"HTTP/1.1 200") and b'"node":"n2"' in answer, answer
    answer = _exchange(co.url, [head + body[:10], body[10:]], pause=1.6)  # too slow
    assert answer.startswith(b"HTTP/1.1 408"), answer
    answer = _exchange(co.url, [head.replace(b"s3cret-0123456789abcdef0123456789abcdef", b"nope") + body[:10], body[10:]],
                       pause=0.3)
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert sorted(n["name"] for n in co.request("GET", "/v1/nodes", token="s3cret-0123456789abcdef0123456789abcdef")[1]) \
        == ["n1", "n2"]


def test_nodes_by_model_in_one_pass_only_the_live_ones_by_name():
    """``GET /v1/models`` lists each model's live nodes from one pass over the fleet
    (one per model took 1.5 s of the loop at 1,000 models x 10,000 nodes)."""
    fleet = Fleet(ttl_s=60.0)
    for name, models, seen in (("n3", ("a", "b"), 100.0), ("n1", ("a",), 100.0),
                               ("n2", ("b",), 10.0), ("n0", (), 100.0)):
        fleet.record(name, b"{}", tuple((m, ()) for m in models), seen)
    assert fleet.by_model(since=50.0) == ({"a": ["n1", "n3"], "b": ["n3"]}, {})
    assert fleet.by_model(since=0.0)[0] == {"a": ["n1", "n3"], "b": ["n2", "n3"]}


def test_by_model_measures_the_worst_live_node_at_each_models_percentile():
    """``GET /v1/models``' ``measured_latency_ms`` from the latencies kept per node at
    record time (not their reports parsed again at every dashboard refresh)."""
    fleet = Fleet(ttl_s=60.0)

    def report(node, seen, **models):
        body = {"capacity": {"cores": 1, "cpu_memory_bytes": 10**9},
                "models": {m: {"latency_ms": lat} for m, lat in models.items()}}
        raw = orjson.dumps(body)
        fleet.record(node, raw, reported_models(parse_report(node, body)), seen)
    report("n1", 100.0, a={"p50": 10, "p99": 40}, b={"p50": 5, "p95": 7, "p99": 30})
    report("n2", 100.0, a={"p99": 55}, b={"p50": 9}, c={})
    report("old", 10.0, a={"p99": 900})
    report("n3", 100.0, a={"p50": 99})     # a p99 of nothing: its highest, the median
    on, worst = fleet.by_model(50.0, {"a": 99.0, "b": 95.0, "c": 99.0})
    assert worst == {"a": 99, "b": 9} and on["c"] == ["n2"]
    assert fleet.by_model(0.0, {"a": 99.0})[1] == {"a": 900}
    assert fleet.by_model(50.0, {"a": 50.0})[1] == {"a": 99}  # n1 10, n2 55 (p99), n3 99
    report("n3", 101.0, a={"p99": 12})    # a new report replaces the last
    assert fleet.by_model(50.0, {"a": 99.0, "z": 99.0})[1] == {"a": 55}


def test_a_store_error_answered_says_only_that_the_store_fails(start_coordinator, caplog):
    """A StoreUnavailable raised by any route answers 503 with the generic text; the
    full text (PostgreSQL's host and user) goes to the coordinator's log."""
    from agent.coordinator.store import StoreUnavailable

    co = start_coordinator()

    def down(*args, **kwargs):
        raise StoreUnavailable("PostgreSQL at db.internal:5432 user=fleet failed")

    co.co.store.models = down
    with caplog.at_level("WARNING"):
        status, doc = co.request("GET", "/v1/models")
    assert status == 503 and "store is failing" in doc["error"], doc
    assert "db.internal" not in json.dumps(doc)
    assert "db.internal" in caplog.text


def test_max_nodes_refuses_new_nodes_only(start_coordinator):
    """Past ``max_nodes``, a new node's report gets 507 naming max_nodes; the nodes the
    coordinator keeps report as before, and deleting one makes room."""
    co = start_coordinator(max_nodes=2)
    assert co.request("POST", "/v1/nodes/edge-1/report", REPORT)[0] == 200
    assert co.request("POST", "/v1/nodes/edge-2/report", REPORT)[0] == 200
    status, doc = co.request("POST", "/v1/nodes/edge-3/report", REPORT)
    assert status == 507 and "max_nodes 2" in doc["error"] and "edge-3" in doc["error"]
    assert co.request("POST", "/v1/nodes/edge-1/report", REPORT)[0] == 200
    assert co.request("DELETE", "/v1/nodes/edge-2")[0] == 200
    assert co.request("POST", "/v1/nodes/edge-3/report", REPORT)[0] == 200
    assert sorted(n["name"] for n in co.request("GET", "/v1/nodes")[1]) == ["edge-1", "edge-3"]


@pytest.mark.parametrize("name", ["edge-1%0A", "edge-1%0D", "edge-1%0A%0A"])
def test_a_node_name_is_matched_whole(start_coordinator, name):
    """A name ending in a newline is refused with 400 (``$`` would let it through)."""
    co = start_coordinator()
    status, doc = co.request("POST", f"/v1/nodes/{name}/report", REPORT)
    assert status == 400 and "node name" in doc["error"], doc
    assert co.request("GET", "/v1/nodes")[1] == []


def test_a_lease_is_exact_in_memory_and_written_once_lease_write_s_old(start_coordinator):
    """``lease_write_s`` 15: a node's leases move its ``last_seen`` in memory (what
    reports and leases are answered from, ``GET /v1/nodes``) to the lease's time; the
    store's moves only once the one written is 15 s old; a stop writes the last."""
    clock = Clock(1000.0)
    co = start_coordinator(clock=clock, lease_write_s=15)
    status, answer = co.request("POST", "/v1/nodes/edge-1/report",
                                {**REPORT, "report_id": 7})
    assert status == 200
    lease = {"report": 7, "answer": answer["answer"]}
    for t, written in ((1005.0, 1000.0), (1014.0, 1000.0), (1015.0, 1015.0),
                       (1020.0, 1015.0)):
        clock.t = t
        assert co.request("POST", "/v1/nodes/edge-1/lease", lease) == (
            200, {"answer": lease["answer"]})  # the answer stands
        co.co.writer.flush()
        assert co.co.fleet.nodes["edge-1"].last_seen == t  # exact in memory
        assert co.co.store.node("edge-1").last_seen == written
        status, [node] = co.request("GET", "/v1/nodes")
        assert status == 200 and node["age_s"] == 0.0
    path = co.co.config.database
    co.close()
    assert Store(path).node("edge-1").last_seen == 1020.0  # the stop wrote it
