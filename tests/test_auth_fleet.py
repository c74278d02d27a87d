"""Tokens and node identity end to end on loopback: a real coordinator with two report
workers (their own processes, on its port), real agents, rotation by SIGHUP under load,
and sentinel secrets that must appear nowhere."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from agent.credentials import new_token, token_hash
from tests.helpers import REPORT, Agent, CoordinatorProcess, add_mlp, v2_body, wait_for

NODES = [f"edge-{i}" for i in range(1, 6)]


def entry(name, token, scopes, **more) -> dict:
    return {"name": name, "sha256": token_hash(token), "scopes": scopes, **more}


def write(path: Path, entries: list[dict]) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


def call(port, method, path, body=None, token=None, conn=None) -> tuple[int, object]:
    """One request (a new connection unless ``conn``: then on that keep-alive one)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = conn.getresponse()
        raw = answer.read()
        try:
            return answer.status, json.loads(raw)
        except ValueError:
            return answer.status, raw.decode()
    finally:
        if own:
            conn.close()


def listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def fleet(tmp_path, tokens: Path, **config) -> CoordinatorProcess:
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2,
                            auth={"token_file": str(tokens)}, reactive_interval_s=3600,
                            **config)
    wait_for(lambda: len(listeners(co.port)) == 2 and co.proc.pid not in listeners(co.port),
             60, "two workers listen, and the coordinator no longer does")
    return co


@pytest.fixture
def node_tokens():
    return {n: new_token() for n in NODES}


def test_a_node_writes_only_its_own_report_through_every_listener(tmp_path, node_tokens):
    admin = new_token()
    tokens = write(tmp_path / "tokens.yaml", [entry("ops", admin, ["admin"])] + [
        entry(n, t, ["report"], node=n) for n, t in node_tokens.items()])
    co = fleet(tmp_path, tokens)
    try:
        edge1 = node_tokens["edge-1"]
        assert call(co.port, "POST", "/v1/nodes/edge-1/report", REPORT, edge1)[0] == 200
        # fresh connections: the kernel spreads them over both workers
        spoofed = [call(co.port, "POST", "/v1/nodes/edge-2/report", REPORT, edge1)
                   for _ in range(100)]
        assert {s for s, _ in spoofed} == {403}  # 0 successes, never throttled to 429
        assert all("only its own report" in d["error"] for _, d in spoofed)
        for method, path, body in (("PUT", "/v1/models/m", {"slo_ms": 100}),
                                   ("DELETE", "/v1/nodes/edge-1", None),
                                   ("DELETE", "/v1/nodes/edge-2", None),
                                   ("POST", "/v1/plan", None)):
            for _ in range(5):
                assert call(co.port, method, path, body, edge1)[0] == 403, (method, path)
        # a worker hands what it answered over every BATCH_S: edge-1, and only edge-1
        nodes = wait_for(lambda: (lambda a: a[1] if a[0] == 200 and a[1] else None)(
            call(co.port, "GET", "/v1/nodes", token=admin)), 5, "edge-1 handed over")
        assert [n["name"] for n in nodes] == ["edge-1"]
        # the workers' refusals are counted in the coordinator's /metrics
        text = wait_for(lambda: (lambda t: t if 'reason="forbidden"} 120' in t else None)(
            call(co.port, "GET", "/metrics", token=admin)[1]), 5, "the workers' counts")
        assert "edgeagent_coordinator_auth_failures_total" in text
    finally:
        co.stop()


