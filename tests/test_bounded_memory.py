"""Strangers cannot pin the agent's memory: a malformed body leaves nothing behind,
even with the garbage collector off (a real ``edgeagent serve`` process, its RSS and
its decoding child's read with psutil)."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.helpers import Agent, add_mlp, reserved_port

MiB = 2**20
BODY = 40 * MiB
MAX_REQUEST = 48 * MiB


def post(url: str, body: bytes, timeout: float = 120) -> int:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def padded(doc: dict, size: int) -> bytes:
    """``doc`` as JSON followed by spaces up to ``size`` bytes (still valid JSON)."""
    text = json.dumps(doc).encode()
    return text + b" " * (size - len(text))


def rss(process: psutil.Process) -> int:
    return process.memory_info().rss


def decoding_child(agent: Agent) -> psutil.Process:
    """The agent's decoding child process (not multiprocessing's resource tracker)."""
    children = [c for c in psutil.Process(agent.proc.pid).children()
                if "resource_tracker" not in " ".join(c.cmdline())]
    assert len(children) == 1, [c.cmdline() for c in children]
    return children[0]


def malformed_bodies() -> list[tuple[str, bytes]]:
    """(path, body) of 40 MiB: broken JSON, numbers that do not fit the shape, a
    binary header past the body, broken JSON for TF Serving."""
    numbers = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": ['
    numbers += b"1.5," * ((BODY - len(numbers) - 8) // 4) + b"1.5]}]}"
    return [("/v2/models/m/infer", b'{"inputs": [' + b"x" * (BODY - 12)),
            ("/v2/models/m/infer", numbers),
            ("/v1/models/m:predict", b'{"instances": [' + b"[1, 2, 3, 4" * (BODY // 11)),
            ("/v2/models/m/infer", padded({"inputs": 7}, BODY))]


def test_malformed_bodies_leave_nothing_behind_with_the_collector_off(repo, tmp_path):
    add_mlp(repo, "m")
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"max_request_size": MAX_REQUEST}))
    agent = Agent(repo, tmp_path / "data", "--config", str(config),
                  before="import gc; gc.disable()")
    try:
        process = psutil.Process(agent.proc.pid)
        # a well-formed body large enough for the decoding child starts it
        good = padded({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]}, 5 * MiB)
        assert post(agent.url + "/v2/models/m/infer", good) == 200
        child = decoding_child(agent)
        idle_agent, idle_child = rss(process), rss(child)
        bodies = malformed_bodies()
        for i in range(20):
            path, body = bodies[i % len(bodies)]
            assert post(agent.url + path, body) in (400, 413), path
            grown = rss(child) - idle_child
            assert grown <= 100 * MiB, f"body {i} ({path}) left the child {grown / MiB:.0f} MiB up"
        grown = rss(process) - idle_agent
        assert grown <= 1.5 * MAX_REQUEST, (
            f"20 malformed bodies of {BODY / MiB:.0f} MiB raised the agent's RSS by "
            f"{grown / MiB:.0f} MiB")
    finally:
        agent.stop()


class PeakRss:
    """The highest RSS of a process while the block runs, sampled every few ms."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, 0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.process))
            time.sleep(0.003)

    def __enter__(self) -> "PeakRss":
        self.peak = rss(self.process)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


IN_FLIGHT = 64 * MiB


@pytest.fixture
def bounded_agent(repo, tmp_path, request):
    """An agent with 64 MiB of bodies in flight and 2 gRPC calls at once (or
    ``request.param``); (agent, its gRPC address)."""
    add_mlp(repo, "m")
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"max_request_size": MAX_REQUEST,
                                  "max_request_bytes_in_flight": IN_FLIGHT,
                                  "grpc_max_concurrent_rpcs": getattr(request, "param", 2)}))
    with reserved_port() as port:
        agent = Agent(repo, tmp_path / "data", "--config", str(config),
                      "--grpc-port", str(port))
        try:
            yield agent, f"127.0.0.1:{port}"
        finally:
            agent.stop()


