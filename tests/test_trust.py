"""Trust that ends (issue 39): a deleted node's client certificate is refused from the
next request on every listener of the coordinator (its report workers included, a
kept connection too), and a certificate issued after names the node again; no listener
speaks without authentication (the workers forward over a Unix socket only this user
reaches, which refuses what they did not forward); a throttled peer's correct token,
join token or gRPC token is refused while it is throttled, other peers unaffected; a
rebinding page is refused with and without tokens. Real processes (the coordinator,
its workers, an agent) and real TLS sockets, certificates made here."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import socket
import stat
import time
from pathlib import Path

import grpc
import psutil
import pytest
import yaml

from agent.security.authconfig import AuthSettings
from agent.security.credentials import new_token, token_hash
from agent.security.tls import client_context
from tests.helpers import (REPORT, Agent, CoordinatorProcess, add_mlp, call, issue_cert,
                           make_ca, mutual_tls, reserved_port, v2_body, wait_for)

ROW = v2_body([1.0, 2.0, 3.0, 4.0])


def _tokens(path: Path, entries: list[tuple[str, str, list[str]]]) -> Path:
    path.write_text(yaml.safe_dump([{"name": n, "sha256": token_hash(t), "scopes": s}
                                    for n, t, s in entries]))
    return path


def _listening_ports(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _workers(co: CoordinatorProcess) -> list[psutil.Process]:
    return [c for c in psutil.Process(co.proc.pid).children()
            if co.port in _listening_ports(c.pid)]


@pytest.fixture
def mtls_fleet(tmp_path):
    """A coordinator with two report workers on mutual TLS (client_auth: require) and an
    admin token; (coordinator, CA, admin token, the admin's and edge-1's contexts)."""
    ca = make_ca(tmp_path)
    server = issue_cert(ca, tmp_path, "server")
    ops = issue_cert(ca, tmp_path, "ops", hosts=("ops",))
    edge = issue_cert(ca, tmp_path, "edge-1", hosts=("edge-1",))
    admin = new_token()
    tokens = _tokens(tmp_path / "tokens.yaml", [("ops", admin, ["admin"])])
    admin_context = client_context(ca.cert_file, ops.cert_file, ops.key_file)
    co = CoordinatorProcess(
        None, tmp_path / "co", context=admin_context, report_workers=2,
        reactive_interval_s=3600, auth={"token_file": str(tokens)},
        tls=mutual_tls(server, ca))
    wait_for(lambda: len(_workers(co)) == 2 and co.port not in _listening_ports(co.proc.pid),
             60, "two workers listen, and the coordinator no longer does")
    yield co, ca, admin, admin_context, client_context(ca.cert_file, edge.cert_file,
                                                       edge.key_file)
    co.stop()


def test_a_deleted_nodes_certificate_is_refused_on_every_listener_from_the_next_request(
        mtls_fleet, tmp_path):
    co, ca, admin, admin_context, edge = mtls_fleet
    report = "/v1/nodes/edge-1/report"
    kept = http.client.HTTPSConnection("127.0.0.1", co.port, context=edge, timeout=30)
    assert call(co.port, "POST", report, REPORT, conn=kept)[0] == 200
    assert {call(co.port, "POST", report, REPORT, context=edge)[0] for _ in range(10)} == {200}
    wait_for(lambda: "edge-1" in [n["name"] for n in call(
        co.port, "GET", "/v1/nodes", token=admin, context=admin_context)[1]], 10,
        "edge-1 handed over to the coordinator")
    status, doc = call(co.port, "DELETE", "/v1/nodes/edge-1", token=admin,
                       context=admin_context)
    deleted = time.time()
    assert status == 200, doc
    # the next request: on the connection kept from before, and on fresh ones, which
    # the kernel spreads over both workers; a GET is forwarded to the coordinator
    status, doc = call(co.port, "POST", report, REPORT, conn=kept)
    assert status == 401 and "certificate of node 'edge-1' was revoked" in doc["error"], doc
    fresh = [call(co.port, "POST", report, REPORT, context=edge) for _ in range(20)]
    assert {s for s, _ in fresh} == {401}, fresh
    assert all("revoked" in d["error"] for _, d in fresh)
    status, doc = call(co.port, "GET", "/v1/nodes/edge-1", context=edge)
    assert status == 401 and "revoked" in doc["error"], doc
    kept.close()
    # a certificate issued after the deletion names edge-1 again
    not_before = dt.datetime.fromtimestamp(int(deleted) + 2, dt.timezone.utc)
    (tmp_path / "renewed").mkdir()
    renewed = issue_cert(ca, tmp_path / "renewed", "edge-1", hosts=("edge-1",),
                         not_before=not_before)
    time.sleep(max(0.0, not_before.timestamp() - time.time() + 0.5))
    context = client_context(ca.cert_file, renewed.cert_file, renewed.key_file)
    assert {call(co.port, "POST", report, REPORT, context=context)[0]
            for _ in range(10)} == {200}
    # each worker's word that it took the new credentials was taken as that alone
    assert "Traceback" not in co.log_path.read_text()


def test_no_listener_answers_without_authentication(mtls_fleet):
    """The coordinator listens on no TCP port once its workers own the public one; they
    forward over a Unix socket of mode 0600 in a directory of mode 0700, which answers
    a request without the workers' forward key 403 and changes nothing."""
    co, ca, admin, admin_context, _ = mtls_fleet
    assert _listening_ports(co.proc.pid) == set()
    assert [_listening_ports(w.pid) for w in _workers(co)] == [{co.port}, {co.port}]
    (path,) = {c.laddr for c in psutil.Process(co.proc.pid).net_connections("unix")
               if c.laddr and c.laddr.endswith("forwarded.sock")}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    body = json.dumps({"slo_ms": 100}).encode()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"PUT /v1/models/evil HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n%s" % (len(body), body))
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"report workers forward" in answer
    status, models = call(co.port, "GET", "/v1/models", token=admin, context=admin_context)
    assert status == 200 and "evil" not in [m["name"] for m in models]
    # a client without a certificate gets no TLS session on the public port at all
    with pytest.raises(OSError):  # ssl.SSLError, or the connection reset
        call(co.port, "GET", "/v1/models", token=admin, context=client_context(ca.cert_file))


