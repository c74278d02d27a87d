"""Report workers (``report_workers: N``): real coordinator processes on SQLite, with
their worker processes on the same port, hundreds of nodes each on a connection of its
own (the kernel spreads connections over the listeners), concurrent clients, hostile
reports, a worker killed, and a stop that must lose no answered report."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.helpers import REPORT, CoordinatorProcess, wait_for

TOKEN = "s3cret-token-0123456789abcdef0123456789abcdef"


def call(port: int, method: str, path: str, body=None, token: str | None = TOKEN,
         raw: bytes | None = None, source: str = "127.0.0.1") -> tuple[int, dict | list]:
    """One request on a new connection (so it lands on any of the port's listeners),
    from the loopback address ``source``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30,
                                      source_address=(source, 0))
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        conn.request(method, path, data, headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def workers(co: CoordinatorProcess) -> list[psutil.Process]:
    """The coordinator's report workers: its children that listen on its port (the
    others plan, or track multiprocessing's resources)."""
    on_port = listeners(co.port)
    return [c for c in psutil.Process(co.proc.pid).children() if c.pid in on_port]


def holders(port: int, local_ports: set[int]) -> dict[int, int]:
    """pid -> how many of the client connections from ``local_ports`` it serves."""
    held: dict[int, int] = {}
    for c in psutil.net_connections("tcp"):
        if c.laddr.port == port and c.raddr and c.raddr.port in local_ports and c.pid:
            held[c.pid] = held.get(c.pid, 0) + 1
    return held


@pytest.fixture
def coordinator(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2,
                            admin_token_file=str(token), reactive_interval_s=3600)
    wait_for(lambda: len(listeners(co.port)) == 2 and co.proc.pid not in listeners(co.port),
             60, "two workers listen, and the coordinator no longer does")
    yield co
    co.stop()


def test_workers_answer_reports_and_the_coordinator_knows_every_node(coordinator, tmp_path):
    co, port = coordinator, coordinator.port
    # the workers own the port: the coordinator's loop (plans, the dashboard's reads of
    # the whole fleet) delays no report
    assert len(workers(co)) == 2 and listeners(port) == {w.pid for w in workers(co)}
    for m in ("a", "b"):
        assert call(port, "PUT", f"/v1/models/{m}", {"slo_ms": 100})[0] == 201
    nodes = [f"edge-{i}" for i in range(240)]

    # every node on a keep-alive connection of its own, reporting concurrently
    conns = {n: http.client.HTTPConnection("127.0.0.1", port, timeout=30) for n in nodes}

    def send(node: str, body: dict) -> tuple[int, dict]:
        conns[node].request("POST", f"/v1/nodes/{node}/report", json.dumps(body),
                            {"Authorization": f"Bearer {TOKEN}",
                             "Content-Type": "application/json"})
        answer = conns[node].getresponse()
        return answer.status, json.loads(answer.read())

    with ThreadPoolExecutor(24) as pool:
        first = list(pool.map(lambda n: send(n, REPORT), nodes))
        assert {s for s, _ in first} == {200}
        assert all(d["node"] == n for n, (_, d) in zip(nodes, first))
        # the kernel spread the connections: both workers hold some
        served = holders(port, {c.sock.getsockname()[1] for c in conns.values()})
        assert set(served) == listeners(port) and sum(served.values()) == len(nodes), served

        # what the workers answered reaches the coordinator: every node is listed
        wait_for(lambda: len(call(port, "GET", "/v1/nodes")[1]) == len(nodes), 10,
                 "every node listed")
        status, plan = call(port, "POST", "/v1/plan")  # forwarded when a worker takes it
        assert status == 200 and plan["assignment"]

        def planned(node: str) -> bool:
            status, directives = send(node, REPORT)
            return status == 200 and directives["plan_id"] == plan["id"]

        # the plan reached every worker: every node's next answers carry it
        wait_for(lambda: all(pool.map(planned, nodes)), 10, "the plan in every answer")
        answers = dict(zip(nodes, pool.map(lambda n: send(n, REPORT)[1], nodes)))
        # the coordinator shows what each node was told (handed over within BATCH_S)
        wait_for(lambda: all(call(port, "GET", f"/v1/nodes/{n}")[1]["directives"]
                             == answers[n] for n in nodes[:40]), 5, "the answers shown")
        assert sum(len(d["workers"]) for d in answers.values()) == sum(
            n for row in plan["assignment"].values() for n in row.values() if n)

        # a last round, marked by its interval, then a stop: nothing answered is lost
        last = {**REPORT, "interval_s": 7.0}
        assert {s for s, _ in pool.map(lambda n: send(n, last), nodes)} == {200}
    for conn in conns.values():
        conn.close()
    co.stop()
    with sqlite3.connect(tmp_path / "co" / "coordinator.sqlite3") as db:
        stored = {name: json.loads(report)["interval_s"]
                  for name, report in db.execute("SELECT name, report FROM nodes")}
    assert stored == {n: 7.0 for n in nodes}


def test_hostile_reports_get_the_coordinators_answers_from_every_listener(coordinator):
    port = coordinator.port
    with ThreadPoolExecutor(8) as pool:  # fresh connections: every listener answers some
        # from another address: a throttled peer's valid token is refused too
        no_token = list(pool.map(lambda i: call(port, "POST", f"/v1/nodes/n{i}/report",
                                                REPORT, token=None, source="127.0.0.2"),
                                 range(30)))
        wrong = list(pool.map(lambda i: call(port, "POST", f"/v1/nodes/n{i}/report",
                                             REPORT, token="nope", source="127.0.0.2"),
                              range(30)))
        bad_json = list(pool.map(lambda i: call(port, "POST", f"/v1/nodes/n{i}/report",
                                                raw=b"{not json"), range(30)))
        bad_field = list(pool.map(lambda i: call(
            port, "POST", f"/v1/nodes/n{i}/report",
            {**REPORT, "capacity": {"cores": -1, "cpu_memory_bytes": 1}}), range(30)))
        bad_name = list(pool.map(lambda i: call(port, "POST", "/v1/nodes/a%20b/report",
                                                REPORT), range(30)))
        admin = list(pool.map(lambda i: call(port, "GET", "/v1/nodes", token="nope",
                                             source="127.0.0.2"), range(30)))
    # one peer failing 90 times: 401s, then 429s once its burst of failures is spent
    refused = [s for s, _ in no_token + wrong + admin]
    assert set(refused) == {401, 429} and refused.count(401) >= 20
    assert {s for s, _ in bad_json} == {400}
    assert all("not valid JSON" in d["error"] for _, d in bad_json)
    assert {s for s, _ in bad_field} == {400}
    assert all("cores" in d["error"] for _, d in bad_field)
    assert {s for s, _ in bad_name} == {400}
    # a body over the 8 MiB limit: the coordinator's JSON 413 from every listener
    huge = b'{"capacity": {"cores": 1, "cpu_memory_bytes": 1}, "pad": "' + \
        b"x" * (9 * 2**20) + b'"}'
    too_big = [call(port, "POST", f"/v1/nodes/big{i}/report", raw=huge) for i in range(9)]
    assert {s for s, _ in too_big} == {413}
    assert all("over the limit of 8388608 bytes (max_request_size)" in d["error"]
               for _, d in too_big)
    assert call(port, "GET", "/v1/nodes") == (200, [])  # nothing bad was recorded
    assert call(port, "GET", "/v1/no-such-thing")[0] == 404  # forwarded, answered there


def test_a_killed_worker_is_replaced_and_reports_go_on(coordinator):
    co, port = coordinator, coordinator.port
    victim = workers(co)[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    # meanwhile the port still answers every report (its other listeners)
    for i in range(30):
        assert call(port, "POST", f"/v1/nodes/after-{i}/report", REPORT)[0] == 200
    wait_for(lambda: len(workers(co)) == 2 and victim.pid not in {
        w.pid for w in workers(co)} and len(listeners(port)) == 2, 20, "a new worker")
    for i in range(30):
        assert call(port, "POST", f"/v1/nodes/again-{i}/report", REPORT)[0] == 200
    wait_for(lambda: len(call(port, "GET", "/v1/nodes")[1]) == 60, 10, "all 60 listed")
    start = time.monotonic()
    co.stop()  # the workers stop with it
    assert time.monotonic() - start < 15 and co.proc.returncode == 0
    assert not psutil.pid_exists(victim.pid) or psutil.Process(victim.pid).status() == \
        psutil.STATUS_ZOMBIE


def test_a_lease_reaches_the_coordinator_after_the_report_it_renews(tmp_path):
    """A new node's first full report and the lease it renews right after, answered by a
    worker while its hand-over of the batch before them waits (the coordinator stopped,
    SIGSTOP, so the pipe to it fills): the coordinator gets the report before the
    lease, knows the node when the lease comes, and writes it (``last_seen`` at the
    lease, in memory and in the store after the stop), as the node was told 200."""
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=1,
                            reactive_interval_s=3600)
    conn = None
    try:
        wait_for(lambda: len(listeners(co.port)) == 1 and co.proc.pid not in listeners(
            co.port), 60, "the worker listens, and the coordinator no longer does")
        conn = http.client.HTTPConnection("127.0.0.1", co.port, timeout=30)

        def post(path: str, body: dict) -> tuple[int, dict]:
            conn.request("POST", path, json.dumps(body),
                         {"Content-Type": "application/json"})
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read())

        os.kill(co.proc.pid, signal.SIGSTOP)
        try:
            # more answered reports than the pipe holds: the hand-over waits on them
            for i in range(400):
                assert post(f"/v1/nodes/herd-{i}/report", REPORT)[0] == 200
            time.sleep(1.0)
            status, first = post("/v1/nodes/late/report", {**REPORT, "report_id": 7})
            assert status == 200
            time.sleep(0.05)
            sent = time.time()
            assert post("/v1/nodes/late/lease", {"report": 7, "answer": first["answer"]}) \
                == (200, {"answer": first["answer"]})
        finally:
            os.kill(co.proc.pid, signal.SIGCONT)

        def renewed() -> bool:
            status, node = call(co.port, "GET", "/v1/nodes/late", token=None)
            return status == 200 and node["last_seen"] > node["last_report"]
        wait_for(renewed, 10, "the lease recorded after the report")
        assert len(call(co.port, "GET", "/v1/nodes", token=None)[1]) == 401
    finally:
        if conn is not None:
            conn.close()
        co.stop()
    with sqlite3.connect(tmp_path / "co" / "coordinator.sqlite3") as db:
        last_seen, reported = db.execute(
            "SELECT last_seen, reported FROM nodes WHERE name = 'late'").fetchone()
    assert reported < sent <= last_seen


