"""Triton's model configuration and statistics extensions, config.pbtxt, loads with a
config override, warm-up and TF Serving's metadata, on a real agent (127.0.0.1) through
the unmodified ``tritonclient.http`` client."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import tritonclient.http as tc
import yaml
from tritonclient.utils import InferenceServerException

from tests.helpers import add_synthetic
from tests.triton_models import write_triton_examples

# Field names of Triton's statistics extension (docs/protocol/extension_statistics.md).
STAT_FIELDS = {"name", "version", "last_inference", "inference_count", "execution_count",
               "inference_stats", "batch_stats"}
DURATIONS = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss"}


@pytest.fixture
def agent(repo, start_agent):
    write_triton_examples(repo)
    return start_agent(repo)


def client_of(agent) -> tc.InferenceServerClient:
    return tc.InferenceServerClient(agent.url.removeprefix("http://"))


def simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True,
                  datatype: str = "INT32") -> list:
    inputs = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        inp = tc.InferInput(name, list(x.shape), datatype)
        inp.set_data_from_numpy(x, binary_data=binary)
        inputs.append(inp)
    return inputs


def stats_of(client, name, version="") -> dict:
    stats = client.get_inference_statistics(name, version)["model_stats"]
    assert len(stats) == 1
    return stats[0]


def test_model_config_in_triton_fields(agent):
    client = client_of(agent)
    config = client.get_model_config("simple")
    assert config["name"] == "simple" and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 8  # from its config.pbtxt
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
    assert config["instance_group"] == [{"name": "simple_0", "count": 1, "kind": "KIND_CPU",
                                         "gpus": []}]
    assert "dynamic_batching" not in config  # config.pbtxt has none: not batched
    plain = client.get_model_config("mlp0")  # no config: the agent's defaults
    assert plain["max_batch_size"] == 32 and plain["input"][0]["dims"] == [4]
    assert plain["dynamic_batching"] == {"preferred_batch_size": [],
                                         "max_queue_delay_microseconds": 100_000}
    strings = client.get_model_config("simple_string")
    assert strings["input"][0]["data_type"] == "TYPE_STRING"
    status, _, body = agent.request("GET", "/v2/models/simple/versions/1/config")
    assert status == 200 and body == config
    status, _, body = agent.request("GET", "/v2/models/nope/config")
    assert status == 404 and "unknown model 'nope'" in body["error"]


def test_statistics_count_where_requests_are_served(agent):
    client = client_of(agent)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    for rows in (1, 1, 2):
        result = client.infer("simple", simple_inputs(a[:rows], b[:rows]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a[:rows] + b[:rows])
    s = stats_of(client, "simple")
    assert set(s) == STAT_FIELDS and set(s["inference_stats"]) == DURATIONS
    assert (s["name"], s["version"]) == ("simple", "1")
    assert s["inference_count"] == 4 and s["execution_count"] == 3
    inf = s["inference_stats"]
    assert inf["success"]["count"] == 3 and inf["success"]["ns"] > 0
    assert inf["fail"] == {"count": 0, "ns": 0}
    assert inf["queue"]["count"] == 3 and inf["compute_infer"]["count"] == 3
    assert inf["compute_infer"]["ns"] > 0
    assert inf["success"]["ns"] >= inf["compute_infer"]["ns"]
    assert {(x["batch_size"], x["compute_infer"]["count"]) for x in s["batch_stats"]} == {
        (1, 2), (2, 1)}
    assert abs(s["last_inference"] / 1000 - time.time()) < 60
    # a request that does not fit the model: a failure, nothing else moves
    bad = tc.InferInput("INPUT0", [1, 15], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 15), np.int32))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("simple", [bad, simple_inputs(a[:1], b[:1])[1]])
    after = stats_of(client, "simple")
    assert after["inference_stats"]["fail"]["count"] == 1
    assert after["inference_stats"]["success"]["count"] == 3
    assert after["inference_count"] == 4 and after["execution_count"] == 3
    # every model, and one version
    everything = client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in everything} == {
        "simple", "simple_string", "simple_identity", "mlp0", "mlp1", "mlp2", "mlp3"}
    assert stats_of(client, "simple", "1")["inference_count"] == 4
    status, _, body = agent.request("GET", "/v2/models/simple/versions/7/stats")
    assert status == 404 and "no version 7" in body["error"]


def test_concurrent_requests_are_counted_once_each(repo, start_agent):
    write_triton_examples(repo, extra=0)
    (repo / "simple" / "config.pbtxt").write_text(
        'max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n')
    agent = start_agent(repo)
    client = client_of(agent)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    errors = []

    def call():
        c = client_of(agent)
        for _ in range(5):
            try:
                out = c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, a + a)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = stats_of(client, "simple")
    assert s["inference_count"] == 30 and s["inference_stats"]["success"]["count"] == 30
    assert s["inference_stats"]["queue"]["count"] == 30
    assert sum(x["compute_infer"]["count"] for x in s["batch_stats"]) == s["execution_count"]
    assert sum(x["batch_size"] * x["compute_infer"]["count"] for x in s["batch_stats"]) == 30
    assert s["execution_count"] <= 30


def test_config_pbtxt_maps_onto_the_model_config(repo, start_agent):
    write_triton_examples(repo, extra=0)
    (repo / "simple" / "config.pbtxt").write_text("""
