"""Routing between real agents on loopback (issue 34), each in this process with its
HTTP and gRPC listeners: a request lands on one node and is served by the node its
routing table names, over KServe v2 REST, TF Serving REST and gRPC, one hop at most;
the bad cases each served and never turned into a 5xx by a peer.

The routing tables are handed to each node as a coordinator's answer gives them
(``Router.take``): two stale tables that point at each other, or one naming a node that
is gone, cannot be made by one coordinator on purpose. tests/test_routing_fleet.py runs
the whole fleet with its coordinator, as processes."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from click.testing import CliRunner

from agent.security.authconfig import AgentAuthSettings
from agent.cli import main
from agent.config import AgentConfig, CoordinatorLink, RoutingSettings
from agent.security.credentials import token_hash
from agent.node.grpc_v2 import start_grpc
from agent.node.protos import grpc_predict_v2_pb2 as pb
from agent.node.protos import grpc_predict_v2_pb2_grpc as pb_grpc
from agent.wire import Directives, PeerAddress, RoutingTable
from tests.helpers import (BODY, AgentServer, add_app, add_classifier, add_mlp, add_synthetic,
                           reserved_port, v2_body)

PEER_TOKEN = "p" * 40
INFER_TOKEN = "i" * 40
READ_TOKEN = "r" * 40
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


class Node:
    """A real agent named ``name`` (HTTP and gRPC on loopback) that routes."""

    def __init__(self, tmp: Path, name: str, repo: Path, *, budget: int = 200_000_000,
                 routing: dict | None = None, tokens: Path | None = None, **config):
        link = CoordinatorLink(url="http://127.0.0.1:9", node_name=name,
                               report_interval_s=3600)  # no coordinator: tables are given
        cfg = AgentConfig(repository=repo, data_dir=tmp / name, cpu_budget=budget,
                          infer_threads=2, coordinator=link,
                          routing=RoutingSettings(**{
                              k: Path(v) if k.endswith("_file") else v
                              for k, v in (routing or {}).items()}),
                          auth=AgentAuthSettings(token_file=tokens), **config)
        self.name = name
        self.agent = AgentServer(cfg, budgets={"cpu": budget})
        self.grpc = self.agent.call(start_grpc(self.agent.node, "127.0.0.1", 0))
        self.router = self.agent.node.router
        self.router.listening(self.agent.url, self.grpc.address)

    def request(self, *args, **kwargs):
        return self.agent.request(*args, **kwargs)

    def infer(self, model, body=None, headers=None):
        return self.request("POST", f"/v2/models/{model}/infer", body or BODY, headers)

    def cache(self, model, headers=None):
        return self.request("GET", f"/v1/cache/{model}", headers=headers)[2]

    def grpc_served_by(self, model, width):
        """The node that served a gRPC ModelInfer of ``width`` ones sent here."""
        stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.grpc.address))
        _, call = stub.ModelInfer.with_call(pb.ModelInferRequest(
            model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
                name="X", datatype="FP32", shape=[1, width])],
            raw_input_contents=[np.ones(width, np.float32).tobytes()]), timeout=10)
        return dict(call.trailing_metadata())["edgeagent-served-by"]

    def close(self):
        self.agent.call(self.grpc.stop(0))
        self.agent.close()


def give_table(nodes, models, *, to=None, version=1, max_age_s=60.0, extra=None):
    """Every node in ``to`` (default all) takes the table ``models`` over ``nodes``
    (+ ``extra``: name -> PeerAddress of nodes that are not these)."""
    addresses = {n.name: n.router.address for n in nodes}
    addresses.update(extra or {})
    table = RoutingTable(version=version, max_age_s=max_age_s, nodes=addresses,
                         models=models)
    answer = Directives(ttl_s=60, routing_version=version, routing=table)

    async def take(router):
        router.take(answer)

    for node in to or nodes:
        node.agent.call(take(node.router))


@pytest.fixture
def fleet(tmp_path):
    """fleet(name, repo, **config) -> Node; all closed after the test."""
    started = []

    def start(name, repo, **config):
        started.append(Node(tmp_path, name, repo, **config))
        return started[-1]

    yield start
    for node in started:
        node.close()


def same_repo(tmp_path, **models):
    repo = tmp_path / "models"
    for name, options in models.items():
        add_synthetic(repo, name, **options)
    return repo


def test_a_request_is_served_by_the_node_its_table_names(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 1}, here={"base_ms": 1})
    add_mlp(repo, "mlp")
    a, b = fleet("edge-a", repo), fleet("edge-b", repo)
    give_table([a, b], {"m": {"edge-b": 1}, "mlp": {"edge-b": 1}})

    status, headers, doc = a.infer("m", {**BODY, "id": "r-7"})
    assert status == 200 and headers["edgeagent-served-by"] == "edge-b"
    assert doc["id"] == "r-7"  # the client's request id travelled with it
    status, headers, _ = a.infer("here")  # no planned node: served where it landed
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a"
    assert b.cache("m")["requests_served"] == 1 and a.cache("m")["requests_served"] == 0
    assert a.cache("m")["state"] == "unloaded"  # nothing loaded where it landed

    # TF Serving REST, and the binary extension of v2, through the same hop
    status, headers, doc = a.request("POST", "/v1/models/mlp:predict",
                                     {"instances": [[1.0, 2.0, 3.0, 4.0]]})
    assert status == 200 and headers["edgeagent-served-by"] == "edge-b"
    assert np.asarray(doc["predictions"]).shape == (1, 2)
    # KServe v2 gRPC: the answer is the peer's, named in the trailing metadata
    stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(a.grpc.address))
    request = pb.ModelInferRequest(model_name="mlp", id="g-1", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1, 4])],
        raw_input_contents=[np.arange(4, dtype=np.float32).tobytes()])
    answer, call = stub.ModelInfer.with_call(request, timeout=10)
    assert dict(call.trailing_metadata())["edgeagent-served-by"] == "edge-b"
    assert answer.id == "g-1" and answer.model_name == "mlp"
    local = grpcclient.InferenceServerClient(b.grpc.address)
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    expected = local.infer("mlp", [x]).as_numpy("Y")
    assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32),
                          expected.ravel())
    assert b.cache("mlp")["requests_served"] == 3 and a.cache("mlp")["requests_served"] == 0

    seen = a.request("GET", "/v1/routing")[2]
    assert seen["trusted"] and seen["models"]["m"]["planned"] == {"edge-b": 1}
    assert seen["models"]["m"]["peers"]["edge-b"]["forwarded"] == 1
    assert b.request("GET", "/v1/routing")[2]["models"]["mlp"]["received_from"] == \
        {"edge-a": 2}  # the third: the direct call
    metrics = a.request("GET", "/metrics")[2].decode()
    assert 'edgeagent_routing_forwarded_total{code="200",model="m",peer="edge-b"} 1.0' \
        in metrics
    shown = CliRunner().invoke(main, ["cache", "--url", a.agent.url, "ls", "--wide"])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("m "))
    assert row.split()[-2:] == ["edge-b:1", "1/0/0/0"], row
    assert "routing: m -> edge-b: 1 forwarded, 0 errors, hop p50" in shown.output


def test_a_forwarded_request_is_not_decoded_where_it_landed(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    # decoded at a, this 4 x 4-byte input would be over a's max_tensor_bytes (413)
    a = fleet("edge-a", repo, max_tensor_bytes=8)
    b = fleet("edge-b", repo)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                        "data": [1.0, 2.0, 3.0, 4.0]}]}
    assert a.infer("m", body)[0] == 413  # a's own model, served at a: decoded there
    give_table([a, b], {"m": {"edge-b": 1}})
    status, headers, doc = a.infer("m", body)
    assert status == 200 and headers["edgeagent-served-by"] == "edge-b", doc
    assert a.grpc_served_by("m", 4) == "edge-b"
    # the body's own fault is the peer's answer, passed on as it came and named
    status, headers, doc = a.request("POST", "/v2/models/m/infer", b'{"inputs": 7}',
                                     {"Content-Type": "application/json"})
    assert status == 400 and headers["edgeagent-served-by"] == "edge-b"
    assert "inputs" in doc["error"]
    assert a.cache("m")["requests_served"] == 0 and b.cache("m")["requests_served"] == 2
    routed = a.request("GET", "/v1/routing")[2]["models"]["m"]["peers"]["edge-b"]
    assert routed["answers"] == {"200": 2, "400": 1}


def test_requests_split_by_the_plans_replicas(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    a, b, c = fleet("edge-a", repo), fleet("edge-b", repo), fleet("edge-c", repo)
    give_table([a, b, c], {"m": {"edge-a": 1, "edge-b": 3}})
    served = {"edge-a": 0, "edge-b": 0}
    for i in range(80):
        node = (a, c)[i % 2]  # this node's share is served without a hop
        status, headers, _ = node.infer("m")
        assert status == 200
        served[headers["edgeagent-served-by"]] += 1
    assert served == {"edge-a": 20, "edge-b": 60}
    assert c.cache("m")["requests_served"] == 0


def test_a_forged_mark_is_refused(tmp_path, fleet):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([
        {"name": "fleet", "sha256": token_hash(PEER_TOKEN), "scopes": ["peer"]},
        {"name": "client", "sha256": token_hash(INFER_TOKEN), "scopes": ["infer"]},
        {"name": "reader", "sha256": token_hash(READ_TOKEN), "scopes": ["read"]}]))
    peer_token = tmp_path / "peer-token"
    peer_token.write_text(PEER_TOKEN)
    repo = same_repo(tmp_path, m={"base_ms": 0})
    secure = {"tokens": tokens, "routing": {"token_file": peer_token}}
    a, b = fleet("edge-a", repo, **secure), fleet("edge-b", repo, **secure)
    give_table([a, b], {"m": {"edge-a": 1}})

    client = {"Authorization": f"Bearer {INFER_TOKEN}"}
    # the client's own token at b: forwarded to a with b's peer token, not the client's
    status, headers, _ = b.infer("m", headers=client)
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a"
    # a stranger's mark with a client's token: refused, nothing served
    status, _, doc = b.infer("m", headers={**client, "edgeagent-forwarded-by": "edge-b"})
    assert status == 403 and "edgeagent-forwarded-by" in doc["error"]
    # with no token at all: inference is protected once tokens exist (auth.protect)
    status, _, doc = b.infer("m", headers={"edgeagent-forwarded-by": "edge-b"})
    assert status == 401
    stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(b.grpc.address))
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(pb.ModelInferRequest(model_name="m"), timeout=10,
                        metadata=[("edgeagent-forwarded-by", "edge-a"),
                                  ("authorization", f"Bearer {INFER_TOKEN}")])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert b.cache("m", READ)["requests_served"] == 0
    assert b.request("GET", "/v1/routing", headers={
        "Authorization": f"Bearer {PEER_TOKEN}"})[0] == 403  # peer is not read
    # a fleet node's mark (its peer token) is taken: served where it lands
    status, headers, _ = b.infer("m", headers={"Authorization": f"Bearer {PEER_TOKEN}",
                                               "edgeagent-forwarded-by": "edge-a"})
    assert status == 200 and headers["edgeagent-served-by"] == "edge-b"
    assert a.cache("m", READ)["requests_served"] == 1
    assert b.cache("m", READ)["requests_served"] == 1
    assert b.request("GET", "/v1/routing", headers=READ)[2]["marks_refused"] == 2  # the tokenless one: 401 first


def test_stale_tables_pointing_at_each_other_serve_once(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    a, b = fleet("edge-a", repo), fleet("edge-b", repo)
    give_table([a, b], {"m": {"edge-b": 1}}, to=[a], version=1)
    give_table([a, b], {"m": {"edge-a": 1}}, to=[b], version=2)
    for node, other in ((a, "edge-b"), (b, "edge-a")):
        status, headers, _ = node.infer("m")
        assert status == 200 and headers["edgeagent-served-by"] == other
    assert a.cache("m")["requests_served"] == 1 and b.cache("m")["requests_served"] == 1
    for node in (a, b):
        routed = node.request("GET", "/v1/routing")[2]["models"]["m"]
        assert routed["forwarded"] == 1 and routed["received"] == 1


def test_a_slow_peer_keeps_the_clients_deadline(tmp_path, fleet):
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    add_synthetic(fast, "m", base_ms=1, slo={"latency_ms": 100})
    add_synthetic(slow, "m", base_ms=3000, slo={"latency_ms": 100})
    a = fleet("edge-a", fast, routing={"peer_timeout_ms": 400})
    b = fleet("edge-b", slow)
    give_table([a, b], {"m": {"edge-b": 1}})
    # the client's timeout (300 ms): answered by then, as it would be here
    started = time.monotonic()
    status, _, doc = a.infer("m", {**BODY, "parameters": {"timeout": 300_000}})
    took = time.monotonic() - started
    assert status == 503 and "timeout" in doc["error"] and took < 1.5, (took, doc)
    # none: the SLO (100 ms) plus peer_timeout_ms (400 ms), then served here
    started = time.monotonic()
    status, headers, _ = a.infer("m")
    took = time.monotonic() - started
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a" and took < 2.0
    routed = a.request("GET", "/v1/routing")[2]
    assert routed["models"]["m"]["fallback_reasons"] == {"peer_failed": 1}
    assert not routed["peers"]["edge-b"]["up"]  # skipped for a while
    status, headers, _ = a.infer("m")  # skipped: straight here
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a"


def test_a_peer_answering_503_or_507_leaves_the_request_here(tmp_path, fleet):
    good, broken, large = tmp_path / "good", tmp_path / "broken", tmp_path / "large"
    add_mlp(good, "mlp")
    (broken / "mlp" / "1").mkdir(parents=True)
    (broken / "mlp" / "1" / "model.onnx").write_bytes(b"not an onnx model")  # load: 503
    add_synthetic(good, "big", size_bytes=50_000_000)
    add_synthetic(large, "big", size_bytes=50_000_000)  # over its node's budget: 507
    a = fleet("edge-a", good)
    b = fleet("edge-b", broken)
    c = fleet("edge-c", large, budget=20_000_000)
    give_table([a, b, c], {"mlp": {"edge-b": 1}, "big": {"edge-c": 1}})
    assert b.infer("mlp", v2_body([1.0, 2.0, 3.0, 4.0]))[0] == 503
    assert c.infer("big")[0] == 507
    for model, body in (("mlp", v2_body([1.0, 2.0, 3.0, 4.0])), ("big", BODY)):
        status, headers, doc = a.infer(model, body)
        assert status == 200 and headers["edgeagent-served-by"] == "edge-a", doc
    routed = a.request("GET", "/v1/routing")[2]
    assert routed["models"]["mlp"]["fallback_reasons"] == {"peer_busy": 1}
    assert routed["models"]["big"]["peers"]["edge-c"]["answers"] == {"507": 1}
    assert routed["peers"]["edge-b"]["up"] and routed["peers"]["edge-c"]["up"]


def test_a_table_naming_a_node_that_is_gone(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    a = fleet("edge-a", repo)
    with reserved_port() as port:  # nothing listens there
        ghost = PeerAddress(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}")
        give_table([a], {"m": {"ghost": 2}}, extra={"ghost": ghost})
        for _ in range(3):
            status, headers, _ = a.infer("m")
            assert status == 200 and headers["edgeagent-served-by"] == "edge-a"
        assert a.grpc_served_by("m", 2) == "edge-a"
    routed = a.request("GET", "/v1/routing")[2]
    # tried once, then skipped with backoff
    assert routed["models"]["m"]["fallback_reasons"] == {"peer_failed": 1, "peers_down": 3}
    assert routed["peers"]["ghost"]["failures"] == 1 and not routed["peers"]["ghost"]["up"]


def test_a_stale_table_is_not_trusted(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    a, b = fleet("edge-a", repo), fleet("edge-b", repo)
    give_table([a, b], {"m": {"edge-b": 1}}, max_age_s=0.3)
    assert a.infer("m")[1]["edgeagent-served-by"] == "edge-b"
    time.sleep(0.5)
    status, headers, _ = a.infer("m")
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a"
    routed = a.request("GET", "/v1/routing")[2]
    assert not routed["trusted"]
    assert routed["models"]["m"]["fallback_reasons"] == {"stale_table": 1}


def test_a_selection_apps_member_planned_elsewhere_is_called_there(tmp_path, fleet):
    repo = tmp_path / "models"
    for i in range(3):
        add_classifier(repo, f"c{i}", classes=10, seed=7, error=0.1 * i)
    # cold loads on both nodes within the app's deadline, even on a loaded box (the
    # default 200 ms SLO missed all three once under the full suite)
    add_app(repo, "vote", ["c0", "c1", "c2"], slo_ms=5000)
    a, b = fleet("edge-a", repo), fleet("edge-b", repo)
    give_table([a, b], {"c1": {"edge-b": 1}, "c2": {"edge-b": 1}})
    x = np.stack([np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) % 10,
                  np.zeros(4, np.float32)], 1)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [4, 3],
                        "data": x.ravel().tolist()}]}
    status, _, doc = a.infer("vote", body)
    assert status == 200, doc
    # every member answered: c0 here, c1 and c2 on edge-b (never loaded here)
    assert doc["parameters"]["models_used"] == "c0:1,c1:1,c2:1", doc["parameters"]
    assert doc["parameters"]["missing"] == ""
    assert [a.cache(f"c{i}")["state"] for i in range(3)] == ["ready", "unloaded", "unloaded"]
    assert b.cache("c1")["requests_served"] == 1 and b.cache("c2")["requests_served"] == 1
    routed = b.request("GET", "/v1/routing")[2]["models"]
    assert routed["c1"]["received_from"] == {"edge-a": 1}


def _report(node):
    from agent.node.reporter import REPORTER

    async def build():
        return node.agent.app[REPORTER].build_report()
    return node.agent.call(build())


def test_reports_count_a_request_where_it_reached_the_fleet(tmp_path, fleet):
    repo = same_repo(tmp_path, m={"base_ms": 0})
    a, b = fleet("edge-a", repo), fleet("edge-b", repo)
    _report(a), _report(b)  # the counters' baseline
    give_table([a, b], {"m": {"edge-b": 1}})
    for _ in range(3):
        assert a.infer("m")[1]["edgeagent-served-by"] == "edge-b"
    for _ in range(2):
        assert b.infer("m")[0] == 200
    ra, rb = _report(a), _report(b)
    # the fleet's arrivals are the sum over nodes: 3 landed on a, 2 on b
    assert sum(c for _, _, c in ra["models"]["m"]["arrivals"]) == 3
    assert sum(c for _, _, c in rb["models"]["m"]["arrivals"]) == 2
    assert ra["routing"]["models"]["m"] == {"served": 0, "forwarded": 3, "received": 0,
                                            "fallbacks": 0, "errors": 0}
    assert rb["routing"]["models"]["m"] == {"served": 5, "forwarded": 0, "received": 3,
                                            "fallbacks": 0, "errors": 0}
    assert ra["peer"] == {"url": a.agent.url, "grpc": a.grpc.address}
    assert ra["routing"]["version"] == 1
    assert "batches" not in ra["models"]["m"]  # a forwarded answer is not processing


def test_pins_leave_room_for_any_model(tmp_path, fleet):
    repo = tmp_path / "models"
    for name, size in (("a", 30), ("b", 30), ("c", 30), ("d", 35)):
        add_synthetic(repo, name, size_bytes=size * 1_000_000)
    node = fleet("edge-a", repo, budget=100_000_000)
    from agent.node.reporter import REPORTER

    async def apply():
        reporter = node.agent.app[REPORTER]
        reporter.apply(Directives(ttl_s=60, pin=("a", "b", "c"),
                                  workers={"a": 1, "b": 1, "c": 1}))
        return sorted(reporter.pinned_by_us)
    # a, b and c take 90 of 100 MB: pinned all, d (35 MB) could never load (507);
    # two leave room for the largest model this node serves
    assert node.agent.call(apply()) == ["a", "b"]
    for name in ("a", "b", "c"):  # all three prefetched all the same
        node.agent.call(_ready(node, name))
    status, headers, doc = node.infer("d")
    assert status == 200 and headers["edgeagent-served-by"] == "edge-a", doc
    assert node.cache("c")["state"] == "unloaded"  # the unpinned one made room

    async def renew(pin=("a", "b", "c"), prefetch=()):
        node.agent.app[REPORTER].apply(Directives(
            ttl_s=60, pin=pin, prefetch=prefetch, workers=dict.fromkeys(pin, 1)))
    # the same plan renewed, its prefetch list too (the coordinator lists there what the
    # node's last report did not hold): c, loaded once for this plan, is kept by use
    # (d stays); the two pinned ones stay in memory whatever happens
    for prefetch in ((), ("c",), ("c",)):
        node.agent.call(renew(prefetch=prefetch))
    assert node.cache("c")["state"] == "unloaded" and node.cache("d")["state"] == "ready"
    assert node.cache("c")["loads"] == 1
    node.agent.call(renew(pin=("a", "c")))  # a new plan: c is loaded once again
    node.agent.call(_ready(node, "c"))
    assert node.cache("c")["loads"] == 2


async def _ready(node, name):
    import asyncio

    for _ in range(200):
        if node.agent.node.cache.entry(name).state.value == "ready":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} not prefetched")


def test_nodes_forward_over_mutual_tls_with_their_own_certificates(tmp_path, fleet):
    import json as _json
    import ssl
    import urllib.error
    import urllib.request

    from agent.security.tls import TlsSettings
    from tests.helpers import issue_cert, make_ca

    certs = tmp_path / "certs"
    certs.mkdir()
    ca = make_ca(certs)
    repo = same_repo(tmp_path, m={"base_ms": 0})
    nodes = []
    for name in ("edge-a", "edge-b"):
        mine = issue_cert(ca, certs, name, hosts=(name, "127.0.0.1"))
        nodes.append(fleet(name, repo, tls=TlsSettings(
            cert_file=mine.cert_file, key_file=mine.key_file, client_ca_file=ca.cert_file,
            client_auth="request"), routing={"ca_file": ca.cert_file,
                                             "cert_file": mine.cert_file,
                                             "key_file": mine.key_file}))
    a, b = nodes
    assert a.router.address.url.startswith("https://")
    give_table([a, b], {"m": {"edge-b": 1}})
    client = ssl.create_default_context(cafile=str(ca.cert_file))  # no certificate

    def post(node, headers=None):
        req = urllib.request.Request(f"{node.agent.url}/v2/models/m/infer",
                                     _json.dumps(BODY).encode(), headers=headers or {},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30, context=client) as r:
                return r.status, dict(r.headers)
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers)

    status, headers = post(a)  # a forwards with its certificate: b takes its mark
    assert status == 200 and headers["edgeagent-served-by"] == "edge-b"
    assert post(b, {"edgeagent-forwarded-by": "edge-a"})[0] == 403  # no certificate
    seen = b.agent.node.router.describe()
    assert seen["models"]["m"]["received_from"] == {"edge-a": 1}
    assert seen["marks_refused"] == 1