def metric(port: int, name: str, token: str | None = TOKEN) -> float:
    """One sample of the coordinator's ``/metrics`` (``name`` with its labels)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics",
                     headers={"Authorization": f"Bearer {token}"} if token else {})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(name + " "))


def flood(port: int, nodes: int, seconds: float) -> list[tuple[int, str | None]]:
    """``nodes`` nodes, each on a kept connection of its own, reporting again as soon as
    answered for ``seconds`` (a herd): every (status, Retry-After) they got."""
    import asyncio

    body = json.dumps(REPORT).encode()
    seen: list[tuple[int, str | None]] = []

    async def node(i: int, until: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = (f"POST /v1/nodes/herd-{i}/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                   f"\r\n").encode() + body
        while time.monotonic() < until:
            writer.write(request)
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if line)
            await reader.readexactly(int(fields["Content-Length"]))
            seen.append((int(head[9:12]), fields.get("Retry-After")))
        writer.close()

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(node(i, until) for i in range(nodes)))

    asyncio.run(main())
    return seen


def test_a_flooded_worker_refuses_early_with_retry_after(tmp_path):
    """400 nodes reporting as fast as one report worker answers: its loop always has
    work and falls behind, and it refuses reports early (503 with Retry-After) rather
    than answering them all late; every answer is a 200 or such a refusal, on
    connections it keeps. The coordinator's ``/metrics`` counts the refusals, the
    answered reports and the worker's CPU."""
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=1, report_shed_lag_ms=20,
                            reactive_interval_s=3600)
    try:
        wait_for(lambda: len(listeners(co.port)) == 1 and co.proc.pid not in listeners(
            co.port), 60, "the worker listens, and the coordinator no longer does")
        seen = flood(co.port, 400, 4.0)
        statuses = {answer: seen.count(answer) for answer in set(seen)}
        assert set(statuses) == {(200, None), (503, "5")}, statuses
        prefix = "edgeagent_coordinator_"

        def counted() -> bool:  # the worker tells its counts every second: its last
            # refusal may be told before its last answers are
            return metric(co.port, prefix + 'reports_total{answer="refused"}', None) \
                == statuses[(503, "5")] and metric(
                    co.port, prefix + 'reports_total{answer="answered"}', None) \
                == statuses[(200, None)]
        wait_for(counted, 10, "the refusals and the answers counted")
        assert metric(co.port, prefix + 'cpu_seconds_total{part="report_workers"}', None) > 0
    finally:
        co.stop()


