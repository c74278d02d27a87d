"""Bounded requests and read timeouts (issue 13), against a real agent (ONNX MLP) and a
real coordinator on 127.0.0.1: rows per request and decoded tensor bytes refused with
413 from the declared shapes (before any tensor is built, before any load), large bodies
decoded off the event loop (health answers meanwhile), slow clients cut off."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from agent.node.offload import Decoder, DecoderLost
from agent.node.tensors import BadRequest, Limits, decode_v2_request
from tests.helpers import add_mlp, v2_body


def _rows(n: int) -> dict:
    return v2_body([[1.0, 2.0, 3.0, 4.0]] * n, shape=(n, 4))


def _cache(agent) -> list:
    return [(e["name"], e["state"]) for e in agent.request("GET", "/v1/cache")[2]]


@pytest.fixture
def agent(repo, start_agent):
    add_mlp(repo, "mlp")
    return start_agent(repo)


# -- rows and bytes per request --------------------------------------------------------


@pytest.mark.parametrize("warm", [False, True])
def test_40000_rows_are_refused_with_413_naming_the_limit(agent, warm):
    if warm:
        assert agent.request("POST", "/v2/repository/models/mlp/load")[0] == 200
    before = _cache(agent)
    status, _, reply = agent.request("POST", "/v2/models/mlp/infer", _rows(40_000))
    # the default: 64 x the model's max_batch_size (the server's 32)
    assert status == 413, reply
    assert "40000 rows" in reply["error"] and "2048 rows per request" in reply["error"]
    assert "max_request_rows" in reply["error"]
    assert _cache(agent) == before  # nothing loaded by a refused request
    status, _, reply = agent.request("POST", "/v1/models/mlp:predict",
                                     {"instances": [[1, 2, 3, 4]] * 40_000})
    assert status == 413 and "2048 rows per request" in reply["error"], reply
    status, _, reply = agent.request("POST", "/v1/models/mlp:predict",
                                     {"inputs": {"X": [[1, 2, 3, 4]] * 40_000}})
    assert status == 413 and "40000 rows" in reply["error"], reply
    assert _cache(agent) == before
    status, _, reply = agent.request("POST", "/v2/models/mlp/infer", _rows(2048))
    assert status == 200 and reply["outputs"][0]["shape"] == [2048, 2]


def test_max_request_rows_per_model_and_per_agent(repo, start_agent):
    add_mlp(repo, "small", config={"max_request_rows": 10})
    add_mlp(repo, "other")
    agent = start_agent(repo, max_request_rows=5)
    assert agent.request("POST", "/v2/models/small/infer", _rows(10))[0] == 200
    status, _, reply = agent.request("POST", "/v2/models/small/infer", _rows(11))
    assert status == 413 and "limit of 10 rows" in reply["error"]
    status, _, reply = agent.request("POST", "/v2/models/other/infer", _rows(6))
    assert status == 413 and "limit of 5 rows" in reply["error"]
    assert agent.request("POST", "/v1/models/other:predict",
                         {"instances": [[1, 2, 3, 4]] * 5})[0] == 200


def test_max_tensor_bytes_from_the_declared_shape(repo, start_agent):
    add_mlp(repo, "mlp")
    agent = start_agent(repo, max_tensor_bytes=1000, max_request_rows=10**6)
    assert agent.request("POST", "/v2/models/mlp/infer", _rows(62))[0] == 200  # 992 bytes
    status, _, reply = agent.request("POST", "/v2/models/mlp/infer", _rows(63))
    assert status == 413 and "1008 bytes" in reply["error"] \
        and "max_tensor_bytes" in reply["error"], reply
    # a shape declaring 4 GB in one row with 16 bytes of binary data: refused from the shape
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 10**9],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, _, reply = agent.request(
        "POST", "/v2/models/mlp/infer", header + struct.pack("<4f", 1, 2, 3, 4),
        headers={"Inference-Header-Content-Length": str(len(header))})
    assert status == 413 and "max_tensor_bytes" in reply["error"], reply
    agent.request("POST", "/v2/repository/models/mlp/load")  # TF: bytes need the signature
    status, _, reply = agent.request("POST", "/v1/models/mlp:predict",
                                     {"instances": [[1, 2, 3, 4]] * 63})
    assert status == 413 and "1008 bytes" in reply["error"], reply


def test_limits_are_checked_before_the_data_is_read():
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP64", "shape": [3, 2],
                                   "data": "not even a list"}]}).encode()
    with pytest.raises(BadRequest) as err:
        decode_v2_request(body, None, Limits(max_rows=2))
    assert err.value.status == 413 and "3 rows" in str(err.value)
    with pytest.raises(BadRequest) as err:
        decode_v2_request(body, None, Limits(max_bytes=47))
    assert err.value.status == 413 and "48 bytes" in str(err.value)
    with pytest.raises(BadRequest) as err:  # within the limits: the data's own error
        decode_v2_request(body, None, Limits(max_rows=3, max_bytes=48))
    assert err.value.status == 400


# -- decoding off the event loop --------------------------------------------------------


def test_decoder_runs_inline_on_a_thread_or_in_a_child_process():
    body = json.dumps(_rows(3)).encode()
    inline = decode_v2_request(body, None)[0]["X"]

    async def run_all():
        decoder = Decoder(thread_bytes=10, process_bytes=len(body) - 1)
        try:
            here = await Decoder().run(len(body), decode_v2_request, body, None)
            thread = await Decoder(thread_bytes=0).run(len(body), decode_v2_request, body, None)
            child = await decoder.run(len(body), decode_v2_request, body, None)
            with pytest.raises(BadRequest) as err:  # the child's error, as it raised it
                await decoder.run(len(body), decode_v2_request, body, None, Limits(max_rows=2))
            assert err.value.status == 413
            with pytest.raises(DecoderLost):  # a child that dies: 503, then a new child
                await decoder.run(len(body), os._exit, 3)
            again = await decoder.run(len(body), decode_v2_request, body, None)
            return here, thread, child, again
        finally:
            decoder.close()

    import asyncio

    for inputs, _ in asyncio.run(run_all()):
        np.testing.assert_array_equal(inputs["X"], inline)
        assert inputs["X"].dtype == np.float32


def _echo(*args):
    return args


def test_the_child_gets_and_gives_large_buffers_out_of_band():
    """Large bodies and arrays cross the socket as raw buffers beside a small pickle,
    and arrive as buffers of the receiver's own (no rebuild of a copy under the GIL)."""
    import socket
    import threading

    from agent.node.offload import OUT_OF_BAND_BYTES, receive, send

    body = bytearray(b"x" * (3 * OUT_OF_BAND_BYTES))
    frozen = bytes(body)
    array = np.arange(100_000, dtype=np.float32).reshape(1000, 100)
    value = (_echo, (body, frozen, array, b"small", {"k": [1, 2]}))
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sent = threading.Thread(target=send, args=(ours, value))  # > the socket's buffer
        sent.start()
        fn, (got_body, got_frozen, got_array, small, doc) = receive(theirs)
        sent.join()
    assert fn is _echo and small == b"small" and doc == {"k": [1, 2]}
    assert type(got_body) is memoryview and not got_body.readonly and got_body == body
    assert type(got_frozen) is memoryview and got_frozen.readonly and got_frozen == frozen
    np.testing.assert_array_equal(got_array, array)
    assert got_array.flags.writeable and not got_array.flags.owndata  # on the buffer