def test_rotation_under_load_by_sighup(tmp_path, node_tokens):
    """Reporters on keep-alive connections and a reading client, while a node's token
    and the read token are rotated (both listed, SIGHUP; the old removed, SIGHUP):
    every answer 200, and the removed tokens fail on every listener within 1 s."""
    admin, read_old, read_new = new_token(), new_token(), new_token()
    edge1_new = new_token()
    path = tmp_path / "tokens.yaml"

    def tokens(read: list[str], edge1: list[str]) -> Path:
        return write(path, [entry("ops", admin, ["admin"])]
                     + [entry(f"read{i}", t, ["read"]) for i, t in enumerate(read)]
                     + [entry(f"edge-1-{i}", t, ["report"], node="edge-1")
                        for i, t in enumerate(edge1)]
                     + [entry(n, t, ["report"], node=n) for n, t in node_tokens.items()
                        if n != "edge-1"])

    co = fleet(tmp_path, tokens([read_old], [node_tokens["edge-1"]]))
    current = {"read": read_old, "edge-1": node_tokens["edge-1"]}
    stop, answers = threading.Event(), []

    def reporter(node):
        conn = http.client.HTTPConnection("127.0.0.1", co.port, timeout=30)
        while not stop.is_set():
            token = current.get(node, node_tokens[node])
            answers.append((node, call(co.port, "POST", f"/v1/nodes/{node}/report",
                                       REPORT, token, conn)[0]))
            time.sleep(0.05)
        conn.close()

    def reader():
        while not stop.is_set():
            answers.append(("read", call(co.port, "GET", "/v1/nodes",
                                         token=current["read"])[0]))
            time.sleep(0.05)

    threads = [threading.Thread(target=reporter, args=(n,)) for n in NODES]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        tokens([read_old, read_new], [node_tokens["edge-1"], edge1_new])  # overlap
        co.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: call(co.port, "GET", "/v1/nodes", token=read_new)[0] == 200, 5,
                 "the new read token works")
        wait_for(lambda: all(call(co.port, "POST", "/v1/nodes/edge-1/report", REPORT,
                                  edge1_new)[0] == 200 for _ in range(6)), 5,
                 "the new node token works on every listener")
        current.update({"read": read_new, "edge-1": edge1_new})
        time.sleep(1.0)
        tokens([read_new], [edge1_new])  # the old ones removed
        removed_at = time.monotonic()
        co.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: all(call(co.port, "POST", "/v1/nodes/edge-1/report", REPORT,
                                  node_tokens["edge-1"])[0] == 401 for _ in range(6))
                 and call(co.port, "GET", "/v1/nodes", token=read_old)[0] == 401,
                 5, "the removed tokens fail")
        took = time.monotonic() - removed_at
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        co.stop()
    assert took < 1.0, f"the removed tokens still worked {took:.2f} s after SIGHUP"
    assert len(answers) > 100 and {s for _, s in answers} == {200}, \
        sorted({(n, s) for n, s in answers if s != 200})


def test_agent_rotation_under_inference_load(repo, tmp_path):
    """An inference client on a keep-alive connection to an agent that protects
    inference, while its token is rotated by SIGHUP: every answer 200; the removed
    token fails within 1 s."""
    add_mlp(repo, "m")
    old, new = new_token(), new_token()
    path = tmp_path / "tokens.yaml"
    write(path, [entry("old", old, ["infer"])])
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"auth": {"token_file": str(path), "protect": ["infer"]}}))
    agent = Agent(repo, tmp_path / "data", "--config", str(config))
    port = int(agent.url.rsplit(":", 1)[1])
    body = v2_body([[1, 2, 3, 4]])
    current, stop, answers = {"t": old}, threading.Event(), []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not stop.is_set():
            answers.append(call(port, "POST", "/v2/models/m/infer", body, current["t"],
                                conn)[0])
        conn.close()

    thread = threading.Thread(target=client)
    thread.start()
    try:
        time.sleep(1.0)
        write(path, [entry("old", old, ["infer"]), entry("new", new, ["infer"])])
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: call(port, "POST", "/v2/models/m/infer", body, new)[0] == 200, 5,
                 "the new token works")
        current["t"] = new
        time.sleep(0.5)
        write(path, [entry("new", new, ["infer"])])
        removed_at = time.monotonic()
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: call(port, "POST", "/v2/models/m/infer", body, old)[0] == 401, 5,
                 "the old token fails")
        took = time.monotonic() - removed_at
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(30)
        agent.stop()
    assert took < 1.0
    assert len(answers) > 50 and set(answers) == {200}


def _cmdlines(pids: set[int]) -> str:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            pass
    return "\n".join(out)


def _family(pid: int) -> set[int]:
    proc = psutil.Process(pid)
    return {pid, *(c.pid for c in proc.children(recursive=True))}