def test_chunked_bodies_are_counted_while_they_stream(bounded_agent):
    """8 chunked 40 MiB bodies at once: each is counted as it arrives; past the
    in-flight limit their pieces wait (their connections unread) in an order that
    lets one finish at a time rather than all stop halfway, so each is read whole and
    answered (413: not JSON numbers), none refused; the bodies in flight stay within
    the limit and the agent's RSS within the limit plus one body."""
    import aiohttp

    agent, _ = bounded_agent
    process = psutil.Process(agent.proc.pid)
    piece = b"x" * MiB

    async def send() -> tuple[int, str | None]:
        async def body():
            yield b'{"inputs": '
            for _ in range(BODY // MiB):
                yield piece
                await asyncio.sleep(0.005)  # a client on a network: the bodies overlap

        async with aiohttp.ClientSession() as session:
            async with session.post(agent.url + "/v2/models/m/infer", data=body(),
                                    timeout=aiohttp.ClientTimeout(total=120)) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

    async def all_at_once():
        return await asyncio.gather(*(send() for _ in range(8)))

    idle = rss(process)
    with PeakRss(process) as peak:
        answers = asyncio.run(all_at_once())
    statuses = sorted(status for status, _ in answers)
    assert set(statuses) <= {400, 413}, statuses  # 413: not JSON numbers
    grown = peak.peak - idle
    assert grown <= IN_FLIGHT + BODY + 16 * MiB, f"{grown / MiB:.0f} MiB, answers {statuses}"
    bodies = agent.get("/v1/memory")["cpu"]["request_bodies"]
    assert bodies["waits"] > 0 and bodies["refused"] == 0, bodies  # 8 x 40 MiB > 64 MiB
    assert bodies["peak_bytes"] <= IN_FLIGHT and bodies["in_flight_bytes"] == 0, bodies


#: What the calls hold beside the message handed over, not counted in flight: each
#: up to 64 KiB of its message unread and its own state in grpc and Python (about
#: 100 KiB a call, 5 MiB for 50 calls), and heap the allocator keeps between messages
#: (measured 2-5 MiB over the limit plus one message with 2 calls at once, 7-10 MiB
#: with 50).
GRPC_CALLS_ALLOWANCE = 12 * MiB


@pytest.mark.parametrize("bounded_agent", [2, 64], indirect=True,
                         ids=["2-calls-at-once", "64-calls-at-once"])
def test_grpc_messages_are_received_only_with_room(bounded_agent, request):
    """50 concurrent 32 MiB ModelInfer calls, each on its own connection: past
    ``grpc_max_concurrent_rpcs`` they get RESOURCE_EXHAUSTED at once; the others wait
    for room in the in-flight limit before their message is received (a stream not
    yet read holds 64 KiB). A message is counted at what grpcio holds while handing
    it over (3 x 48 MiB, capped at the gRPC share of the 64 MiB limit: the limit less
    max_request_size, at least half of it, so received alone), so the agent's RSS
    stays within the limit plus one message (3 x 32 MiB at the hand-over) and
    ``GRPC_CALLS_ALLOWANCE``, and none hangs."""
    import grpc

    from agent.node.protos import grpc_predict_v2_pb2 as pb

    agent, address = bounded_agent
    process = psutil.Process(agent.proc.pid)
    size = 32 * MiB
    message = pb.ModelInferRequest(
        model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="X", datatype="FP32", shape=[1, 4])],
        raw_input_contents=[b"\0" * size]).SerializeToString()  # refused once received
    # a connection per call (no shared subchannel), all connected before the calls
    # start and the message serialized once: the 50 calls reach the agent together
    options = [("grpc.max_send_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(address, options=options) for _ in range(50)]
    try:
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=30)
        idle = rss(process)
        with PeakRss(process) as peak:
            futures = [channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                       .future(message, timeout=120) for channel in channels]
            codes = []
            for future in futures:
                try:
                    future.result()
                    codes.append("OK")
                except grpc.RpcError as err:
                    codes.append(err.code().name)
    finally:
        for channel in channels:
            channel.close()
    counts = collections.Counter(codes)
    assert set(counts) <= {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}, counts
    assert counts["INVALID_ARGUMENT"] > 0, counts
    if request.node.callspec.params["bounded_agent"] == 2:
        assert counts["RESOURCE_EXHAUSTED"] > 0, counts  # past 2 calls at once
    bodies = agent.get("/v1/memory")["cpu"]["request_bodies"]
    assert bodies["waits"] > 0, bodies  # a message waited for room before it was read
    # each message was received with the whole share counted for it, and alone
    assert bodies["peak_bytes"] == IN_FLIGHT // 2 and bodies["in_flight_bytes"] == 0, bodies
    grown = peak.peak - idle
    assert grown <= IN_FLIGHT + size + GRPC_CALLS_ALLOWANCE, (
        f"{grown / MiB:.1f} MiB, answers {counts}")


@pytest.mark.parametrize("datatype, nested", [("FP32", False), ("FP32", True),
                                              ("INT64", False)])
def test_a_json_body_decodes_in_at_most_4_times_its_size(datatype, nested):
    """A JSON infer body's numbers go straight into the tensor (``jsonnumbers``): the
    decode's peak allocation (tracemalloc) is at most 4x the body, and the tensor is
    the one a plain parse gives."""
    import tracemalloc

    import numpy as np
    import orjson

    from agent.node.tensors import decode_v2_request

    rows = 2**19  # x 4 columns: about 10 MiB of JSON
    values = np.random.default_rng(7).uniform(-1e3, 1e3, (rows, 4))
    if datatype == "INT64":
        values = (values * 1e6).astype(np.int64)
    data = values.tolist() if nested else values.reshape(-1).tolist()
    body = orjson.dumps({"inputs": [{"name": "X", "datatype": datatype, "shape": [rows, 4],
                                     "data": data}]})
    expected = np.asarray(data).astype(values.dtype if datatype == "INT64" else np.float32)
    del data
    tracemalloc.start()
    try:
        inputs, _ = decode_v2_request(body, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(inputs["X"], expected.reshape(rows, 4))
    assert peak <= 4 * len(body), f"{peak / len(body):.1f}x a body of {len(body)} bytes"