def test_serve_flag_starts_workers_and_a_bad_count_is_refused(tmp_path):
    import subprocess
    import sys

    cli = [sys.executable, "-c", "from agent.cli import main; main()", "coordinator",
           "serve", "--port", "0", "--state-dir", str(tmp_path / "s"),
           "--log-level", "warning"]
    refused = subprocess.run([*cli, "--report-workers", "-1"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--report-workers" in refused.stderr
    proc = subprocess.Popen([*cli, "--report-workers", "1"], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()  # the port the OS gave it, which its worker shares
        assert "listening on" in line, line
        port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
        wait_for(lambda: len(listeners(port)) == 1 and proc.pid not in listeners(port), 60,
                 "one worker, and not the coordinator")
        assert call(port, "GET", "/v1/health", token=None) == (200, {"ok": True,
                                                                     "planner": True})
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert listeners(port) == set()


def test_max_nodes_holds_with_workers_answering(tmp_path):
    """With report workers, a coordinator that keeps ``max_nodes`` has every worker
    pass reports from nodes outside its plan on to it: new nodes get 507 naming
    max_nodes from every listener, known nodes are answered as before."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2, max_nodes=3,
                            admin_token_file=str(token), reactive_interval_s=3600)
    try:
        wait_for(lambda: len(listeners(co.port)) == 2, 60, "two workers listen")
        for i in range(3):
            assert call(co.port, "POST", f"/v1/nodes/edge-{i}/report", REPORT)[0] == 200
        wait_for(lambda: len(call(co.port, "GET", "/v1/nodes")[1]) == 3, 10, "3 nodes kept")
        time.sleep(2.5)  # the coordinator tells its workers it is full (every second)
        for i in range(3, 13):  # new connections: every listener answers some
            status, doc = call(co.port, "POST", f"/v1/nodes/edge-{i}/report", REPORT)
            assert status == 507 and "max_nodes 3" in doc["error"], (status, doc)
        assert call(co.port, "POST", "/v1/nodes/edge-0/report", REPORT)[0] == 200
        assert sorted(n["name"] for n in call(co.port, "GET", "/v1/nodes")[1]) == [
            "edge-0", "edge-1", "edge-2"]
    finally:
        co.stop()


def test_a_coordinator_that_fails_after_starting_its_workers_stops_them_and_exits(tmp_path):
    """Its stdout closed before it announces (the bench or a shell that started it gone):
    the announcement fails, and the coordinator stops its workers and exits, where it
    used to wait at exit, for ever, for workers that only its stop message ends."""
    (tmp_path / "coordinator.yaml").write_text(json.dumps(
        {"port": 0, "state_dir": str(tmp_path), "log_level": "warning",
         "report_workers": 2, "plan_interval_s": 3600}))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from agent.cli import main; main()", "coordinator", "serve",
         "--config", str(tmp_path / "coordinator.yaml")], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    proc.stdout.close()  # the announcement will meet a closed pipe
    children: dict[int, psutil.Process] = {}  # every process it started, as seen
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                children.update((c.pid, c) for c in
                                psutil.Process(proc.pid).children(recursive=True))
            except psutil.Error:
                break
            time.sleep(0.02)
        assert proc.wait(timeout=30) != 0  # the broken pipe, not a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(children) >= 2  # (its workers were seen)
    _, alive = psutil.wait_procs(list(children.values()), timeout=10)
    assert alive == []  # its workers, planning process and resource tracker: all gone