def test_sentinel_secrets_appear_nowhere(repo, tmp_path):
    """Tokens (admin, read, a join token and the node credential it brings) at debug
    level through a coordinator with report workers and an agent that joins it: none
    shows in any log, /metrics, error body, /v1/coordinator or process command line."""
    add_mlp(repo, "m")
    admin, read = "SENTINEL-ADMIN-" + new_token(), "SENTINEL-READ-" + new_token()
    agent_admin = "SENTINEL-AGENT-" + new_token()
    tokens = write(tmp_path / "tokens.yaml", [entry("ops", admin, ["admin"]),
                                              entry("dash", read, ["read"])])
    co = fleet(tmp_path, tokens, log_level="debug")
    status, made = call(co.port, "POST", "/v1/join-tokens", {"node": "edge-7"}, admin)
    assert status == 201
    join_file, cred_file = tmp_path / "join-token", tmp_path / "node" / "credential"
    join_file.write_text(made["token"])
    (tmp_path / "agent-admin").write_text(agent_admin)
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({
        "log_level": "debug", "admin_token_file": str(tmp_path / "agent-admin"),
        "coordinator": {"url": co.url, "node_name": "edge-7", "report_interval_s": 0.2,
                        "join_token_file": str(join_file),
                        "credential_file": str(cred_file)}}))
    agent = Agent(repo, tmp_path / "data", "--config", str(config))
    try:
        wait_for(lambda: cred_file.exists(), 20, "the agent joined")
        node_token = cred_file.read_text().strip()
        assert oct(cred_file.stat().st_mode & 0o777) == "0o600"
        wait_for(lambda: [n["name"] for n in call(co.port, "GET", "/v1/nodes",
                                                  token=read)[1]] == ["edge-7"], 20,
                 "the node reports with its own credential")
        secrets = [admin, read, agent_admin, made["token"], node_token]
        aport = int(agent.url.rsplit(":", 1)[1])
        seen = []
        for secret in secrets:  # near misses and the real ones, everywhere
            for token in (secret + "x", secret[:-1], secret):
                for port, method, path in (
                        (co.port, "GET", "/v1/nodes"), (co.port, "PUT", "/v1/models/m"),
                        (co.port, "POST", "/v1/nodes/edge-2/report"),
                        (co.port, "POST", "/v1/join"), (aport, "POST", "/v1/cache/m/evict"),
                        (aport, "GET", "/v1/coordinator"), (aport, "GET", "/metrics")):
                    seen.append(str(call(port, method, path, {"slo_ms": 1}, token)))
        seen.append(str(call(co.port, "GET", "/metrics", token=admin)))
        seen.append(str(call(aport, "GET", "/metrics", token=agent_admin)))
        seen.append(str(call(aport, "GET", "/v1/coordinator", token=agent_admin)))
        seen.append(_cmdlines(_family(co.proc.pid) | _family(agent.proc.pid)))
        assert len(_family(co.proc.pid)) >= 3  # the coordinator and its two workers
    finally:
        agent.stop()
        co.stop()
    seen.append(co.log_path.read_text())
    seen.append("".join(agent.err))
    text = "\n".join(seen)
    assert "auth failed" in text and "DEBUG" in text  # the logs were at debug level
    for secret in secrets:
        assert secret not in text
        assert secret[:-1] not in text and secret[8:] not in text


def test_workers_pass_the_real_peer_on_for_the_throttle(tmp_path):
    """Through the report workers, 50 bad tokens from 127.0.0.2 on fresh connections:
    429 after the burst (the coordinator throttles the peer the workers name, which a
    client cannot fake), while a good reader on 127.0.0.1 gets 200 throughout."""
    read = new_token()
    co = fleet(tmp_path, write(tmp_path / "tokens.yaml", [entry("dash", read, ["read"])]))

    def from_2(headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", co.port, timeout=30,
                                          source_address=("127.0.0.2", 0))
        conn.request("GET", "/v1/nodes", headers={
            "Authorization": f"Bearer {new_token()}", **(headers or {})})
        answer = conn.getresponse()
        answer.read()
        conn.close()
        return answer.status, answer.getheader("Retry-After")

    try:
        bad, good = [], []
        started = time.monotonic()
        for _ in range(50):
            bad.append(from_2())
            good.append(call(co.port, "GET", "/v1/nodes", token=read)[0])
        took = time.monotonic() - started
        refused = [s for s, _ in bad]
        # a burst of 20 failures, then 2 a second (however slowly a loaded box ran)
        assert refused[:20] == [401] * 20 and set(refused) == {401, 429}
        assert refused.count(401) <= 20 + 2 * took + 1, (took, refused)
        assert all(int(r) >= 1 for s, r in bad if s == 429)
        assert set(good) == {200}
        # a client's own peer header is dropped by the worker: still throttled (as
        # 127.0.0.9 it would have a fresh burst of 20: five 401s)
        spoofed = [from_2({"X-Edgeagent-Peer": "127.0.0.9",
                           "X-Edgeagent-Forward-Key": "guess"})[0] for _ in range(5)]
        assert 429 in spoofed, spoofed
    finally:
        co.stop()


