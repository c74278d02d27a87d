"""The raw lane (``agent.http.rawlane``) of a report worker and of a coordinator without
workers, end to end: a real coordinator with one report worker (so every connection
reaches the worker that holds a node's lease basis) or none, node tokens and client
certificates, raw sockets. Leases and reports taken on the lane get the answers aiohttp's path gives
(compared with the same requests on a connection aiohttp serves); refused credentials,
throttling, forwarded paths, compressed and chunked bodies, oversized heads and bodies
and slow requests get aiohttp's answers, on the same connection where it stays open."""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import time

import pytest
import yaml

from agent.security.credentials import new_token, token_hash
from agent.security.tls import client_context
from tests.helpers import (REPORT, CoordinatorProcess, issue_cert, make_ca, mutual_tls,
                           wait_for)

REPORT_ID = 424242
LEASE_REPORT = {**REPORT, "report_id": REPORT_ID}


class Conn:
    """One kept-alive connection writing requests as bytes and reading answers."""

    def __init__(self, port: int, context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = context.wrap_socket(sock, server_hostname="127.0.0.1") if context \
            else sock
        self.buffer = b""

    def send(self, method: str, path: str, body: bytes = b"", token: str | None = None,
             extra: str = "") -> tuple[int, dict[str, str], bytes]:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall((f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{extra}"
                           f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        return self.answer()

    def raw(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(data)
        return self.answer()

    def _read(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        return data

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._read()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            self.buffer += self._read()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed_within(self, seconds: float) -> bool:
        self.sock.settimeout(seconds)
        try:
            return self.sock.recv(1) == b""
        except (TimeoutError, socket.timeout):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def same(a: tuple, b: tuple) -> bool:
    """Two answers alike: status, body and every header but ``Date``."""
    def drop(h: dict) -> dict:
        return {k: v for k, v in h.items() if k != "date"}
    return a[0] == b[0] and a[2] == b[2] and drop(a[1]) == drop(b[1])


def aiohttp_conn(port: int, context=None, token: str | None = None) -> Conn:
    """A connection the lane handed to aiohttp (its first request is forwarded)."""
    conn = Conn(port, context)
    assert conn.send("GET", "/v1/health", token=token)[0] == 200
    return conn


@pytest.fixture
def tokens(tmp_path):
    return {"admin": new_token(), "edge-1": new_token(), "edge-2": new_token()}


@pytest.fixture
def coordinator(request, tmp_path, tokens):
    """A coordinator with one report worker (``param``: that many; 0, its own raw lane
    on its port)."""
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(
        [{"name": "ops", "sha256": token_hash(tokens["admin"]), "scopes": ["admin"]}] + [
            {"name": n, "sha256": token_hash(tokens[n]), "scopes": ["report"], "node": n}
            for n in ("edge-1", "edge-2")]))
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=getattr(request, "param", 1),
                            read_timeout_s=1.5,
                            max_request_size=20_000, reactive_interval_s=3600,
                            auth={"token_file": str(path), "failure_burst": 3,
                                  "failures_per_s": 0.2})
    yield co
    co.stop()


@pytest.mark.parametrize("coordinator", [1, 0], indirect=True, ids=["worker", "coordinator"])
def test_lane_answers_are_aiohttps_and_what_it_leaves_is_served_on_the_same_connection(
        coordinator, tokens):
    port, edge1, admin = coordinator.port, tokens["edge-1"], tokens["admin"]
    report = json.dumps(LEASE_REPORT).encode()
    lane, chain = Conn(port), aiohttp_conn(port, token=edge1)
    first = lane.send("POST", "/v1/nodes/edge-1/report", report, edge1)
    assert first[0] == 200 and first[1]["content-type"] == "application/json"
    version = json.loads(first[2])["answer"]
    lease = json.dumps({"report": REPORT_ID, "answer": version}).encode()
    requests = [("/v1/nodes/edge-1/report", report, edge1),
                ("/v1/nodes/edge-1/lease", lease, edge1),
                ("/v1/nodes/edge-1/lease", lease, admin),  # admin may post any node's
                ("/v1/nodes/edge-1/lease", b"{}", edge1),  # names no report: send it
                ("/v1/nodes/edge-1/lease", b'{"report": 1, "answer": 2}', edge1),
                ("/v1/nodes/edge-1/lease", b"{not json", edge1),  # 400s, as the chain's
                ("/v1/nodes/edge-1/lease", b'{"report": "x"}', edge1),
                ("/v1/nodes/edge-1/report", b'{"capacity": 3}', edge1)]
    for path, body, token in requests:
        on_lane = lane.send("POST", path, body, token)
        assert same(on_lane, chain.send("POST", path, body, token)), (path, body, on_lane)
    assert lane.send("POST", "/v1/nodes/edge-1/lease", lease, edge1)[2] == \
        b'{"answer":%d}\n' % version
    # what the lane leaves, aiohttp serves on the same connection (after leases)
    assert lane.send("GET", "/v1/nodes", token=admin)[0] == 200  # forwarded
    gz = lane.send("POST", "/v1/nodes/edge-1/report", gzip.compress(report), edge1,
                   "Content-Encoding: gzip\r\n")
    assert same(gz, first)
    chunked = lane.raw(b"POST /v1/nodes/edge-1/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       + f"Authorization: Bearer {edge1}\r\n".encode()
                       + b"Transfer-Encoding: chunked\r\n\r\n"
                       + b"%x\r\n%s\r\n0\r\n\r\n" % (len(lease), lease))
    assert chunked[0] == 200 and chunked[2] == b'{"answer":%d}\n' % version
    lane.close()
    chain.close()
    # /metrics counts what the lane answered (the first report, the 8 compared, the
    # last lease: a worker tells its counts every second) and the connections it handed
    # over (``chain``'s and ``lane``'s, then every scrape's and health check's)
    wait_for(lambda: lane_counts(port, admin)[0] >= 10, timeout=10)
    answered, handed = lane_counts(port, admin)
    assert answered == 10 and handed >= 3


def lane_counts(port: int, admin: str) -> tuple[int, int]:
    """(raw lane answered, handed over) as the coordinator's ``/metrics`` says."""
    conn = Conn(port)
    status, _, body = conn.send("GET", "/metrics", token=admin)
    conn.close()
    assert status == 200
    values = dict(line.rsplit(" ", 1) for line in body.decode().splitlines()
                  if line.startswith("edgeagent_coordinator_raw_lane_"))
    return (int(values["edgeagent_coordinator_raw_lane_answered_total"]),
            int(values["edgeagent_coordinator_raw_lane_handed_over_total"]))


def test_refused_credentials_get_the_chains_401_403_and_429(coordinator, tokens):
    port, edge1 = coordinator.port, tokens["edge-1"]
    lease = b"{}"
    for token, status in ((None, 401), (tokens["edge-2"], 403)):
        lane, chain = Conn(port), aiohttp_conn(port, token=edge1)
        assert lane.send("POST", "/v1/nodes/edge-1/lease", lease, edge1)[0] == 200
        refused = lane.send("POST", "/v1/nodes/edge-1/lease", lease, token)
        assert refused[0] == status and same(
            refused, chain.send("POST", "/v1/nodes/edge-1/lease", lease, token))
        assert lane.send("POST", "/v1/nodes/edge-1/lease", lease, edge1)[0] == 200
        lane.close()
        chain.close()
    # a peer guessing tokens is throttled: then even a valid token waits (429)
    lane = Conn(port)
    assert lane.send("POST", "/v1/nodes/edge-1/lease", lease, edge1)[0] == 200
    statuses = [lane.send("POST", "/v1/nodes/edge-1/lease", lease, new_token())[0]
                for _ in range(4)]
    assert 429 in statuses and set(statuses) <= {401, 429}, statuses
    throttled = lane.send("POST", "/v1/nodes/edge-1/lease", lease, edge1)
    assert throttled[0] == 429 and int(throttled[1]["retry-after"]) >= 1
    lane.close()


def test_oversized_and_slow_requests_get_aiohttps_limits(coordinator, tokens):
    port, edge1 = coordinator.port, tokens["edge-1"]
    lane = Conn(port)
    assert lane.send("POST", "/v1/nodes/edge-1/lease", b"{}", edge1)[0] == 200
    too_big = lane.send("POST", "/v1/nodes/edge-1/report", b"x" * 20_001, edge1)
    assert too_big[0] == 413, too_big
    lane.close()
    lane = Conn(port)
    assert lane.send("POST", "/v1/nodes/edge-1/lease", b"{}", edge1)[0] == 200
    long_head = lane.raw(b"POST /v1/nodes/edge-1/lease HTTP/1.1\r\nX-Long: "
                         + b"y" * 9000 + b"\r\n\r\n")
    assert long_head[0] in (400, 431), long_head
    lane.close()
    # a head that never ends, and a body that never comes, after a lease: closed or
    # answered 408 once read_timeout_s (1.5 s) passed
    for partial in (b"POST /v1/nodes/edge-1/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                    b"POST /v1/nodes/edge-1/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Authorization: Bearer " + edge1.encode()
                    + b"\r\nContent-Length: 10\r\n\r\n{"):
        lane = Conn(port)
        assert lane.send("POST", "/v1/nodes/edge-1/lease", b"{}", edge1)[0] == 200
        start = time.monotonic()
        lane.sock.sendall(partial)
        if partial.endswith(b"{"):
            assert lane.answer()[0] == 408
        assert lane.closed_within(12)
        assert 1.2 <= time.monotonic() - start <= 12
        lane.close()


def test_client_certificates_take_the_lane_over_tls(tmp_path):
    ca = make_ca(tmp_path)
    server = issue_cert(ca, tmp_path, "server")
    edge1 = issue_cert(ca, tmp_path, "edge-1", hosts=("edge-1",))
    context = client_context(ca.cert_file, edge1.cert_file, edge1.key_file)
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=1, context=context,
                            reactive_interval_s=3600,
                            tls=mutual_tls(server, ca))
    try:
        port = co.port
        lane = wait_for(lambda: Conn(port, context), 10, "a TLS connection")
        chain = aiohttp_conn(port, context)
        report = json.dumps(LEASE_REPORT).encode()
        first = lane.send("POST", "/v1/nodes/edge-1/report", report)
        assert first[0] == 200
        lease = json.dumps({"report": REPORT_ID,
                            "answer": json.loads(first[2])["answer"]}).encode()
        for path, body in (("/v1/nodes/edge-1/report", report),
                           ("/v1/nodes/edge-1/lease", lease),
                           ("/v1/nodes/edge-2/lease", lease)):  # another node's: 403
            on_lane = lane.send("POST", path, body)
            assert same(on_lane, chain.send("POST", path, body)), (path, on_lane)
        assert on_lane[0] == 403 and "only its own report" in json.loads(on_lane[2])["error"]
        lane.close()
        chain.close()
    finally:
        co.stop()