name: "simple"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
""")
    agent = start_agent(repo)
    config = client_of(agent).get_model_config("simple")
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert config["instance_group"][0]["count"] == 2
    assert config["input"][0]["dims"] == [-1]  # as declared
    status, _, cache = agent.request("GET", "/v1/cache/simple")
    assert cache["workers"] == 2 and cache["max_batch_size"] == 4 and cache["batching"]


REFUSED = [
    ('name: "simple"\nsequence_batching { }\n', "sequence_batching"),
    ('name: "simple"\nplatform: "ensemble"\n', "ensembles are not supported"),
    ('platform: "pytorch_libtorch"\n', "pytorch_libtorch"),
    ('platform: "tensorflow_savedmodel"\n', "does not match"),
    ('name: "other"\n', "directory name"),
    ('max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] }\n',
     "preferred_batch_size"),
    ('instance_group [ { count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_GPU gpus: [0] } ]\n',
     "only one instance group"),
    ('version_policy: { all { } }\n', "version_policy"),
    ('max_batch_size: 8\nmax_batch_size: 9\n', "line 2"),
    ('max_batch_size: "eight"\n', "max_batch_size"),
    ('no_such_field: 1\n', "no_such_field"),
]


@pytest.mark.parametrize("text, words", REFUSED)
def test_config_pbtxt_that_cannot_be_honoured_is_refused(repo, start_agent, text, words):
    write_triton_examples(repo, extra=1)
    (repo / "simple" / "config.pbtxt").write_text(text)
    agent = start_agent(repo)
    index = {m["name"]: m for m in client_of(agent).get_model_repository_index()}
    assert index["simple"]["state"] == "UNAVAILABLE"
    assert "simple/config.pbtxt" in index["simple"]["reason"]
    assert words in index["simple"]["reason"]
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load")
    assert 400 <= status < 500 and words in body["error"], body
    assert client_of(agent).is_model_ready("mlp0") or client_of(agent).load_model("mlp0") is None


def test_config_pbtxt_conflicting_with_config_yaml_is_refused(repo, start_agent):
    write_triton_examples(repo, extra=0)
    (repo / "simple" / "config.yaml").write_text("max_batch_size: 2\n")
    agent = start_agent(repo)
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load")
    assert status == 400
    assert "simple/config.pbtxt: max_batch_size: says 8 but config.yaml says 2" in body["error"]


@pytest.mark.parametrize("line, words", [
    ('{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }', "data_type FP32"),
    ('{ name: "INPUTX" data_type: TYPE_INT32 dims: [ 16 ] }', "'INPUTX' is not one of"),
    ('{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 8 ] }', "shape [-1, 8]"),
])
def test_declared_tensors_are_checked_against_the_model(repo, start_agent, line, words):
    write_triton_examples(repo, extra=0)
    (repo / "simple" / "config.pbtxt").write_text(
        f'max_batch_size: 8\ninput [ {line}, '
        '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n')
    agent = start_agent(repo)
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load")
    assert status == 503 and "failed to load" in body["error"]
    assert "simple/config.pbtxt: input" in body["error"] and words in body["error"], body
    assert "/tmp" not in body["error"]  # never the host path


def test_load_with_config_override(agent):
    client = client_of(agent)
    client.load_model("simple")
    client.load_model("simple", config='{"max_batch_size": "16"}')  # Triton's example
    assert client.is_model_ready("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 16
    status, _, cache = agent.request("GET", "/v1/cache/simple")
    assert cache["max_batch_size"] == 16 and cache["loads"] == 2  # reloaded with it
    client.load_model("simple", config=json.dumps(
        {"dynamic_batching": {"max_queue_delay_microseconds": 500},
         "instance_group": [{"count": 3, "kind": "KIND_CPU"}]}))
    config = client.get_model_config("simple")
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert config["instance_group"][0]["count"] == 3
    assert config["max_batch_size"] == 8  # an override replaces the last one
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    out = client.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT1")
    np.testing.assert_array_equal(out, a - a)
    client.get_model_repository_index()  # a rescan keeps the override
    assert client.get_model_config("simple")["instance_group"][0]["count"] == 3
    # our own /config output is a valid override
    client.load_model("simple", config=json.dumps(config))
    assert client.get_model_config("simple") == config
    client.load_model("simple")  # a plain load: back to the repository's config
    assert client.get_model_config("simple")["instance_group"][0]["count"] == 1


@pytest.mark.parametrize("override, words", [
    ('"parameters": {"config": {{"max_batch_size": "16"}}}', "malformed JSON"),  # Triton's example
    ('{"max_batch_size": "sixteen"}', "max_batch_size"),
    ('{"max_batch_size": [16]}', "max_batch_size"),
    ('[1, 2]', "must be a JSON object"),
    ('{"sequence_batching": {}}', "sequence_batching"),
    ('{"unknown_field": 1}', "unknown_field"),
    ('{"dynamic_batching": {"preferred_batch_size": [2]}}', "preferred_batch_size"),
    ('{"instance_group": [{"count": 0}]}', "count"),
    ('{"platform": "tensorrt_plan"}', "tensorrt_plan"),
    ('{"max_batch_size": 16, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", '
     '"dims": [16]}, {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}]}',
     "data_type FP32"),  # refused by the model at load: rolled back
])
def test_malformed_override_is_a_400_and_changes_nothing(agent, override, words):
    client = client_of(agent)
    client.load_model("simple", config='{"max_batch_size": 16}')
    before = client.get_model_config("simple")
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load",
                                    {"parameters": {"config": override}})
    assert status == 400, body
    assert "failed to load 'simple'" in body["error"] and words in body["error"], body
    assert client.is_model_ready("simple")
    assert client.get_model_config("simple") == before
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(
        client.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a + a)


def test_load_parameters_other_than_config_are_refused(agent):
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load",
                                    {"parameters": {"file:1/model.onnx": "AAAA"}})
    assert status == 400 and "file:1/model.onnx" in body["error"]
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load",
                                    {"parameters": {"config": {"max_batch_size": 4}}})
    assert status == 400 and "must be a JSON string" in body["error"]
    status, _, body = agent.request("POST", "/v2/repository/models/wrong_model_name/load")
    assert status == 404 and "failed to load" in body["error"]


@pytest.mark.parametrize("binary", [True, False])
def test_simple_string_serves_after_its_default_warmup_failed(agent, binary):
    client = client_of(agent)
    client.load_model("simple_string")  # zeros -> "" -> Cast fails: logged, still loads
    assert client.is_model_ready("simple_string")
    status, _, cache = agent.request("GET", "/v1/cache/simple_string")
    assert cache["state"] == "ready" and cache["first_run_seconds"] == 0
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    to_bytes = np.vectorize(lambda x: str(x).encode(), otypes=[object])
    result = client.infer("simple_string", simple_inputs(to_bytes(a), to_bytes(b), binary,
                                                         "BYTES"))
    sums = result.as_numpy("OUTPUT0").astype(np.bytes_).astype(np.int32)
    diffs = result.as_numpy("OUTPUT1").astype(np.bytes_).astype(np.int32)
    np.testing.assert_array_equal(sums, a + b)
    np.testing.assert_array_equal(diffs, a - b)
    status, _, cache = agent.request("GET", "/v1/cache/simple_string")
    assert cache["first_run_seconds"] > 0  # the first request was the cold run


def test_values_a_model_rejects_are_a_400_and_it_serves_on(agent):
    client = client_of(agent)
    words = np.array([[b"abc"] * 16], dtype=object)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("simple_string", simple_inputs(words, words, True, "BYTES"))
    assert caught.value.status() == "400"
    assert "rejected the input" in caught.value.message() and "Cast" in caught.value.message()
    assert stats_of(client, "simple_string")["inference_stats"]["fail"]["count"] == 1
    ones = np.array([[b"1"] * 16], dtype=object)
    out = client.infer("simple_string", simple_inputs(ones, ones, True, "BYTES"))
    assert out.as_numpy("OUTPUT0").tolist() == [[b"2"] * 16]


def test_explicit_warmup_sample(repo, start_agent):
    write_triton_examples(repo, extra=0)
    sample = {"inputs": [{"name": n, "datatype": "BYTES", "shape": [1, 16],
                          "data": [str(i) for i in range(16)]} for n in ("INPUT0", "INPUT1")]}
    (repo / "simple_string" / "warmup.json").write_text(json.dumps(sample))
    (repo / "simple_string" / "config.yaml").write_text("warmup: {file: warmup.json}\n")
    (repo / "simple" / "config.yaml").write_text(yaml.safe_dump({"warmup": {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}}))
    (repo / "simple_identity" / "config.yaml").write_text("warmup: {file: missing.json}\n")
    agent = start_agent(repo)
    client = client_of(agent)
    client.load_model("simple_string")
    status, _, cache = agent.request("GET", "/v1/cache/simple_string")
    assert cache["first_run_seconds"] > 0  # warmed by its sample
    status, _, body = agent.request("POST", "/v2/repository/models/simple/load")
    assert status == 503 and "simple/config.yaml: warmup.inputs: warm-up failed" in body["error"]
    assert "missing input 'INPUT1'" in body["error"]
    assert not client.is_model_ready("simple")
    status, _, body = agent.request("POST", "/v2/repository/models/simple_identity/load")
    assert status == 503 and "simple_identity/missing.json" in body["error"], body


def test_model_is_not_ready_until_warm(repo, start_agent):
    add_synthetic(repo, "slow", base_ms=1500, warmup="default")
    agent = start_agent(repo)
    client = client_of(agent)
    loader = threading.Thread(target=lambda: client_of(agent).load_model("slow"))
    started = time.monotonic()
    loader.start()
    seen = []  # (seconds since the load started, ready?)
    while loader.is_alive():
        seen.append((time.monotonic() - started, client.is_model_ready("slow")))
        time.sleep(0.1)
    loader.join()
    assert time.monotonic() - started >= 1.4
    ready = [r for _, r in seen]
    first = ready.index(True) if True in ready else len(ready)
    assert all(ready[first:])  # never ready, then ready for good
    assert first and seen[first - 1][0] >= 1.0  # not ready while it warmed up
    assert client.is_model_ready("slow")
    status, _, cache = agent.request("GET", "/v1/cache/slow")
    assert cache["first_run_seconds"] >= 1.4  # in the load penalty
    status, _, body = agent.request("GET", "/v2/models/slow/ready")
    assert status == 200 and body["ready"]


def test_tf_serving_metadata(agent):
    status, _, body = agent.request("GET", "/v1/models/mlp0/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "mlp0", "signature_name": "", "version": "1"}
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["X"]["dtype"] == "DT_FLOAT"
    assert sig["inputs"]["X"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""},
                                                         {"size": "4", "name": ""}]
    assert set(sig["outputs"]) == {"Y"}
    status, _, body = agent.request("GET", "/v1/models/simple_string/versions/1/metadata")
    assert status == 200
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["INPUT0"]["dtype"] == "DT_STRING"
    status, _, body = agent.request("GET", "/v1/models/nope/metadata")
    assert status == 404