def test_over_mtls_a_node_certificate_posts_only_its_own_report(tmp_path):
    """mTLS through two report workers: a node's certificate (DNS SAN edge-1) posts its
    report and gets 403 every time for another node's and for the admin endpoints."""
    from agent.tls import client_context
    from tests.helpers import issue_cert, make_ca

    ca = make_ca(tmp_path, "fleet-ca")
    server = issue_cert(ca, tmp_path, "server")
    node = issue_cert(ca, tmp_path, "edge-1", hosts=("edge-1",))
    admin = new_token()
    tokens = write(tmp_path / "tokens.yaml", [entry("ops", admin, ["admin"])])
    context = client_context(ca.cert_file, node.cert_file, node.key_file)
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2, context=context,
                            auth={"token_file": str(tokens)}, reactive_interval_s=3600,
                            tls={"cert_file": str(server.cert_file),
                                 "key_file": str(server.key_file),
                                 "client_ca_file": str(ca.cert_file),
                                 "client_auth": "require"})

    def call_tls(method, path, body=None, token=None):
        conn = http.client.HTTPSConnection("127.0.0.1", co.port, context=context,
                                           timeout=30)
        headers = {"Content-Type": "application/json",
                   **({"Authorization": f"Bearer {token}"} if token else {})}
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None,
                         headers)
            return conn.getresponse().status
        finally:
            conn.close()

    try:
        wait_for(lambda: len(listeners(co.port)) == 2, 60, "two workers listen")
        assert call_tls("POST", "/v1/nodes/edge-1/report", REPORT) == 200
        spoofed = [call_tls("POST", "/v1/nodes/edge-2/report", REPORT) for _ in range(60)]
        assert set(spoofed) == {403}  # 0 successes, on whichever listener
        for method, path, body in (("PUT", "/v1/models/m", {"slo_ms": 100}),
                                   ("DELETE", "/v1/nodes/edge-1", None),
                                   ("POST", "/v1/plan", None)):
            assert {call_tls(method, path, body) for _ in range(4)} == {403}, path
        assert call_tls("GET", "/v1/nodes", token=admin) == 200  # a token goes first
    finally:
        co.stop()


