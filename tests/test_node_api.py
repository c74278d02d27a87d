"""The agent's HTTP APIs on a real server (127.0.0.1) with real ONNX Runtime sessions:
OIP v2 through the unmodified tritonclient.http client, TF Serving REST, bad input."""

import numpy as np
import pytest
import tritonclient.http as tc
from tritonclient.utils import InferenceServerException

from agent.modelzoo import mlp_forward, write_echo
from tests.helpers import TINY_MLP, add_mlp, add_synthetic, v2_body


@pytest.fixture
def agent(repo, start_agent):
    add_mlp(repo, "mlp")
    add_mlp(repo, "mlp", version=2, seed=99)
    write_echo(repo / "echo" / "1" / "model.onnx")
    add_synthetic(repo, "syn", size_bytes=1000)
    return start_agent(repo)


def x_batch(n=3):
    return np.random.default_rng(1).standard_normal((n, TINY_MLP["inputs"])).astype(np.float32)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer_is_numerically_right(agent, binary):
    client = tc.InferenceServerClient(agent.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    x = x_batch()
    inp = tc.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = [tc.InferRequestedOutput("Y", binary_data=binary)]
    result = client.infer("mlp", [inp], outputs=out, request_id="r1")
    np.testing.assert_allclose(result.as_numpy("Y"), mlp_forward(x, **{**TINY_MLP, "seed": 99}),
                               rtol=1e-4, atol=1e-5)  # version 2 is the default
    assert result.get_response()["id"] == "r1"
    v1 = client.infer("mlp", [inp], model_version="1")
    np.testing.assert_allclose(v1.as_numpy("Y"), mlp_forward(x, **TINY_MLP), rtol=1e-4,
                               atol=1e-5)
    assert client.is_model_ready("mlp")
    meta = client.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["versions"] == ["1", "2"]
    index = client.get_model_repository_index()
    assert {(m["name"], m["state"]) for m in index} >= {("mlp", "READY"), ("echo", "UNAVAILABLE")}
    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    client.load_model("mlp")
    assert client.is_model_ready("mlp")


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips(agent, binary):
    client = tc.InferenceServerClient(agent.url.removeprefix("http://"))
    data = {"f32": ("FP32", np.array([[1.5, -2]], np.float32)),
            "f64": ("FP64", np.array([[1e300, 2]], np.float64)),
            "i32": ("INT32", np.array([[-7, 2**31 - 1]], np.int32)),
            "i64": ("INT64", np.array([[2**40, -1]], np.int64)),
            "b": ("BOOL", np.array([[True, False]])),
            "s": ("BYTES", np.array([[b"hello", "w\u00f6rld".encode()]], dtype=object))}
    inputs = []
    for key, (dt, arr) in data.items():
        i = tc.InferInput(f"in_{key}", list(arr.shape), dt)
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    outputs = [tc.InferRequestedOutput(f"out_{k}", binary_data=binary) for k in data]
    result = client.infer("echo", inputs, outputs=outputs, parameters={"trace": "abc"})
    for key, (dt, arr) in data.items():
        got = result.as_numpy(f"out_{key}")
        if dt == "BYTES" and not binary:  # JSON carries text; the client returns str
            got = np.vectorize(str.encode, otypes=[object])(got)
        assert got.tolist() == arr.tolist(), key
    assert result.get_response()["parameters"] == {"trace": "abc"}


def test_synthetic_model_sums_rows(agent):
    status, _, body = agent.request("POST", "/v2/models/syn/infer", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]})
    assert status == 200
    assert body["outputs"] == [{"name": "Y", "datatype": "FP32", "shape": [2, 1],
                                "data": [6.0, 15.0]}]


