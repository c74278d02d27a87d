"""One stranger (no token, default config) stops no client (issue 39): bodies are counted
as they arrive, decoded, and refused at the limit; connections are bounded in all and
per peer, the oldest idle closed first; a TLS handshake has a deadline; gRPC calls that
never send their message leave HTTP room. Real agent and coordinator processes on
loopback and real sockets for the floors (the attacks are ``bench/strangers.py``'s,
which prints the same figures before and after); the decoding and the connection
bounds' order in a server in this process."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
import time
import zlib
from pathlib import Path

import pytest

from bench.strangers import (MiB, bomb, connect, held_connections, probes, raise_own_nofile,
                             self_signed, send_bomb, silent_bodies, silent_grpc_calls,
                             start_agent, start_coordinator, still_open, unit_nofile, within)
from tests.helpers import add_mlp, make_ca, issue_cert, request, v2_body

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def open_files():
    """The attacks hold 2,000 sockets in this process."""
    raise_own_nofile(4200)


def _bodies(server) -> dict:
    return request(server.url + "/v1/memory")[1]["cpu"]["request_bodies"]


# -- bodies: counted as they arrive ---------------------------------------------------------


def test_silent_announced_bodies_hold_nothing_and_small_requests_are_answered(tmp_path):
    """8, then 64 connections announce 64 MiB bodies and send none: nothing is counted
    for them, and 8 small inference requests in a row are each answered within 1 s."""
    agent = start_agent(ROOT, tmp_path, {})
    try:
        for count in (8, 64):
            with silent_bodies(agent, count) as sockets:
                seen = probes(agent, 8)
                bodies = _bodies(agent)
            assert len(sockets) == count
            assert within(seen, 1.0) == 8, (count, seen)
            assert bodies["in_flight_bytes"] == 0 and bodies["reading"] == count, bodies
    finally:
        agent.stop()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compression_bomb_is_refused_at_the_limit_with_the_memory_it_allows(
        tmp_path, encoding):
    """A body that inflates to 1 GiB (1 MB on the wire) is decoded in steps, counted as
    it comes: 413 naming the limit once it passes 16 MiB, the connection closed, and the
    agent's peak RSS (VmHWM) lifted by no more than the limit and the request's own
    couple of MiB (a plain 16 MiB body costs as much); the agent answers the next
    client."""
    agent = start_agent(ROOT, tmp_path, {"max_request_size": "16MiB"})
    try:
        status, text, lifted, took = send_bomb(agent, bomb(1024 * MiB, encoding), encoding)
        assert status == 413, text
        assert "over the limit of 16777216 bytes once decoded (max_request_size)" in text
        assert lifted <= 16 * MiB + 4 * MiB, f"peak RSS +{lifted / MiB:.1f} MiB"
        with connect(agent) as sock:  # chunked: refused mid-body, the connection closed
            sock.settimeout(5)  # (after the rest is drained, up to its lingering time)
            body = bomb(64 * MiB, encoding)
            sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\n"
                         b"Content-Encoding: " + encoding.encode() + b"\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert b"Connection: close" in answer and b"(max_request_size)" in answer
        assert within(probes(agent, 2, sources=("127.0.0.3",)), 1.0) == 2
    finally:
        agent.stop()


def test_bodies_decode_from_their_content_encoding(repo, start_agent):
    """gzip (also as members one after another), deflate (zlib-wrapped and raw) and
    identity bodies are served as the plain body would be; a truncated or corrupt one
    gets 400 naming the coding, one with bytes after its end 400, an encoding not decoded
    here (br, zstd: their windows would not be counted) 415; a compressed body over the
    limit once decoded 413."""
    add_mlp(repo, "m")
    agent = start_agent(repo, max_request_size=1 * MiB)
    plain = json.dumps(v2_body([1.0, 2.0, 3.0, 4.0] * 2, shape=(2, 4))).encode()
    expected = agent.request("POST", "/v2/models/m/infer", plain)
    assert expected[0] == 200
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    codings = {
        "gzip": gzip.compress(plain),
        "x-gzip": gzip.compress(plain[:10]) + gzip.compress(plain[10:]),  # two members
        "deflate": zlib.compress(plain),
        "Deflate": raw.compress(plain) + raw.flush(),  # raw deflate, as some clients send
        "identity": plain,
    }
    for name, body in codings.items():
        status, _, reply = agent.request("POST", "/v2/models/m/infer", body,
                                         headers={"Content-Encoding": name})
        assert (status, reply) == (200, expected[2]), name

    def send(body: bytes, coding: str) -> tuple[int, str]:
        status, _, reply = agent.request("POST", "/v2/models/m/infer", body,
                                         headers={"Content-Encoding": coding})
        return status, reply["error"]

    status, error = send(gzip.compress(plain)[:-12], "gzip")
    assert status == 400 and "gzip stream ends early" in error, error
    status, error = send(b"not gzip at all", "gzip")
    assert status == 400 and "not valid gzip" in error, error
    status, error = send(zlib.compress(plain) + b"more", "deflate")
    assert status == 400 and "after the end of the deflate stream" in error, error
    for coding in ("br", "zstd", "compress", "gzip, br"):
        status, error = send(plain, coding)
        assert status == 415 and "is not supported" in error, (coding, error)
    status, error = send(gzip.compress(bytes(2 * MiB)), "gzip")
    assert status == 413 and "1048576 bytes once decoded" in error, error
    bodies = agent.request("GET", "/v1/memory")[2]["cpu"]["request_bodies"]
    assert bodies["in_flight_bytes"] == 0 and bodies["reading"] == 0, bodies


def test_the_coordinator_decodes_a_gzip_report_and_refuses_a_bomb(start_coordinator):
    """A gzip report is decoded and recorded (it takes the middlewares' path, not the
    reports' shortcut); one that inflates past ``max_request_size`` gets 413 naming it."""
    import urllib.error
    import urllib.request

    co = start_coordinator(max_request_size=2 * MiB)

    def post(path: str, body: bytes) -> tuple[int, dict]:
        req = urllib.request.Request(co.url + path, data=body, method="POST", headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"})
        try:
            with urllib.request.urlopen(req, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    report = json.dumps({"capacity": {"cores": 1, "cpu_memory_bytes": 1}}).encode()
    assert post("/v1/nodes/edge-1/report", gzip.compress(report))[0] == 200
    assert [n["name"] for n in co.request("GET", "/v1/nodes")[1]] == ["edge-1"]
    status, answer = post("/v1/nodes/edge-2/report", bomb(64 * MiB))
    assert status == 413 and "2097152 bytes once decoded (max_request_size)" in \
        answer["error"], answer


# -- connections ---------------------------------------------------------------------------


def _limits(nofile: str) -> tuple[int, int]:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile == "unit":  # LimitNOFILE= sets both limits
        limit = min(unit_nofile("edgeagent.service"), hard)
        assert limit == unit_nofile("edgeagent-coordinator.service") or limit == hard
        return limit, limit
    return 1024, hard  # systemd's default soft limit


@pytest.mark.parametrize("nofile", ["unit", pytest.param("1024", marks=pytest.mark.slow)])
@pytest.mark.parametrize("role", ["agent", "coordinator"])
def test_2000_held_connections_leave_a_new_client_answered(tmp_path, role, nofile):
    """2,000 connections held idle, then 2,000 sending a request head a byte a second
    (slowloris), then on a TLS port 2,000 that never start their handshake: 10 new
    clients in a row, from the attackers' own addresses, are each answered within 1 s,
    since a connection past the bounds (a quarter of the open-file limit in all, per
    peer a quarter of that) closes the oldest idle one. With the open-file limit the
    unit sets, from one address (past its per-peer bound); with systemd's default,
    1024, from 8 addresses (past the bound in all too)."""
    start = start_agent if role == "agent" else start_coordinator
    path, body = ("/v2/models/m/infer", json.dumps(v2_body([1.0] * 4)).encode()) \
        if role == "agent" else ("/v1/health", None)
    limits = _limits(nofile)
    total = limits[0] // 4
    sources = ("127.0.0.2",) if nofile == "unit" else tuple(f"127.0.0.{i}" for i in
                                                           range(2, 10))
    bound = min(total, len(sources) * (total // 4))
    for config, kinds in (({}, ("idle", "slowloris")), ({"tls": self_signed(tmp_path)},
                                                        ("idle",))):
        server = start(ROOT, tmp_path, config, limits)
        try:
            for kind in kinds:
                with held_connections(server, 2000, kind, sources) as sockets:
                    assert len(sockets) == 2000
                    time.sleep(0.3)
                    seen = probes(server, 10, path, body, pause=0.02, sources=sources)
                    left = still_open(sockets)
                what = "stalled before TLS" if config else kind
                assert within(seen, 1.0) == 10, (what, seen)
                assert left <= bound, (what, left)  # the oldest idle ones were closed
        finally:
            server.stop()


def test_a_handshake_that_never_starts_is_closed_after_read_timeout_s(tmp_path):
    """50 TCP connections to a TLS port that never start a handshake are closed once
    ``read_timeout_s`` (1 s) has passed, not after asyncio's 60 s."""
    agent = start_agent(ROOT, tmp_path, {"tls": self_signed(tmp_path), "read_timeout_s": 1})
    try:
        sockets = [connect(agent) for _ in range(50)]
        time.sleep(0.3)
        assert still_open(sockets) == 50
        time.sleep(2.5)
        assert still_open(sockets) == 0
        assert within(probes(agent, 2), 1.0) == 2
    finally:
        agent.stop()


def test_the_oldest_idle_connection_makes_room_and_busy_ones_stay(tmp_path):
    """At the bound (4 in all, 3 per peer) a new connection closes the oldest idle one:
    a connection whose request is being served, or whose TLS handshake is done and whose
    answer is under way, stays; when every one is busy, the newcomer is closed at once.
    Per peer: a fourth connection from 127.0.0.1 closes 127.0.0.1's oldest idle one,
    never 127.0.0.2's; handshakes count too."""
    from aiohttp import web

    from agent.http.connections import Connections, ConnectionLimits
    from agent.http.eventloop import handler_args, listen
    from agent.http.body import body_timeout_middleware

    ca = make_ca(tmp_path)
    leaf = issue_cert(ca, tmp_path, "server")

    async def scenario(tls: bool) -> None:
        release = asyncio.Event()

        async def slow(request):
            await release.wait()
            return web.json_response({"ok": True})

        async def fast(request):
            return web.json_response({"ok": True})

        app = web.Application(handler_args=handler_args(30),  # its middleware marks
                              middlewares=[body_timeout_middleware(30, MiB)])  # the busy
        app.router.add_get("/slow", slow)
        app.router.add_get("/fast", fast)
        context = None
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(leaf.cert_file, leaf.key_file)
        connections = Connections(ConnectionLimits(4, 3), handshake_timeout=30)
        runner, url = await listen(app, "127.0.0.1", 0, connections, ssl_context=context)
        port = int(url.rsplit(":", 1)[1])
        client = ssl.create_default_context(cafile=str(ca.cert_file)) if tls else None

        async def open_(source="127.0.0.1"):
            return await asyncio.open_connection("127.0.0.1", port, ssl=client,
                                                 local_addr=(source, 0))

        async def closed(reader, within: float = 2.0) -> bool:
            """Whether the server closes the connection (within ``within`` s)."""
            try:
                await asyncio.wait_for(reader.read(), within)
            except asyncio.TimeoutError:
                return False
            except (ConnectionError, ssl.SSLError):
                pass
            return True

        async def refused(source) -> bool:
            try:
                reader, _ = await open_(source)
            except (ConnectionError, ssl.SSLError):
                return True  # with TLS: closed before its handshake ended
            return await closed(reader)

        async def get(writer, path):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            await writer.drain()

        async def answered(reader) -> bool:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            return head.startswith(b"HTTP/1.1 200")

        try:
            busy = [await open_() for _ in range(2)]
            for _, writer in busy:
                await get(writer, "/slow")
            idle_old = await open_("127.0.0.2")
            idle_new = await open_("127.0.0.2")
            await asyncio.sleep(0.2)
            assert len(connections) == 4
            newcomer = await open_()  # past 4 in all: the oldest idle one goes
            assert await closed(idle_old[0])
            await get(newcomer[1], "/fast")
            assert await answered(newcomer[0])
            await get(newcomer[1], "/slow")
            last = await open_("127.0.0.3")  # the only idle one left goes
            assert await closed(idle_new[0])
            await get(last[1], "/slow")
            await asyncio.sleep(0.1)
            assert await refused("127.0.0.4")  # every connection busy: closed at once
            assert connections.describe()["refused"] == 1
            assert connections.describe()["closed_idle"] == 2
            release.set()
            for reader, _ in [*busy, newcomer, last]:  # served, never cut
                assert await answered(reader)
            # 127.0.0.1 holds 3, its bound: a 4th closes 127.0.0.1's oldest idle one
            # (now idle: answered), not another peer's
            fourth = await open_()
            assert await closed(busy[0][0])
            assert not await closed(last[0], 0.3)
            fourth[1].close()
        finally:
            release.set()
            await runner.cleanup()
        await asyncio.sleep(0.1)  # the transports' connection_lost
        assert len(connections) == 0

    for tls in (False, True):
        asyncio.run(scenario(tls))


def test_the_bounds_follow_the_open_file_limit():
    from agent.http.connections import connection_limits

    assert connection_limits(open_files=16384) == (4096, 1024)  # the units' LimitNOFILE
    assert connection_limits(open_files=1024) == (256, 64)  # systemd's default soft limit
    assert connection_limits(100, open_files=1024) == (100, 25)
    assert connection_limits(10, 50) == (10, 10)


# -- gRPC -----------------------------------------------------------------------------------


def test_the_grpc_listener_bounds_its_connections_and_their_handshakes(tmp_path):
    """The gRPC listener holds at most ``max_connections`` (8 here): past them a new
    client is refused (grpc core closes no idle connection for it), but connections
    that never send their HTTP/2 preface are closed after ``read_timeout_s`` (1 s), and
    a channel idle that long gets GOAWAY and reconnects by itself."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    agent = start_agent(ROOT, tmp_path, {"read_timeout_s": 1, "max_connections": 8})
    host, port = agent.grpc.rsplit(":", 1)

    def live(stub=None) -> bool:
        with grpc.insecure_channel(agent.grpc) as channel:
            try:
                return (stub or service_pb2_grpc.GRPCInferenceServiceStub(channel)).ServerLive(
                    service_pb2.ServerLiveRequest(), timeout=2).live
            except grpc.RpcError:
                return False

    try:
        stalled = [socket.create_connection((host, int(port))) for _ in range(12)]
        time.sleep(0.3)
        assert still_open(stalled) == 8 and not live()
        time.sleep(1.5)
        assert still_open(stalled) == 0 and live()
        with grpc.insecure_channel(agent.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert live(stub)
            time.sleep(1.5)  # idle past read_timeout_s: GOAWAY, then a new connection
            assert live(stub)
    finally:
        agent.stop()


def test_silent_grpc_calls_leave_http_inference_answered(tmp_path):
    """4 ModelInfer calls that never send their message: the first holds the room of a
    message and its hand-off (3 x 64 MiB), the others wait for theirs without holding
    any; 8 HTTP inference requests in a row are each answered within 1 s."""
    agent = start_agent(ROOT, tmp_path, {})
    try:
        with silent_grpc_calls(agent.grpc, 4):
            seen = probes(agent, 8)
            bodies = _bodies(agent)
        assert within(seen, 1.0) == 8, seen
        assert bodies["in_flight_bytes"] == 192 * MiB, bodies
    finally:
        agent.stop()
