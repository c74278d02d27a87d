"""The KServe v2 gRPC endpoint (agent.node.grpc_v2) on a real agent on 127.0.0.1, driven
by the unmodified ``tritonclient.grpc`` (and, for typed contents and trailing metadata,
by raw calls through tritonclient's own copy of the upstream protos)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from agent.modelzoo import mlp_forward
from agent.node.grpc_v2 import start_grpc
from tests.helpers import add_mlp, add_synthetic, reserved_port, wait_for
from tests.triton_models import write_simple

#: ~4 MB of weights: the measured footprints of two such models are close, so a budget
#: of 1.5 of one holds one, never two.
MLP = dict(inputs=4, hidden=1024, layers=2, outputs=2)


def _repo(repo: Path) -> Path:
    write_simple(repo / "simple" / "1" / "model.onnx")
    write_simple(repo / "simple_string" / "1" / "model.onnx", strings=True)
    for i in range(3):
        add_mlp(repo, f"mlp{i}", seed=i, **MLP)
    return repo


def _serve_grpc(agent):
    server = agent.call(start_grpc(agent.node, "127.0.0.1", 0))
    agent.grpc_url = f"127.0.0.1:{server.port}"
    agent.grpc_server = server
    return agent


@pytest.fixture
def serve(start_agent):
    """serve(repo, **config) -> a started agent with its gRPC endpoint on ``grpc_url``."""
    agents = []

    def start(repo, **config):
        agent = _serve_grpc(start_agent(repo, **config))
        agents.append(agent)
        return agent

    yield start
    for agent in agents:  # before the agent's own teardown closes the node
        agent.call(agent.grpc_server.stop(0))


def _fit_one(agent, names):
    """Shrink the CPU budget to 1.5 times the largest of ``names`` (loaded first to
    measure them), so that no two of the MLPs fit: each switch between them evicts and
    reloads."""
    sizes = {}
    for name in names:
        agent.call(agent.node.cache.ensure_loaded(name))
        sizes[name] = agent.node.cache.entry(name).account.size_bytes
    agent.call(_set_budget(agent.node, int(max(sizes.values()) * 1.5)))
    mlps = sorted(size for name, size in sizes.items() if name.startswith("mlp"))
    assert len(mlps) < 2 or mlps[0] + mlps[1] > max(sizes.values()) * 1.5, sizes
    return sizes


async def _set_budget(node, budget):
    node.cache.set_budget("cpu", budget)  # shrinking evicts nothing by itself: start empty
    for entry in node.cache.listing():
        if entry.state.value == "ready":
            await node.cache.evict(entry.name, entry.version)


def _simple_inputs(batch=1, binary_dtype="INT32"):
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [batch, 16], binary_dtype),
              grpcclient.InferInput("INPUT1", [batch, 16], binary_dtype)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _loads(agent, name):
    return agent.node.cache.entry(name).stats.loads


def _stub(agent):
    channel = grpc.insecure_channel(agent.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_health_and_metadata(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "edgeagent" and "model_repository" in meta["extensions"]
    assert not client.is_model_ready("simple")  # nothing loaded yet
    model = client.get_model_metadata("simple", as_json=True)
    assert model["name"] == "simple" and model["versions"] == ["1"]
    assert model["platform"] == "onnxruntime_onnx"
    assert model["inputs"] == [{"name": f"INPUT{i}", "datatype": "INT32", "shape": ["-1", "16"]}
                               for i in range(2)]
    assert [o["name"] for o in model["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert client.is_model_ready("simple")  # metadata of a cold model loads it, as HTTP does
    assert client.is_model_ready("simple", model_version="1")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND" and "nope" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.is_model_ready("simple", model_version="x")
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_infer_and_async_infer_with_evictions_between_calls(repo, serve):
    agent = serve(_repo(repo))
    _fit_one(agent, ["simple", "mlp0", "mlp1"])
    loads = {m: _loads(agent, m) for m in ("mlp0", "mlp1")}
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for round_ in range(3):
        inputs, a, b = _simple_inputs(batch=2)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"),
                   grpcclient.InferRequestedOutput("OUTPUT1")]
        result = client.infer("simple", inputs, outputs=outputs, request_id=f"r{round_}")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        response = result.get_response(as_json=True)
        assert response["id"] == f"r{round_}" and response["model_version"] == "1"

        for i in (0, 1):  # async_infer: each MLP evicts the other
            done = threading.Event()
            answers = []
            mlp_in = grpcclient.InferInput("X", list(x.shape), "FP32")
            mlp_in.set_data_from_numpy(x)
            client.async_infer(f"mlp{i}", [mlp_in], lambda result, error: (
                answers.append((result, error)), done.set()))
            assert done.wait(30)
            result, error = answers[0]
            assert error is None, error
            np.testing.assert_allclose(result.as_numpy("Y"), mlp_forward(x, seed=i, **MLP),
                                       rtol=1e-4, atol=1e-4)
            assert agent.node.cache.entry(f"mlp{1 - i}").state.value != "ready"
    assert _loads(agent, "mlp0") - loads["mlp0"] >= 2  # reloaded (mlp0 was evicted first)
    assert _loads(agent, "mlp1") - loads["mlp1"] >= 2
    # one output only, by name
    inputs, a, b = _simple_inputs()
    result = client.infer("simple", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bytes_in_raw_contents(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    a, b = np.arange(16).reshape(1, 16), np.full((1, 16), 7)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"),
              grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([str(v).encode() for v in a.flat],
                                           dtype=object).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.array([str(v).encode() for v in b.flat],
                                           dtype=object).reshape(1, 16))
    result = client.infer("simple_string", inputs)
    assert [int(v) for v in result.as_numpy("OUTPUT0").flat] == list((a + b).flat)
    assert [int(v) for v in result.as_numpy("OUTPUT1").flat] == list((a - b).flat)


def _typed_request(model, tensors, **request):
    req = service_pb2.ModelInferRequest(model_name=model, **request)
    for name, datatype, shape, field, values in tensors:
        t = req.inputs.add(name=name, datatype=datatype, shape=shape)
        getattr(t.contents, field).extend(values)
    return req


def test_typed_contents(repo, serve):
    agent = serve(_repo(repo))
    channel, stub = _stub(agent)
    with channel:
        a, b = list(range(16)), [5] * 16
        response = stub.ModelInfer(_typed_request("simple", [
            ("INPUT0", "INT32", [1, 16], "int_contents", a),
            ("INPUT1", "INT32", [1, 16], "int_contents", b)]))
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert list(response.outputs[0].shape) == [1, 16]
        out0 = np.frombuffer(response.raw_output_contents[0], np.int32)
        out1 = np.frombuffer(response.raw_output_contents[1], np.int32)
        assert list(out0) == [x + y for x, y in zip(a, b)]
        assert list(out1) == [x - y for x, y in zip(a, b)]

        response = stub.ModelInfer(_typed_request("simple_string", [
            ("INPUT0", "BYTES", [1, 16], "bytes_contents", [str(v).encode() for v in a]),
            ("INPUT1", "BYTES", [1, 16], "bytes_contents", [str(v).encode() for v in b])]))
        assert response.outputs[0].datatype == "BYTES"
        raw = response.raw_output_contents[0]  # 4-byte length + bytes per element
        values, offset = [], 0
        while offset < len(raw):
            n = int.from_bytes(raw[offset:offset + 4], "little")
            values.append(int(raw[offset + 4:offset + 4 + n]))
            offset += 4 + n
        assert values == [x + y for x, y in zip(a, b)]

        x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
        response = stub.ModelInfer(_typed_request(
            "mlp1", [("X", "FP32", [2, 4], "fp32_contents", x.ravel().tolist())],
            id="typed"))
        assert response.id == "typed"
        y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 2)
        np.testing.assert_allclose(y, mlp_forward(x, seed=1, **MLP), rtol=1e-4, atol=1e-4)


def _code(call, *args, **kwargs):
    """(status code, details, trailing metadata) of a call that must fail."""
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    return err.value.code(), err.value.details(), dict(err.value.trailing_metadata() or ())


@pytest.mark.parametrize("tensors, request_kw, words", [
    ([("INPUT0", "INT32", [1, 15], "int_contents", range(15)),
      ("INPUT1", "INT32", [1, 15], "int_contents", range(15))], {}, ["INPUT0", "shape"]),
    ([("INPUT0", "INT32", [1, 16], "int_contents", range(15)),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))], {}, ["15 elements", "16"]),
    ([("INPUT0", "INT32", [1, 16], "fp32_contents", [1.0] * 16),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))], {}, ["int_contents"]),
    ([("INPUT0", "FP32", [1, 16], "fp32_contents", [1.0] * 16),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))], {}, ["INPUT0", "FP32"]),
    ([("INPUT0", "INT32", [1, 16], "int_contents", range(16))], {}, ["missing", "INPUT1"]),
    ([("INPUT0", "INT8", [1, 2], "int_contents", [1, 300])], {}, ["out of range", "INT8"]),
    ([("INPUT0", "FP16", [1], "fp32_contents", [1.0])], {}, ["raw_input_contents"]),
    ([("INPUT0", "COMPLEX", [1], "fp32_contents", [1.0])], {}, ["unknown datatype"]),
    ([("INPUT0", "INT32", [1, -16], "int_contents", [])], {}, ["negative"]),
    ([("INPUT0", "INT32", [1, 16], "int_contents", range(16)),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))],
     {"model_version": "one"}, ["version"]),
    ([("INPUT0", "INT32", [1, 16], "int_contents", range(16)),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))],
     {"outputs": [service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="NOPE")]},
     ["NOPE"]),
    ([("INPUT0", "INT32", [1, 16], "int_contents", range(16)),
      ("INPUT1", "INT32", [1, 16], "int_contents", range(16))],
     {"raw_input_contents": [b"\0" * 64]}, ["raw_input_contents", "2 inputs"]),
])
def test_bad_requests_are_invalid_argument_naming_the_problem(repo, serve, tensors,
                                                               request_kw, words):
    agent = serve(_repo(repo))
    channel, stub = _stub(agent)
    with channel:
        code, details, _ = _code(stub.ModelInfer, _typed_request("simple", tensors,
                                                                 **request_kw))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    for word in words:
        assert word in details, details


def test_raw_contents_of_the_wrong_size(repo, serve):
    agent = serve(_repo(repo))
    channel, stub = _stub(agent)
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    req.raw_input_contents.extend([b"\0" * 64, b"\0" * 60])
    with channel:
        code, details, _ = _code(stub.ModelInfer, req)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT1" in details and "60 bytes" in details and "64" in details


def test_a_message_must_parse_and_arrive_within_read_timeout(repo, serve):
    """ModelInfer receives its message itself (after room for it is counted): bytes
    that are not a ModelInferRequest are INVALID_ARGUMENT; a message that does not
    arrive within ``read_timeout_s`` is DEADLINE_EXCEEDED, and its room is given back."""
    agent = serve(_repo(repo), read_timeout_s=0.5)
    method = "/inference.GRPCInferenceService/ModelInfer"

    def late():
        time.sleep(3)
        yield b""

    with grpc.insecure_channel(agent.grpc_url) as channel:
        code, details, _ = _code(channel.unary_unary(method), b"\xff\xff\xff")
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in details
        code, details, _ = _code(channel.stream_unary(method), late(), timeout=30)
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and "read_timeout_s" in details
    assert agent.node.body_memory.in_flight_bytes == 0


@pytest.mark.parametrize("limit, counted", [(1_000_000, 300_000), (200_000, 100_000)])
def test_a_message_is_counted_at_what_its_hand_over_holds(repo, serve, limit, counted):
    """While a ModelInfer message is received, the in-flight limit counts what grpcio
    holds as it hands the message over (``HANDOFF_COPIES`` x ``max_request_size``; at
    most the gRPC share, the limit less ``max_request_size``, so a message of any
    allowed size is still served, alone, and an HTTP body beside it); once received,
    its own size; after the answer, nothing."""
    from agent.node.grpc_v2 import HANDOFF_COPIES

    assert HANDOFF_COPIES * 100_000 == 300_000
    agent = serve(_repo(repo), max_request_size=100_000, max_request_bytes_in_flight=limit)
    seen = []

    def message():
        time.sleep(0.3)  # the call waits for its message with its room counted
        seen.append(agent.node.body_memory.in_flight_bytes)
        yield _typed_request("simple", [
            ("INPUT0", "INT32", [1, 16], "int_contents", list(range(16))),
            ("INPUT1", "INT32", [1, 16], "int_contents", [5] * 16)]).SerializeToString()

    with grpc.insecure_channel(agent.grpc_url) as channel:
        answer = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")(
            message(), timeout=30)
    assert service_pb2.ModelInferResponse.FromString(answer).raw_output_contents
    memory = agent.node.body_memory
    assert seen == [counted] and memory.peak_bytes == counted, (seen, memory.describe())
    assert memory.in_flight_bytes == 0


def test_calls_waiting_for_their_messages_share_one_hand_over_and_leave_http_room(
        repo, serve):
    """4 ModelInfer calls that never send their message: the first promises 3 x
    ``max_request_size`` (its own and the hand-off's two copies), the others only
    their own; the promises stay within the gRPC share (the limit less
    ``max_request_size``), so an HTTP request is served meanwhile; once the calls go
    away, nothing is left counted."""
    from bench.strangers import silent_grpc_calls
    from tests.helpers import v2_body

    agent = serve(_repo(repo), max_request_size=100_000, max_request_bytes_in_flight=1_000_000,
                  read_timeout_s=30)
    memory = agent.node.body_memory
    with silent_grpc_calls(agent.grpc_url, 4):
        wait_for(lambda: memory.in_flight_bytes == 300_000 + 3 * 100_000, 10,
                 "4 calls waiting for their messages")
        status, _, reply = agent.request("POST", "/v2/models/mlp0/infer",
                                         v2_body([1.0] * 4, shape=(1, 4)))
        assert status == 200, reply
    wait_for(lambda: memory.in_flight_bytes == 0, 10, "nothing counted")


def test_no_room_for_the_hand_over_is_resource_exhausted(repo, serve):
    """A message whose hand-over does not fit within ``read_timeout_s`` is never read:
    RESOURCE_EXHAUSTED with retry-after, naming what it needs and the limit."""
    agent = serve(_repo(repo), max_request_size=100_000, max_request_bytes_in_flight=200_000,
                  read_timeout_s=0.3)

    async def hold() -> None:  # an HTTP body in flight, on the agent's loop
        agent.node.body_memory.take(150_000)

    agent.call(hold())
    with grpc.insecure_channel(agent.grpc_url) as channel:
        code, details, trailing = _code(
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer"), b"",
            timeout=30)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
    for words in ("100000 bytes", "3 x max_request_size", "max_request_bytes_in_flight"):
        assert words in details, details
    assert trailing.get("retry-after") == "1"
    assert agent.node.body_memory.in_flight_bytes == 150_000  # nothing of its own left


def test_request_limits_are_resource_exhausted(repo, serve):
    """max_request_rows, max_tensor_bytes (checked from the declared shapes, as over
    HTTP: 413) and max_request_size (the largest gRPC message) answer
    RESOURCE_EXHAUSTED."""
    agent = serve(_repo(repo), max_request_rows=4, max_tensor_bytes=500,
                  max_request_size=100_000)
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    for batch, words in ((5, ["5 rows", "max_request_rows"]),
                         (4, ["512 bytes", "max_tensor_bytes"])):
        inputs, _, _ = _simple_inputs(batch=batch)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", inputs)
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        for word in words:
            assert word in err.value.message(), err.value.message()
    x = np.zeros((1, 30_000), np.float32)  # 120 kB: over max_request_size
    inp = grpcclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp0", [inp])
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    inputs, a, b = _simple_inputs(batch=2)  # within every limit
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)


def test_unknown_model_and_unimplemented_stream(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    inputs, _, _ = _simple_inputs()
    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", inputs)
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.value.message()
    channel, stub = _stub(agent)
    with channel:
        code, details, _ = _code(lambda: list(stub.ModelStreamInfer(iter(
            [service_pb2.ModelInferRequest(model_name="simple")]))))
    assert code is grpc.StatusCode.UNIMPLEMENTED and "ModelInfer" in details


def test_a_load_that_cannot_get_room_is_unavailable_with_retry_after(repo, serve):
    # "hog" is in use (a 1.5 s request) and fills the budget: "other" waits 0.3 s for
    # room (load_wait_max_s), then the agent answers 503, here UNAVAILABLE.
    add_synthetic(repo, "hog", size_bytes=70_000_000, base_ms=1500)
    add_synthetic(repo, "other", size_bytes=50_000_000)
    agent = serve(repo, budget=100_000_000, load_wait_max_s=0.3)
    channel, stub = _stub(agent)

    def request(model):
        req = service_pb2.ModelInferRequest(model_name=model)
        t = req.inputs.add(name="X", datatype="FP32", shape=[1, 1])
        t.contents.fp32_contents.append(1.0)
        return req

    with channel, ThreadPoolExecutor(1) as pool:
        hog = pool.submit(stub.ModelInfer, request("hog"))
        deadline = time.time() + 10
        while agent.node.cache.entry("hog").account.in_flight == 0 and time.time() < deadline:
            time.sleep(0.01)
        code, details, trailing = _code(stub.ModelInfer, request("other"))
        assert hog.result(30).model_name == "hog"
    assert code is grpc.StatusCode.UNAVAILABLE, details
    assert "other" in details
    assert int(trailing["retry-after"]) >= 1


def test_a_model_that_can_never_fit_is_resource_exhausted(repo, serve):
    add_synthetic(repo, "huge", size_bytes=300_000_000)
    agent = serve(repo, budget=100_000_000)
    channel, stub = _stub(agent)
    req = service_pb2.ModelInferRequest(model_name="huge")
    t = req.inputs.add(name="X", datatype="FP32", shape=[1, 1])
    t.contents.fp32_contents.append(1.0)
    with channel:
        code, details, trailing = _code(stub.ModelInfer, req)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "huge" in details  # HTTP 507
    assert "retry-after" not in trailing  # retrying cannot help


def test_the_calls_deadline_bounds_the_request(repo, serve):
    """A call's gRPC deadline is the request's timeout, as the ``timeout`` parameter is:
    a model that cannot answer in time does not hold the client past it."""
    add_synthetic(repo, "slow", size_bytes=1000, base_ms=1500)
    agent = serve(repo)
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    x = np.ones((1, 1), np.float32)
    inp = grpcclient.InferInput("X", [1, 1], "FP32")
    inp.set_data_from_numpy(x)
    started = time.perf_counter()
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", [inp], client_timeout=0.3)
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert time.perf_counter() - started < 1.2
    assert client.infer("slow", [inp]).as_numpy("Y").shape == (1, 1)  # still serving


def test_repository_extension_behind_the_admin_token(repo, serve, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-0123456789abcdef0123456789abcdef\n")
    agent = serve(_repo(repo), admin_token_file=token)
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    auth = {"authorization": "Bearer s3cret-0123456789abcdef0123456789abcdef"}
    for call in (lambda h: client.get_model_repository_index(headers=h),
                 lambda h: client.load_model("simple", headers=h),
                 lambda h: client.unload_model("simple", headers=h)):
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-0123456789abcdef0123456789abcdef"}):
            with pytest.raises(InferenceServerException) as err:
                call(headers)
            assert err.value.status() == "StatusCode.UNAUTHENTICATED"
            assert "authorization" in err.value.message().lower()
    index = client.get_model_repository_index(headers=auth, as_json=True)["models"]
    assert {m["name"] for m in index} == {"simple", "simple_string", "mlp0", "mlp1", "mlp2"}
    assert {m["state"] for m in index} == {"UNAVAILABLE"}
    client.load_model("simple", headers=auth)
    assert client.is_model_ready("simple", headers=auth)
    ready = client.get_model_repository_index(headers=auth, as_json=True)["models"]
    assert ready == [{"name": "simple", "version": "1", "state": "READY"}] or \
        {"name": "simple", "version": "1", "state": "READY"} in ready
    client.unload_model("simple", headers=auth)
    assert not client.is_model_ready("simple", headers=auth)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("no_such_model", headers=auth)
    assert err.value.status() == "StatusCode.NOT_FOUND"
    # Triton's config override (parameters.config), as over HTTP
    client.load_model("simple", headers=auth, config='{"max_batch_size": 16}')
    assert client.get_model_config("simple", headers=auth).config.max_batch_size == 16
    for params, words in (({"config": '"parameters": {"config": {}}'}, ["config"]),
                          ({"config": "{}", "files": {"file:1/model.onnx": b"x"}},
                           ["unsupported load parameter", "file:1/model.onnx"])):
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", headers=auth, **params)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        for word in ["failed to load", *words]:
            assert word in err.value.message(), err.value.message()
    assert client.get_model_config("simple", headers=auth).config.max_batch_size == 16  # kept
    # The data plane needs the token too (auth.protect's default with one).
    inputs, a, b = _simple_inputs()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs)
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    np.testing.assert_array_equal(
        client.infer("simple", inputs, headers=auth).as_numpy("OUTPUT0"), a + b)


def test_model_config_and_statistics(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    config = client.get_model_config("simple", as_json=True)["config"]
    assert config["name"] == "simple" and config["platform"] == "onnxruntime_onnx"
    assert int(config["max_batch_size"]) > 0  # [-1, 16]: the first dimension batches
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", ["16"]), ("INPUT1", "TYPE_INT32", ["16"])]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert client.get_model_config("simple_string").config.input[0].data_type == 13  # STRING
    for _ in range(3):
        inputs, _, _ = _simple_inputs(batch=2)
        client.infer("simple", inputs)
    (stats,) = client.get_inference_statistics("simple").model_stats
    assert (stats.name, stats.version, stats.inference_count) == ("simple", "1", 6)
    assert stats.inference_stats.success.count == 3 and stats.inference_stats.success.ns > 0
    assert stats.execution_count >= 1 and stats.last_inference > 0
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in every} >= {"simple", "simple_string", "mlp0"}
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"


def test_repository_index_ready_filter_without_a_token(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    client.load_model("mlp1")
    channel, stub = _stub(agent)
    with channel:
        ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        assert [(m.name, m.state) for m in ready.models] == [("mlp1", "READY")]
        code, details, _ = _code(stub.RepositoryIndex,
                                 service_pb2.RepositoryIndexRequest(repository_name="other"))
    assert code is grpc.StatusCode.NOT_FOUND and "other" in details


def test_concurrent_clients_over_several_models_all_answered(repo, serve):
    agent = serve(_repo(repo))
    _fit_one(agent, ["simple", "mlp0", "mlp1"])  # one model at a time: constant churn
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    expected = {f"mlp{i}": mlp_forward(x, seed=i, **MLP) for i in range(2)}

    def worker(k):
        client = grpcclient.InferenceServerClient(agent.grpc_url)
        answered = 0
        for j in range(20):
            model = ["simple", "mlp0", "mlp1"][(k + j) % 3]
            if model == "simple":
                inputs, a, b = _simple_inputs(batch=1 + j % 3)
                result = client.infer("simple", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            else:
                inp = grpcclient.InferInput("X", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                result = client.infer(model, [inp])
                np.testing.assert_allclose(result.as_numpy("Y"), expected[model],
                                           rtol=1e-4, atol=1e-4)
            answered += 1
        client.close()
        return answered

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) == 160
    metrics = agent.request("GET", "/metrics")[2].decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("edgeagent_requests_total{")
                  and 'endpoint="v2-grpc"' in line and 'code="200"' in line)
    assert counted == 160
    assert _loads(agent, "mlp0") + _loads(agent, "mlp1") > 4  # evictions happened


def test_metrics_count_grpc_errors_under_the_v2_grpc_endpoint(repo, serve):
    agent = serve(_repo(repo))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    inputs, _, _ = _simple_inputs()
    with pytest.raises(InferenceServerException):
        client.infer("nope", inputs)
    metrics = agent.request("GET", "/metrics")[2].decode()
    assert any('endpoint="v2-grpc"' in line and 'code="404"' in line and
               'model="<unknown>"' in line for line in metrics.splitlines()
               if line.startswith("edgeagent_requests_total{"))


def test_our_proto_matches_upstream_names_and_numbers():
    """Every message and RPC of ours is upstream's (tritonclient's copy of Triton's
    grpc_service.proto, a superset of KServe's): same names, field numbers, types."""
    from google.protobuf import descriptor_pb2

    from agent.node.protos import grpc_predict_v2_pb2 as ours

    def protos(module):
        fd = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fd)
        return fd

    mine, theirs = protos(ours), protos(service_pb2)
    assert mine.package == theirs.package == protos(model_config_pb2).package == "inference"
    upstream = {m.name: m for m in theirs.message_type}
    upstream.update({m.name: m for m in protos(model_config_pb2).message_type})
    # Triton's statistics and model configuration messages: ours hold some of the fields
    partial = {"ModelStatistics", "ModelConfig", "ModelInput", "ModelOutput",
               "ModelInstanceGroup", "ModelDynamicBatching"}
    for message in mine.message_type:
        theirs_ = upstream[message.name]
        if message.name not in partial:
            assert message == theirs_, message.name
            continue
        fields = {f.name: f for f in theirs_.field}
        for field in message.field:
            assert field == fields[field.name], f"{message.name}.{field.name}"
        for enum in message.enum_type:
            assert enum in theirs_.enum_type, f"{message.name}.{enum.name}"
    (data_type,) = mine.enum_type
    assert data_type in protos(model_config_pb2).enum_type
    (service,) = mine.service
    (upstream_service,) = theirs.service
    assert service.name == upstream_service.name == "GRPCInferenceService"
    methods = {m.name: m for m in upstream_service.method}
    for method in service.method:
        assert method == methods[method.name], method.name
    assert {m.name for m in service.method} >= {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
        "ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex",
        "RepositoryModelLoad", "RepositoryModelUnload"}