def test_tf_serving_rest_row_and_columnar(agent):
    x = x_batch(2)
    want = mlp_forward(x, **{**TINY_MLP, "seed": 99})
    status, _, body = agent.request("POST", "/v1/models/mlp:predict",
                                    {"instances": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["predictions"], want, rtol=1e-4, atol=1e-5)
    status, _, body = agent.request("POST", "/v1/models/mlp/versions/1:predict",
                                    {"inputs": {"X": x.tolist()}})
    assert status == 200
    np.testing.assert_allclose(body["outputs"], mlp_forward(x, **TINY_MLP), rtol=1e-4,
                               atol=1e-5)
    status, _, body = agent.request("POST", "/v1/models/mlp:predict",
                                    {"instances": [{"X": row} for row in x.tolist()]})
    assert status == 200 and len(body["predictions"]) == 2
    status, _, body = agent.request("GET", "/v1/models/mlp")
    assert status == 200
    assert body["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]


BAD_V2 = [
    ("/v2/models/mlp/infer", b"{not json", "malformed JSON"),
    ("/v2/models/mlp/infer", b"[1, 2]", "JSON object"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3, 4], datatype="FP64"), "datatype FP64"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3, 4], datatype="FLOAT9"), "unknown datatype"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3], shape=(1, 3)), "shape [1, 3]"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3], shape=(1, 4)), "3 elements"),
    ("/v2/models/mlp/infer", v2_body(["a", "b", "c", "d"]), "must be numbers"),
    ("/v2/models/mlp/infer", v2_body([[1, 2], [3]], shape=(2, 2)), "ragged"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3, 4], name="Z"), "unknown input 'Z'"),
    ("/v2/models/mlp/infer", {"inputs": []}, "non-empty list"),
    ("/v2/models/mlp/infer", {**v2_body([1, 2, 3, 4]), "outputs": [{"name": "Q"}]},
     "unknown output 'Q'"),
    ("/v2/models/nope/infer", v2_body([1, 2, 3, 4]), "unknown model 'nope'"),
    ("/v2/models/mlp/versions/9/infer", v2_body([1, 2, 3, 4]), "no version 9"),
    ("/v2/models/mlp/versions/x/infer", v2_body([1, 2, 3, 4]), "versions are integers"),
    ("/v1/models/mlp:predict", b"{", "malformed JSON"),
    ("/v1/models/mlp:predict", {"instances": [[1, 2, 3]]}, "shape [1, 3]"),
    ("/v1/models/mlp:predict", {"instances": [["a", "b", "c", "d"]]}, "expected numbers"),
    ("/v1/models/mlp:predict", {"inputs": {"Z": [[1, 2, 3, 4]]}}, "unknown input 'Z'"),
    ("/v1/models/mlp:predict", {"instances": [[1]], "inputs": [[1]]}, "exactly one"),
    ("/v1/models/nope:predict", {"instances": [[1, 2, 3, 4]]}, "unknown model"),
]


@pytest.mark.parametrize("path, body, words", BAD_V2)
@pytest.mark.parametrize("warm", [False, True])
def test_bad_input_is_a_4xx_naming_the_problem(agent, path, body, words, warm):
    if warm:  # with the signature known, and with the model cold (checked after load)
        agent.request("POST", "/v2/repository/models/mlp/load")
    status, _, reply = agent.request("POST", path, body)
    assert 400 <= status < 500 and words in reply["error"], reply
    ok, _, _ = agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
    assert ok == 200  # the agent still serves


def test_binary_data_errors(agent):
    import json
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    ok, _, _ = agent.request("POST", "/v2/models/mlp/infer", header + bytes(16),
                             {"Inference-Header-Content-Length": str(len(header))})
    assert ok == 200
    status, _, body = agent.request("POST", "/v2/models/mlp/infer", header + bytes(12),
                                    {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "binary_data_size" in body["error"]
    status, _, body = agent.request("POST", "/v2/models/mlp/infer", header + bytes(16),
                                    {"Inference-Header-Content-Length": "99999"})
    assert status == 400 and "exceeds the body" in body["error"]


def test_payload_over_limit_is_413(repo, start_agent):
    add_mlp(repo, "mlp")
    agent = start_agent(repo, max_request_size=10_000)
    status, _, body = agent.request("POST", "/v2/models/mlp/infer",
                                    v2_body([0.0] * 4000, shape=(1000, 4)))
    assert status == 413 and "10000 bytes" in body["error"]
    assert agent.request("GET", "/v2/health/live")[0] == 200


def test_unknown_route_is_json_404(agent):
    status, _, body = agent.request("GET", "/v2/nothing/here")
    assert status == 404 and "error" in body


def test_metrics(agent):
    agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
    agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
    agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3]))
    status, _, text = agent.request("GET", "/metrics")
    text = text.decode()
    assert status == 200
    v2 = 'device="cpu",endpoint="v2",model="mlp",version="2"'
    assert f'edgeagent_requests_total{{code="200",{v2}}} 2.0' in text
    assert f'edgeagent_requests_total{{code="400",{v2}}} 1.0' in text
    assert f'edgeagent_request_duration_seconds_count{{{v2}}} 2.0' in text
    assert 'edgeagent_cache_misses_total{device="cpu",model="mlp",version="2"} 1.0' in text
    assert 'edgeagent_cache_hits_total{device="cpu",model="mlp",version="2"} 1.0' in text
    assert ('edgeagent_model_load_duration_seconds_count{device="cpu",model="mlp",'
            'version="2"} 1.0') in text
    assert 'edgeagent_memory_budget_bytes{device="cpu"} 2e+08' in text
    assert 'edgeagent_memory_used_bytes{device="cpu"}' in text


def test_metadata_of_a_cold_model_loads_it(agent):
    client = tc.InferenceServerClient(agent.url.removeprefix("http://"))
    assert not client.is_model_ready("echo")
    meta = client.get_model_metadata("echo")  # the usual first call of a client
    assert {i["name"] for i in meta["inputs"]} and meta["platform"] == "onnxruntime_onnx"
    assert client.is_model_ready("echo")
    with pytest.raises(InferenceServerException, match="nope"):
        client.get_model_metadata("nope")