def test_a_child_that_dies_mid_answer_is_lost_and_replaced():
    body = json.dumps(_rows(3)).encode()

    async def run():
        decoder = Decoder(thread_bytes=0, process_bytes=0)
        try:
            first = await decoder.run(1, decode_v2_request, body, None)
            pid = decoder._child.process.pid
            with pytest.raises(DecoderLost):
                await decoder.run(1, os.kill, pid, 9)  # the child kills itself
            second = await decoder.run(1, decode_v2_request, body, None)
            assert decoder._child.process.pid != pid
            return first, second
        finally:
            decoder.close()

    import asyncio

    first, second = asyncio.run(run())
    np.testing.assert_array_equal(first[0]["X"], second[0]["X"])


def test_large_bodies_are_read_in_place_chunked_ones_too_and_oversized_ones_refused(
        repo, start_agent):
    """Over 1 MiB the agent reads a body into one buffer a piece at a time; a chunked
    body (no Content-Length) is read the ordinary way; both are served the same, and a
    body over ``max_request_size`` is still a 413."""
    import http.client

    add_mlp(repo, "mlp")
    agent = start_agent(repo, max_request_rows=10**6, max_request_size=4 * 2**20)
    n = 60_000
    body = json.dumps(_rows(n)).encode()
    assert 2**20 < len(body) < 4 * 2**20
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)

    def post(data, chunked=False):
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            if chunked:
                pieces = (data[i:i + 100_000] for i in range(0, len(data), 100_000))
                conn.request("POST", "/v2/models/mlp/infer", body=pieces,
                             encode_chunked=True)
            else:
                conn.request("POST", "/v2/models/mlp/infer", body=data)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    status, answer = post(body)
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"][0]["shape"][0] == n
    status, chunked = post(body, chunked=True)
    assert status == 200 and chunked == answer
    status, answer = post(json.dumps(_rows(4 * n)).encode())
    assert status == 413, answer[:300]
    assert agent.request("GET", "/v2/health/ready")[0] == 200