# -- a throttle that throttles -----------------------------------------------------------


def test_a_throttled_peers_correct_token_is_refused_and_others_are_served(repo, tmp_path):
    """An agent process: 2,000 wrong tokens from 127.0.0.2 with the right one among
    them (HTTP): refused while throttled, a client on 127.0.0.1 served all along; then
    25 wrong ones over gRPC from 127.0.0.1 and the right one: refused as well."""
    add_mlp(repo, "m")
    right = new_token()
    tokens = _tokens(tmp_path / "tokens.yaml", [("app", right, ["infer"])])
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(
        {"auth": {"token_file": str(tokens), "failure_burst": 20, "failures_per_s": 0.2}}))
    with reserved_port() as grpc_port:
        agent = Agent(repo, tmp_path / "data", "--config", str(tmp_path / "agent.yaml"),
                      "--grpc-port", str(grpc_port))
    grpc_address = f"127.0.0.1:{grpc_port}"
    port = int(agent.url.rsplit(":", 1)[1])
    try:
        guesser = http.client.HTTPConnection("127.0.0.1", port, timeout=30,
                                             source_address=("127.0.0.2", 0))
        seen = []
        for i in range(2_000):
            token = right if i == 1_000 else new_token()
            seen.append(call(port, "POST", "/v2/models/m/infer", ROW, token=token,
                             conn=guesser)[0])
            if i % 500 == 0:
                assert call(port, "POST", "/v2/models/m/infer", ROW, token=right)[0] == 200
        assert seen[:20] == [401] * 20 and seen[1_000] == 429, seen[995:1005]
        assert 200 not in seen and seen.count(401) < 40  # 20, and a few refills
        channel = grpc.insecure_channel(grpc_address,
                                        options=[("grpc.primary_user_agent", "t")])
        from agent.node.protos import grpc_predict_v2_pb2 as pb
        from agent.node.protos import grpc_predict_v2_pb2_grpc as pb_grpc
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        def metadata(token: str) -> grpc.StatusCode:
            try:
                stub.ModelMetadata(pb.ModelMetadataRequest(name="m"), metadata=(
                    ("authorization", f"Bearer {token}"),), timeout=30)
                return grpc.StatusCode.OK
            except grpc.RpcError as err:
                return err.code()

        assert metadata(right) == grpc.StatusCode.OK  # 127.0.0.1 was not throttled
        codes = [metadata(new_token()) for _ in range(25)]  # now it is, over gRPC
        assert codes[:20] == [grpc.StatusCode.UNAUTHENTICATED] * 20
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes[20:]
        assert metadata(right) == grpc.StatusCode.RESOURCE_EXHAUSTED
        channel.close()
    finally:
        agent.stop()


def test_a_throttled_peers_valid_join_token_is_neither_tried_nor_used(start_coordinator,
                                                                     tmp_path):
    admin = new_token()
    co = start_coordinator(auth=AuthSettings(
        token_file=_tokens(tmp_path / "tokens.yaml", [("ops", admin, ["admin"])])))
    now = [0.0]
    co.co.guard.throttle.clock = lambda: now[0]
    made = co.request("POST", "/v1/join-tokens", {"node": "edge-7"}, token=admin)[1]
    statuses = [call(co.port, "POST", "/v1/join", token=new_token(), source="127.0.0.2")[0]
                for _ in range(30)]
    assert statuses == [401] * 20 + [429] * 10
    status, doc = call(co.port, "POST", "/v1/join", token=made["token"], source="127.0.0.2")
    assert status == 429 and "too many failed" in doc["error"]
    now[0] += 1.0  # its bucket refills: the join token was not used up meanwhile
    status, doc = call(co.port, "POST", "/v1/join", token=made["token"], source="127.0.0.2")
    assert status == 200 and doc["node"] == "edge-7"


# -- rebinding, with tokens ----------------------------------------------------------------


def test_a_rebinding_page_is_refused_by_a_coordinator_with_tokens(start_coordinator,
                                                                  tmp_path):
    admin, edge = new_token(), new_token()
    co = start_coordinator(auth=AuthSettings(token_file=_tokens(
        tmp_path / "tokens.yaml", [("ops", admin, ["admin"])])))
    page = {"Host": f"evil.example:{co.port}", "Origin": f"http://evil.example:{co.port}"}
    for method, path in (("GET", "/v1/health"), ("GET", "/v1/nodes"),
                         ("POST", "/v1/nodes/edge-1/report")):
        status, doc = call(co.port, method, path, REPORT, headers=page)
        assert status == 403 and "evil.example" in doc["error"], (path, doc)
    assert call(co.port, "GET", "/v1/nodes", headers=page, token=edge)[0] == 401
    # a proxy's name with a valid token is the operator's choice
    assert call(co.port, "GET", "/v1/nodes", headers={"Host": "proxy.internal"},
                token=admin)[0] == 200