def test_generated_code_imports_without_warnings():
    """The generated modules load on the protobuf runtime installed (6.31+ or 7.x),
    without a version warning, beside tritonclient's copy of the same names."""
    code = ("import warnings; warnings.simplefilter('error'); "
            "import tritonclient.grpc.service_pb2; "
            "from agent.node.protos import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def _serve_process(repo, tmp_path, *flags):
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository", str(repo),
         "--port", "0", "--data-dir", str(tmp_path / "data"), "--cpu-budget", "300MB",
         *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_edgeagent_serve_grpc_port(repo, tmp_path):
    """``edgeagent serve --grpc-port P``: gRPC on the agent's own event loop (uvloop)
    beside HTTP; SIGTERM stops both."""
    import signal

    with reserved_port() as port:  # --grpc-port 0 disables gRPC: a port of our own
        proc = _serve_process(_repo(repo), tmp_path, "--grpc-port", str(port))
        try:
            lines = [proc.stdout.readline() for _ in range(2)]
            assert "listening on" in lines[0], "".join(lines) + proc.stderr.read()
            assert lines[1].split()[-1] == f"127.0.0.1:{port}"
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            deadline = time.time() + 30
            while not client.is_server_ready():
                assert time.time() < deadline
                time.sleep(0.1)
            inputs, a, b = _simple_inputs()
            np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT1"),
                                          a - b)
            http = lines[0].split()[3]
            import urllib.request
            with urllib.request.urlopen(f"{http}/v1/cache/simple", timeout=10) as resp:
                assert b'"ready"' in resp.read()  # the same node answers both protocols
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        with socket.socket() as s:  # the port was given back: nothing listens on it (the
            # closed connections' TIME_WAIT would refuse a bind without SO_REUSEADDR)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def test_grpc_port_in_use_fails_the_start_and_zero_disables(repo, tmp_path):
    add_synthetic(repo, "syn", size_bytes=1000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve_process(repo, tmp_path, "--grpc-port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    # what holds it, and how to choose another (or none)
    said = err.strip().splitlines()[-1]
    assert said == (f"Error: gRPC: port {port} on 127.0.0.1 is in use: another process "
                    f"listens there (`ss -ltnp 'sport = :{port}'` names it); stop it, or "
                    "choose another port with --grpc-port (make run: PORT=8010 "
                    "GRPC_PORT=8011) (--grpc-port 0: no gRPC endpoint)"), err

    proc = _serve_process(repo, tmp_path, "--grpc-port", "0")
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        assert "gRPC" not in proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(30)


def test_grpc_port_config_key(tmp_path):
    from agent.config import AgentConfig, ConfigError, parse_agent_config

    assert AgentConfig().grpc_port == 8001
    assert parse_agent_config({"grpc_port": 9001}).grpc_port == 9001
    assert parse_agent_config({"grpc_port": 0}).grpc_port == 0
    for bad in (70000, -1, "x", 1.5):
        with pytest.raises(ConfigError, match="grpc_port"):
            parse_agent_config({"grpc_port": bad})


def test_scoped_tokens_over_grpc(repo, serve, tmp_path):
    """No or an unknown token: UNAUTHENTICATED; a token without the scope:
    PERMISSION_DENIED; with auth.protect the data plane needs an infer token."""
    import yaml

    from agent.security.authconfig import AgentAuthSettings
    from agent.security.credentials import new_token, token_hash

    read, infer = new_token(), new_token()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([
        {"name": "r", "sha256": token_hash(read), "scopes": ["read"]},
        {"name": "i", "sha256": token_hash(infer), "scopes": ["infer"]}]))
    agent = serve(_repo(repo), auth=AgentAuthSettings(token_file=tokens,
                                                      protect=("infer",)))
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    inputs, a, b = _simple_inputs()

    def code(call):
        with pytest.raises(InferenceServerException) as err:
            call()
        return err.value.status()

    assert code(lambda: client.infer("simple", inputs)) == "StatusCode.UNAUTHENTICATED"
    assert code(lambda: client.infer("simple", inputs, headers={
        "authorization": f"Bearer {new_token()}"})) == "StatusCode.UNAUTHENTICATED"
    assert code(lambda: client.infer("simple", inputs, headers={
        "authorization": f"Bearer {read}"})) == "StatusCode.PERMISSION_DENIED"
    assert code(lambda: client.get_model_repository_index(headers={
        "authorization": f"Bearer {infer}"})) == "StatusCode.PERMISSION_DENIED"
    assert code(lambda: client.get_model_config("simple", headers={
        "authorization": f"Bearer {infer}"})) == "StatusCode.PERMISSION_DENIED"
    out = client.infer("simple", inputs, headers={"authorization": f"Bearer {infer}"})
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), a + b)
    assert client.get_model_config("simple", headers={"authorization": f"Bearer {read}"})
    assert client.is_server_live()  # health needs nothing