def test_health_answers_while_a_30_mb_body_is_decoded(repo, start_agent):
    add_mlp(repo, "mlp")
    agent = start_agent(repo, max_request_rows=10**7)
    n = 1_400_000
    body = json.dumps(_rows(n)).encode()
    assert len(body) > 30e6
    result = {}

    def big():  # the answer is read, not parsed: the agent shares this process's GIL
        import urllib.request

        req = urllib.request.Request(agent.url + "/v2/models/mlp/infer", data=body)
        with urllib.request.urlopen(req, timeout=120) as resp:
            result["status"], result["size"] = resp.status, len(resp.read())

    agent.request("POST", "/v2/repository/models/mlp/load")
    worst, polls = 0.0, 0
    thread = threading.Thread(target=big)
    thread.start()
    while thread.is_alive():
        started = time.perf_counter()
        assert agent.request("GET", "/v2/health/ready")[0] == 200
        worst = max(worst, time.perf_counter() - started)
        polls += 1
        time.sleep(0.02)
    thread.join()
    assert result["status"] == 200
    # how long a poll waits at worst (the target: < 0.5 s) is bench/reliability.py's
    assert polls >= 5, (polls, worst)


# -- read timeouts ----------------------------------------------------------------------


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _half_header_is_cut_off(server, path: bytes) -> float:
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\nConte")
        assert _read_all(sock) == b""  # closed, nothing answered
        return time.monotonic() - started


def _slow_body_is_408(server, path: bytes) -> dict:
    with _connect(server) as sock:
        sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"in")
        reply = _read_all(sock)  # the answer, then the connection closes
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    return json.loads(payload)


def test_agent_read_timeouts(repo, start_agent):
    add_mlp(repo, "mlp")
    agent = start_agent(repo, read_timeout_s=1.0)
    took = _half_header_is_cut_off(agent, b"/v2/models/mlp/infer")
    assert 0.9 <= took < 4, took
    reply = _slow_body_is_408(agent, b"/v2/models/mlp/infer")
    assert "not received within 1 s" in reply["error"]
    # a client that sends in time is served, also after a pause shorter than the limit
    with _connect(agent) as sock:
        body = json.dumps(_rows(1)).encode()
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
                     b"Connection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.5)
        sock.sendall(body[10:])
        assert _read_all(sock).startswith(b"HTTP/1.1 200")
    assert agent.request("POST", "/v2/models/mlp/infer", _rows(1))[0] == 200


def test_coordinator_read_timeouts(start_coordinator):
    co = start_coordinator(read_timeout_s=1.0)
    took = _half_header_is_cut_off(co, b"/v1/nodes/n1/report")
    assert 0.9 <= took < 4, took
    assert "read_timeout_s" in _slow_body_is_408(co, b"/v1/nodes/n1/report")["error"]
    assert co.request("GET", "/v1/health")[0] == 200


# -- the bytes of request bodies in flight ------------------------------------------------


def test_body_memory_counts_what_arrives_and_half_read_bodies_never_wait_for_each_other():
    """Bytes are counted as they arrive, never as announced; a piece that would leave
    two bodies half read waiting for each other waits instead (the banker's rule), and
    goes on once the other is answered; a body larger than the limit is read alone;
    promises made ahead (gRPC) wait in a queue of their own, never ahead of bodies."""
    import asyncio

    from agent.http.body import BodyMemory

    async def scenario():
        memory = BodyMemory(100, step_min=0, step_max=0)  # no step ahead: exact counts
        silent = [memory.open(64) for _ in range(8)]  # announced, nothing sent
        assert memory.in_flight_bytes == 0
        a, b = memory.open(60), memory.open(60)
        for arrived in (30, 40, 50):
            assert memory.count(a, arrived)
            if arrived < 50:
                assert memory.count(b, arrived)
        # b at 50 would leave both needing 10 with 0 free: it waits
        assert not memory.count(b, 50)
        late = asyncio.create_task(memory.room(b, 50))
        await asyncio.sleep(0.01)
        assert not late.done() and b.waiting and memory.in_flight_bytes == 90
        small = memory.open(5)  # a small body still fits beside them
        assert memory.count(small, 5)
        memory.close(small)
        assert memory.count(a, 60)
        memory.finish(a, 60)  # read whole: answered next
        await asyncio.sleep(0.01)
        assert not late.done()  # 60 + 40 in flight: no room until a's answer
        memory.close(a)
        await asyncio.wait_for(late, 1)
        assert memory.count(b, 60)
        memory.close(b)
        for body in silent:
            memory.close(body)
        assert memory.in_flight_bytes == 0 and memory.describe()["reading"] == 0

        huge = memory.open(500)  # over the whole limit: read when alone
        assert memory.count(huge, 500)
        memory.close(huge)

        await memory.reserve_aside(60, share=80)  # a gRPC message's room
        queued = asyncio.create_task(memory.reserve_aside(30, share=80))  # past the share
        await asyncio.sleep(0.01)
        body = memory.open(30)
        assert memory.count(body, 30)  # not behind the promise
        assert not queued.done() and memory.in_flight_bytes == 90
        memory.close(body)
        memory.release_aside(60, keep=20)  # its message arrived: 20 bytes
        await asyncio.wait_for(queued, 1)
        assert memory.in_flight_bytes == 50 and memory.aside_bytes == 30
        gone = asyncio.create_task(memory.reserve_aside(60, share=100))
        await asyncio.sleep(0.01)
        gone.cancel()  # a call that goes away while it waits takes nothing
        await asyncio.gather(gone, return_exceptions=True)
        memory.release_aside(30)
        memory.release(20)
        assert memory.describe() == {"in_flight_bytes": 0, "limit_bytes": 100,
                                     "peak_bytes": 500, "reading": 0, "waiting": 0,
                                     "waits": 3, "refused": 0}

    asyncio.run(scenario())


