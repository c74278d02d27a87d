"""The raw HTTP/1.1 lane in front of aiohttp (``agent.http.rawlane``): a real aiohttp
server on loopback behind ``limited_site(front=...)``, real sockets writing requests as
bytes (whole, pipelined, split across writes, slow, oversized, chunked, compressed).
What the lane takes it answers as aiohttp would; everything else aiohttp serves on the
same connection, with its own limits and answers."""

from __future__ import annotations

import asyncio
import gzip
import socket

import pytest
from aiohttp import web

from agent.http.connections import ConnectionLimits, Connections
from agent.http.eventloop import handler_args, listen
from agent.http.rawlane import HEAD_LIMIT, RawAnswer, RawLane, RawLanes

FAST = b'{"fast":true}\n'
TIMEOUT_S = 0.6


def take(request, lane):
    """Takes ``POST /fast`` (its answer names the body's length), nothing else."""
    if request.method != "POST" or request.target != "/fast":
        return None
    return RawAnswer(200, FAST[:-1] + b',"n":%d}\n' % len(request.body))


async def fast(request: web.Request) -> web.Response:  # aiohttp's answer to the same
    body = await request.read()
    return web.Response(body=FAST[:-1] + b',"n":%d}\n' % len(body),
                        content_type="application/json")


async def other(request: web.Request) -> web.Response:
    return web.json_response({"other": request.method}, headers={"Retry-After": "3"})


@pytest.fixture
async def server():
    """(port, lanes, connections) of a server whose aiohttp app reads bodies up to
    1,000 bytes and whose lanes take ``POST /fast``."""
    app = web.Application(client_max_size=1000, handler_args=handler_args(TIMEOUT_S))
    app.router.add_post("/fast", fast)
    app.router.add_route("*", "/other", other)
    lanes = RawLanes(take, timeout_s=TIMEOUT_S, max_body=1000)
    connections = Connections(ConnectionLimits(64, 4), TIMEOUT_S)
    runner, url = await listen(app, "127.0.0.1", 0, connections, front=lanes.front)
    yield int(url.rsplit(":", 1)[1]), lanes, connections
    lanes.close()
    await runner.cleanup()


def post(path: str, body: bytes = b"", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer (past a ``100 Continue``): status, headers (lower-case names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    if head.startswith(b"HTTP/1.1 100 "):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return int(lines[0].split()[1]), headers, body


async def test_taken_requests_are_answered_as_aiohttp_answers_them(server):
    port, lanes, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/fast", b"abc"))
    taken = await answer(reader)
    assert lanes.taken == 1 and lanes.handed_over == 0
    # a request the lane leaves (a query) goes to aiohttp, whose answer is the same
    writer.write(post("/fast?x=1", b"abc"))
    served = await answer(reader)
    assert lanes.taken == 1 and lanes.handed_over == 1
    assert taken[0] == served[0] == 200 and taken[2] == served[2] == FAST[:-1] + b',"n":3}\n'
    drop = ("date",)
    assert [(k, v) for k, v in taken[1].items() if k not in drop] == \
        [(k, v) for k, v in served[1].items() if k not in drop]
    # ... and from then on aiohttp serves the connection
    writer.write(post("/fast", b"abcd"))
    assert (await answer(reader))[2] == FAST[:-1] + b',"n":4}\n' and lanes.taken == 1
    writer.close()


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    (post("/fast", gzip.compress(b"abc"), "Content-Encoding: gzip\r\n"), 200),
    (b"POST /fast HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"3\r\nabc\r\n0\r\n\r\n", 200),
    (post("/fast", b"abc", "Expect: 100-continue\r\n"), 200),
    (post("/fast", b"abc", "Connection: close\r\n"), 200),
    (post("/fast", b"abc", "X-Twice: 1\r\nX-Twice: 2\r\n"), 200),
    (post("/fast", b"abc", "X-Folded: 1\r\n  more\r\n"), 400),
    (b"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\nabc", 400),
])
async def test_what_the_lane_leaves_aiohttp_serves_on_the_same_connection(
        server, request_bytes, status):
    port, lanes, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):
        writer.write(post("/fast"))
        assert (await answer(reader))[0] == 200
    writer.write(request_bytes)
    got = await answer(reader)
    assert got[0] == status, got
    assert lanes.taken == 3 and lanes.handed_over == 1
    writer.close()