def _call_tls(port, context, method, path, body=None, token=None) -> int:
    """One request on a fresh mTLS connection (so the kernel spreads them over the
    workers); its status."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    headers = {"Content-Type": "application/json",
               **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def test_240_nodes_over_mtls_each_post_only_their_own_report(tmp_path):
    """The issue's floor: 240 nodes, each with its own certificate (issued here), through
    two report workers: every node's own report 200; edge-1 posting as edge-2 over 120
    fresh connections and every node posting as its neighbour: 403 every time; a node
    certificate: 403 on the admin endpoints; the fleet lists exactly the 240."""
    from agent.tls import client_context
    from tests.helpers import issue_cert, make_ca

    ca = make_ca(tmp_path, "fleet-ca")
    server = issue_cert(ca, tmp_path, "server")
    names = [f"edge-{i}" for i in range(1, 241)]
    certs = tmp_path / "nodes"
    certs.mkdir()
    contexts = {}
    for name in names:
        cert = issue_cert(ca, certs, name, hosts=(name,))
        contexts[name] = client_context(ca.cert_file, cert.cert_file, cert.key_file)
    admin = new_token()
    tokens = write(tmp_path / "tokens.yaml", [entry("ops", admin, ["admin"])])
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2,
                            context=contexts["edge-1"], auth={"token_file": str(tokens)},
                            reactive_interval_s=3600,
                            tls={"cert_file": str(server.cert_file),
                                 "key_file": str(server.key_file),
                                 "client_ca_file": str(ca.cert_file),
                                 "client_auth": "require"})
    try:
        wait_for(lambda: len(listeners(co.port)) == 2, 60, "two workers listen")
        own = {n: _call_tls(co.port, contexts[n], "POST", f"/v1/nodes/{n}/report", REPORT)
               for n in names}
        assert set(own.values()) == {200}, {n: s for n, s in own.items() if s != 200}
        spoofed = [_call_tls(co.port, contexts["edge-1"], "POST", "/v1/nodes/edge-2/report",
                             REPORT) for _ in range(120)]
        assert spoofed.count(403) == 120, sorted(set(spoofed))  # 0 successes
        neighbours = [_call_tls(co.port, contexts[n], "POST",
                                f"/v1/nodes/{names[(i + 1) % len(names)]}/report", REPORT)
                      for i, n in enumerate(names)]
        assert neighbours.count(403) == len(names), sorted(set(neighbours))
        for method, path, body in (("PUT", "/v1/models/m", {"slo_ms": 100}),
                                   ("DELETE", "/v1/nodes/edge-1", None),
                                   ("DELETE", "/v1/nodes/edge-2", None),
                                   ("POST", "/v1/plan", None)):
            for name in ("edge-1", "edge-120", "edge-240"):
                for _ in range(3):
                    assert _call_tls(co.port, contexts[name], method, path, body) == 403, \
                        (name, method, path)

        def listed():
            conn = http.client.HTTPSConnection("127.0.0.1", co.port,
                                               context=contexts["edge-1"], timeout=30)
            try:
                conn.request("GET", "/v1/nodes", headers={"Authorization": f"Bearer {admin}"})
                answer = conn.getresponse()
                nodes = json.loads(answer.read())
            finally:
                conn.close()
            return sorted(n["name"] for n in nodes) if len(nodes) == len(names) else None
        assert wait_for(listed, 10, "all 240 handed over") == sorted(names)
    finally:
        co.stop()


def test_the_database_password_appears_nowhere(postgres, tmp_path):
    """A coordinator (two report workers, debug logs) whose PostgreSQL URL carries a
    sentinel password, read from its config file: not in any log line, HTTP answer
    (health, reports, /metrics, errors, while the database is down too) or the
    command line of the coordinator and its workers; nor in what a coordinator whose
    database cannot be reached says as it exits."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    password = "SENTINEL-DBPW-" + new_token()
    url = postgres.new_database().replace("postgresql://postgres@",
                                          f"postgresql://postgres:{password}@")
    admin = "SENTINEL-ADMIN-" + new_token()
    tokens = write(tmp_path / "tokens.yaml", [entry("ops", admin, ["admin"])])
    co = CoordinatorProcess(url, tmp_path / "co", report_workers=2, log_level="debug",
                            auth={"token_file": str(tokens)}, reactive_interval_s=3600)
    seen = []
    try:
        wait_for(lambda: len(listeners(co.port)) == 2, 60, "two workers listen")
        seen.append(_cmdlines(_family(co.proc.pid)))
        assert len(_family(co.proc.pid)) >= 3  # the coordinator and its two workers

        def everything():
            for method, path, body, token in (
                    ("GET", "/v1/health", None, None),
                    ("POST", "/v1/nodes/edge-1/report", REPORT, admin),
                    ("POST", "/v1/nodes/edge-1/report", {"capacity": "x"}, admin),
                    ("GET", "/v1/nodes", None, admin), ("GET", "/v1/nodes/none", None, admin),
                    ("PUT", "/v1/models/m", {"slo_ms": 100}, admin),
                    ("PUT", "/v1/models/m", {"slo_ms": "x"}, admin),
                    ("POST", "/v1/plan", None, admin), ("GET", "/metrics", None, admin),
                    ("GET", "/v1/nodes", None, "bad")):
                seen.append(str(call(co.port, method, path, body, token)))
        everything()
        postgres.stop("fast")  # the store fails: what the errors say
        try:
            everything()
            time.sleep(1.0)  # the workers hand reports over, and fail to store them
            everything()
        finally:
            postgres.start_if_stopped()
        assert any("50" in s[:5] for s in seen), "the store's failure was answered"
    finally:
        co.stop()
    seen.append(co.log_path.read_text())
    # a coordinator that cannot reach its database at all exits, saying why
    unreachable = tmp_path / "unreachable.yaml"
    unreachable.write_text(json.dumps({
        "port": 0, "state_dir": str(tmp_path / "u"), "log_level": "debug",
        "report_workers": 2, "store": f"postgresql://edge:{password}@127.0.0.1:1/fleet"}))
    ended = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()",
                            "coordinator", "serve", "--config", str(unreachable)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert ended.returncode != 0
    seen.append(ended.stdout + ended.stderr)
    text = "\n".join(seen)
    assert "DEBUG" in text and "127.0.0.1" in ended.stdout + ended.stderr
    assert password not in text and password[8:] not in text and admin not in text