def test_bodies_in_flight_are_bounded_and_counted_and_wait_rather_than_fail(
        repo, start_agent):
    """8 clients post 1.3 MB bodies to an agent that lets 3 MB of bodies in flight:
    every request is served (their pieces wait their turn, none refused: bodies half
    read never wait for each other), the bodies in flight never exceed the bound, and
    the waits are counted. Clients that announce a large body and never send it hold
    what they sent, not what they announced: the others are served meanwhile. (A 60 s
    SLO: the bouncer would otherwise refuse some of these 60,000-row requests as late
    behind the others; not tested here.)"""
    add_mlp(repo, "mlp", config={"slo": {"latency_ms": 60000}})
    agent = start_agent(repo, max_request_rows=10**6, max_request_bytes_in_flight=3_000_000)
    body = json.dumps(_rows(60_000)).encode()
    assert 1.2e6 < len(body) < 1.5e6
    statuses, peaks = [], []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peaks.append(agent.request("GET", "/v1/memory")[2]["cpu"]["request_bodies"]
                         ["in_flight_bytes"])
            time.sleep(0.005)

    def client():
        for _ in range(4):
            status, _, reply = agent.request("POST", "/v2/models/mlp/infer", body)
            statuses.append(status if status == 200 else (status, reply))

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = [threading.Thread(target=client) for _ in range(8)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    stop.set()
    watcher.join()
    assert statuses == [200] * 32
    bodies = agent.request("GET", "/v1/memory")[2]["cpu"]["request_bodies"]
    assert bodies["in_flight_bytes"] == 0 and bodies["refused"] == 0
    assert bodies["waits"] > 0 and 2 * len(body) <= bodies["peak_bytes"] <= 3_000_000
    assert max(peaks) <= 3_000_000
    metrics = agent.request("GET", "/metrics")[2].decode()
    assert "edgeagent_request_body_limit_bytes 3e+06" in metrics
    assert "edgeagent_request_body_waits_total" in metrics

    agent = start_agent(repo, max_request_rows=10**6, max_request_bytes_in_flight=3_000_000,
                        read_timeout_s=1.0)
    # two clients announce 2.5 MB and send 1 byte: each holds what it sent (and a step
    # ahead, 64 KiB), not what it announced, so a 1.3 MB body is served meanwhile; they
    # get 408 after read_timeout_s
    start = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
             b"Content-Length: 2500000\r\n\r\n{")
    with _connect(agent) as first, _connect(agent) as second:
        first.sendall(start)
        second.sendall(start)
        time.sleep(0.2)
        held = agent.request("GET", "/v1/memory")[2]["cpu"]["request_bodies"]
        assert held["in_flight_bytes"] <= 2 * (2**16 + 1) and held["reading"] == 2, held
        started = time.monotonic()
        status, _, reply = agent.request("POST", "/v2/models/mlp/infer", body)
        assert status == 200 and time.monotonic() - started < 0.9, reply
        assert _read_all(first).startswith(b"HTTP/1.1 408")
        assert _read_all(second).startswith(b"HTTP/1.1 408")
    assert agent.request("POST", "/v2/models/mlp/infer", body)[0] == 200
    assert agent.request("GET", "/v1/memory")[2]["cpu"]["request_bodies"][
        "in_flight_bytes"] == 0