async def test_pipelined_and_split_requests(server):
    port, lanes, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/fast", b"a") + post("/fast", b"bb") + post("/fast", b"ccc")[:20])
    await asyncio.sleep(0.05)
    writer.write(post("/fast", b"ccc")[20:])
    for n in (1, 2, 3):
        assert (await answer(reader))[2] == FAST[:-1] + b',"n":%d}\n' % n
    assert lanes.taken == 3 and lanes.handed_over == 0
    # a body that comes after its head: aiohttp waits for it
    request = post("/fast", b"dddd")
    writer.write(request[:-4])
    await asyncio.sleep(0.05)
    writer.write(request[-4:] + post("/other"))
    assert (await answer(reader))[2] == FAST[:-1] + b',"n":4}\n'
    assert (await answer(reader))[2] == b'{"other": "POST"}'  # aiohttp's route
    assert lanes.handed_over == 1
    writer.close()


async def test_a_partial_head_or_an_idle_connection_is_closed_after_the_read_timeout(server):
    port, lanes, connections = server
    loop = asyncio.get_running_loop()
    for partial in (b"", b"POST /fast HTTP/1.1\r\nHost: x\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/fast"))
        await answer(reader)
        start = loop.time()
        for i in range(len(partial)):  # a byte at a time does not keep it open
            writer.write(partial[i:i + 1])
            await asyncio.sleep(TIMEOUT_S / max(1, len(partial)) / 2)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert TIMEOUT_S * 0.9 <= loop.time() - start <= TIMEOUT_S + 1.0
        writer.close()
    assert lanes.handed_over == 0 and len(connections) == 0


async def test_oversized_heads_and_bodies_get_aiohttps_answers(server):
    port, lanes, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/fast", b"x" * 1001))  # past max_body: aiohttp's 413
    assert (await answer(reader))[0] == 413
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /fast HTTP/1.1\r\nX-Long: " + b"y" * HEAD_LIMIT)
    got = await answer(reader)  # a line past aiohttp's limit: its 400
    assert got[0] in (400, 431), got
    assert lanes.handed_over == 2 and lanes.taken == 0
    writer.close()


async def test_lane_connections_are_counted_and_closed_when_the_server_stops(server):
    port, lanes, connections = server
    streams = []
    for _ in range(4):  # the peer's bound
        streams.append(await asyncio.open_connection("127.0.0.1", port))
        streams[-1][1].write(post("/fast"))
        await answer(streams[-1][0])
    assert len(connections) == 4 and connections.describe()["peers"] == 1
    streams.append(await asyncio.open_connection("127.0.0.1", port))
    streams[-1][1].write(post("/fast"))
    await answer(streams[-1][0])  # the oldest idle one made room
    assert await asyncio.wait_for(streams[0][0].read(), 5) == b""
    assert connections.describe()["closed_idle"] == 1
    lanes.close()
    for reader, _ in streams[1:]:
        assert await asyncio.wait_for(reader.read(), 5) == b""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/fast"))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed: a stopping server


async def test_a_peer_that_does_not_read_its_answers_is_not_read_either(server, monkeypatch):
    port, lanes, _ = server
    paused = []
    pause = RawLane.pause_writing
    monkeypatch.setattr(RawLane, "pause_writing", lambda lane: (paused.append(1), pause(lane)))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(post("/fast"))
    await answer(reader)
    (lane,) = lanes.lanes  # small buffers on the server's side too
    lane.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                                       4096)
    lane.transport.set_write_buffer_limits(high=4096)
    count = 5000  # ~750 KB of answers
    writer.write(b"".join(post("/fast", b"x" * (i % 7)) for i in range(count)))
    await asyncio.sleep(TIMEOUT_S * 2)  # paused, past the read timeout: still open
    assert paused and lanes.taken < count, (paused, lanes.taken)
    for i in range(count):
        assert (await answer(reader))[2] == FAST[:-1] + b',"n":%d}\n' % (i % 7)
    assert lanes.taken == count + 1 and lanes.handed_over == 0
    writer.close()
