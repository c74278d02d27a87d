"""No host path in what a client that is not the operator reads (issue 39, item 6; issue
38): every file the agent knows sits under a folder whose name is a sentinel, and every
error path the test can reach (a bad config.yaml, bad ONNX, a missing file:// source, a
pull that fails its digest, loads that fail: a missing warm-up sample, a TF Serving
server that cannot start, a bad config.pbtxt) is driven over HTTP (KServe v2, TF
Serving REST, Triton's extensions, the cache admin) and gRPC with read and infer
tokens. The sentinel never appears; the answers still name the model's own files
relative to the repository."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.security.authconfig import AgentAuthSettings
from agent.config import TfServingSettings
from agent.security.credentials import new_token, token_hash
from agent.modelzoo import write_mlp
from agent.node.grpc_v2 import start_grpc
from tests.helpers import TINY_MLP, add_mlp, add_synthetic

SENTINEL = "HOSTPATH-SENTINEL-5e1f"
ADMIN, READ, INFER = new_token(), new_token(), new_token()
ROW = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
#: model -> words its answers give (relative to the repository, or the model's source)
BROKEN = {
    "badconfig": "badconfig/config.yaml: bogus: unknown key",
    "badvalue": "badvalue/config.yaml: max_batch_size: must be an integer >= 0",
    "badonnx": "badonnx/1/model.onnx: not an ONNX model",
    "noversion": "noversion: no numeric version directory",
    "nofile": "nofile: version(s) 1 lack model.onnx",
    "gone": "file://.../gone",
    "wrongdigest": "digest",
    "nowarmup": "nowarmup/sample.json: cannot read the warm-up sample",
    "badpbtxt": "badpbtxt/config.pbtxt",
    "tfmodel": "cannot start TF Serving '.../tfs'",
}


def _layout(base: Path) -> tuple[Path, Path]:
    """The repository and a file:// source folder under ``base``, one broken model per
    way of breaking."""
    repo, src = base / "repo", base / "sources"
    add_synthetic(repo, "fine")
    add_synthetic(repo, "badconfig")
    (repo / "badconfig" / "config.yaml").write_text("backend: synthetic\nbogus: 1\n")
    add_mlp(repo, "badvalue", config={"max_batch_size": -3})
    (repo / "badonnx" / "1").mkdir(parents=True)
    (repo / "badonnx" / "1" / "model.onnx").write_bytes(b"junk, not a protobuf")
    (repo / "noversion").mkdir()
    (repo / "noversion" / "config.yaml").write_text("backend: onnx\n")
    (repo / "nofile" / "1").mkdir(parents=True)
    (repo / "nofile" / "config.yaml").write_text("backend: onnx\n")
    for name, config in (("gone", {"source": f"file://{src / 'gone'}"}),
                         ("wrongdigest", {"source": f"file://{src / 'wrongdigest'}",
                                          "digest": "sha256:" + "0" * 64})):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    write_mlp(src / "wrongdigest" / "1" / "model.onnx", **TINY_MLP)
    add_mlp(repo, "nowarmup", config={"warmup": {"file": "sample.json"}})
    add_mlp(repo, "badpbtxt")
    (repo / "badpbtxt" / "config.pbtxt").write_text("max_batch_size: lots {\n")
    (repo / "tfmodel" / "1").mkdir(parents=True)
    (repo / "tfmodel" / "1" / "saved_model.pb").write_bytes(b"\x08\x01")
    return repo, src


@pytest.fixture
def agent(start_agent, tmp_path):
    base = tmp_path / SENTINEL
    repo, _ = _layout(base)
    tokens = base / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([
        {"name": n, "sha256": token_hash(t), "scopes": [s]}
        for n, t, s in (("ops", ADMIN, "admin"), ("dash", READ, "read"),
                        ("app", INFER, "infer"))]))
    server = start_agent(repo, load_retry_s=0,
                         tfserving=TfServingSettings(binary=str(base / "bin" / "tfs"),
                                                     start_timeout_seconds=5),
                         auth=AgentAuthSettings(token_file=tokens, protect=("read", "infer")))
    grpc_server = server.call(start_grpc(server.node, "127.0.0.1", 0))
    server.grpc_url = f"127.0.0.1:{grpc_server.port}"
    yield server
    server.call(grpc_server.stop(0))


def _http(agent, method: str, path: str, token: str | None, body=None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST"
                                                               else None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(agent.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _grpc_answers(agent, name: str) -> list[str]:
    """The status details (or answers) of gRPC's model calls for ``name``."""
    said = []
    with grpc.insecure_channel(agent.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        meta = (("authorization", f"Bearer {INFER}"),)
        infer = service_pb2.ModelInferRequest(model_name=name)
        tensor = infer.inputs.add(name="X", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1, 2, 3, 4])
        for call, request in ((stub.ModelInfer, infer),
                              (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=name)),
                              (stub.ModelReady, service_pb2.ModelReadyRequest(name=name)),
                              (stub.ModelConfig, service_pb2.ModelConfigRequest(name=name))):
            try:
                said.append(str(call(request, metadata=meta, timeout=60)))
            except grpc.RpcError as err:
                said.append(f"{err.code().name}: {err.details()}")
    return said


def test_no_answer_to_a_client_names_a_host_path(agent):
    answers: list[tuple[str, int, str]] = []

    def http(method, path, token, body=None):
        status, text = _http(agent, method, path, token, body)
        answers.append((f"{method} {path}", status, text))
        return status, text

    for name in BROKEN:
        for attempt in range(2):  # a first try and the answer while its failure is kept
            http("POST", f"/v2/models/{name}/infer", INFER, ROW)
        http("GET", f"/v2/models/{name}", INFER)
        http("GET", f"/v2/models/{name}/ready", INFER)
        http("POST", f"/v1/models/{name}:predict", INFER, {"instances": [[1, 2, 3, 4]]})
        http("GET", f"/v1/models/{name}", INFER)
        http("GET", f"/v2/models/{name}/config", READ)
        http("GET", f"/v2/models/{name}/stats", READ)
        http("GET", f"/v1/cache/{name}", READ)
        answers += [(f"gRPC {name}", 0, text) for text in _grpc_answers(agent, name)]
    http("GET", "/v1/cache", READ)
    http("GET", "/v1/disk", READ)
    http("GET", "/metrics", READ)
    http("POST", "/v2/models/fine/infer", None, ROW)  # no token: 401
    # the operator's own calls say no more of the box either
    http("POST", "/v2/repository/index", ADMIN)
    for name in BROKEN:
        http("POST", f"/v2/repository/models/{name}/load", ADMIN)

    leaks = [(what, status, text[:300]) for what, status, text in answers
             if SENTINEL in text or "/tmp/" in text]
    assert not leaks, leaks
    errors = [(what, text) for what, status, text in answers if status >= 400]
    assert len(errors) > 5 * len(BROKEN), errors
    said = " ".join(text for _, _, text in answers)
    for name, words in BROKEN.items():  # each failure still says what is wrong, and where
        assert words in said, (name, words)
    assert http("POST", "/v2/models/fine/infer", INFER, ROW)[0] == 200
