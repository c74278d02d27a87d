"""OpenTelemetry traces of inference requests (issue 38): real agents on loopback with
real ONNX models, the OpenTelemetry SDK's in-memory exporter in the place of the OTLP
one (``Node(span_exporter=...)``), requests over HTTP and gRPC that carry a client's
W3C ``traceparent``; a cold request's trace takes its latency apart (its download from a
``file://`` source, its load and first run); a batch links the requests it served; the
trace context goes on to a peer a request is forwarded to and to a selection app's
members. The agent as a process sends its spans to a real OTLP collector (gRPC and
HTTP) written here over the collector's own protobufs (opentelemetry-proto). Tracing
off allocates nothing per request, and a config that asks for tracing without the SDK
says how to install it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agent import tracing
from agent.config import AgentConfig, CoordinatorLink, RoutingSettings, TracingSettings
from agent.modelzoo import write_mlp
from agent.node.grpc_v2 import start_grpc
from agent.wire import Directives, RoutingTable
from tests.helpers import (EDGEAGENT, TINY_MLP, AgentServer, add_app, add_classifier,
                           add_mlp, v2_body, wait_for, without_packages)

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
#: A client's span, sampled (the flags 01).
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ROW = v2_body([1.0, 2.0, 3.0, 4.0])
BUDGET = 1_000_000_000


class Traced:
    """A real agent (HTTP and gRPC on loopback) whose spans go to ``spans``."""

    def __init__(self, tmp: Path, repo: Path, name: str = "edge", *, tracing=None,
                 **config) -> None:
        self.spans = InMemorySpanExporter()
        cfg = AgentConfig(repository=repo, data_dir=tmp / name, cpu_budget=BUDGET,
                          infer_threads=2, tracing=TracingSettings(**(tracing or {})),
                          **config)
        self.agent = AgentServer(cfg, budgets={"cpu": BUDGET}, span_exporter=self.spans)
        self.grpc = self.agent.call(start_grpc(self.agent.node, "127.0.0.1", 0))
        self.name = name

    def infer(self, model: str, protocol: str = "http", traceparent: str | None = None,
              body: dict = ROW):
        """(status, served by) of one request over ``protocol``."""
        headers = {"traceparent": traceparent} if traceparent else {}
        if protocol == "grpc":
            client = grpcclient.InferenceServerClient(self.grpc.address)
            data = body["inputs"][0]
            x = grpcclient.InferInput("X", data["shape"], "FP32")
            x.set_data_from_numpy(np.asarray(data["data"], np.float32).reshape(data["shape"]))
            client.infer(model, [x], headers=headers)
            return 200, None
        status, answer, doc = self.agent.request(
            "POST", f"/v2/models/{model}/infer", body,
            {"Content-Type": "application/json", **headers})
        assert status == 200, doc
        return status, answer.get("edgeagent-served-by")

    def finished(self) -> list:
        return list(self.spans.get_finished_spans())

    def close(self) -> None:
        self.agent.call(self.grpc.stop(0))
        self.agent.close()


@pytest.fixture
def traced(tmp_path):
    """traced(repo, name=..., tracing={...}, **config) -> Traced; closed after the test."""
    started: list[Traced] = []

    def start(repo, name="edge", **config):
        started.append(Traced(tmp_path, repo, name, **config))
        return started[-1]

    yield start
    for agent in started:
        agent.close()


def sourced(tmp: Path, repo: Path, name: str, hidden: int) -> Path:
    """A real ONNX MLP published in a ``file://`` source, and the repository's
    config.yaml naming it (the agent pulls it into its disk tier on first use)."""
    model = write_mlp(tmp / "source" / name / "1" / "model.onnx",
                      **{**TINY_MLP, "hidden": hidden, "layers": 2})
    (repo / name).mkdir(parents=True)
    (repo / name / "config.yaml").write_text(
        yaml.safe_dump({"source": f"file://{tmp / 'source' / name}"}))
    return model


def seconds(span) -> float:
    return (span.end_time - span.start_time) / 1e9


def children(spans, parent) -> list:
    """``parent``'s child spans, in the order they began."""
    return sorted((s for s in spans if s.parent is not None
                   and s.parent.span_id == parent.context.span_id),
                  key=lambda s: s.start_time)


def named(spans, name) -> list:
    return [s for s in spans if s.name == name]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_cold_requests_trace_takes_its_latency_apart(tmp_path, traced, protocol):
    """The issue's bar: the cold request's download, load and first run, as spans, add
    up to within 5 % of its latency; its phases are children of its request span, the
    child of the client's span."""
    repo = tmp_path / "models"
    model = sourced(tmp_path, repo, "big", hidden=2048)  # 16 MiB of weights
    # a slow link (50 MB/s): the pull is a real part of the cold start, as on a box
    agent = traced(repo, pull_bandwidth=50_000_000)
    agent.infer("big", protocol, TRACEPARENT)

    spans = agent.finished()
    (request,) = named(spans, "edgeagent.infer")
    assert request.kind is SpanKind.SERVER
    assert request.context.trace_id == int(CLIENT_TRACE, 16)
    assert request.parent.span_id == int(CLIENT_SPAN, 16) and request.parent.is_remote
    assert request.attributes["edgeagent.model"] == "big"
    assert request.attributes["http.response.status_code"] == 200
    assert request.resource.attributes["service.name"] == "edgeagent"
    phases = children(spans, request)
    assert [s.name for s in phases] == ["edgeagent.cold_start", "edgeagent.admission",
                                        "edgeagent.queue", "edgeagent.batch"]
    steps = children(spans, phases[0])
    assert [s.name for s in steps] == ["edgeagent.download", "edgeagent.load",
                                       "edgeagent.first_run"]
    for before, after in zip(steps, steps[1:]):  # one after the other, no overlap
        assert before.end_time <= after.start_time
    latency = seconds(request)
    cold = sum(seconds(s) for s in steps)
    assert abs(cold - latency) <= 0.05 * latency, (cold, latency)
    # and the request's phases account for the whole of it
    assert abs(sum(seconds(s) for s in phases) - latency) <= 0.05 * latency
    assert steps[0].attributes["edgeagent.download.bytes"] == model.stat().st_size
    shown = agent.agent.request("GET", "/v1/cache/big")[2]
    assert abs(seconds(steps[2]) - shown["first_run_seconds"]) < 1e-4  # one measurement
    assert steps[1].attributes["edgeagent.load.bytes"] == shown["size_bytes"]
    assert phases[3].attributes["edgeagent.batch.requests"] == 1

    for traceparent in (None, "00-not-a-trace-01", "ff" + TRACEPARENT[2:]):
        agent.spans.clear()  # warm; no usable traceparent (none, malformed, an unknown
        agent.infer("big", protocol, traceparent)  # version): a trace of its own
        spans = agent.finished()
        (request,) = named(spans, "edgeagent.infer")
        assert request.parent is None and request.context.trace_id != int(CLIENT_TRACE, 16)
        assert [s.name for s in children(spans, request)] == [
            "edgeagent.admission", "edgeagent.queue", "edgeagent.batch"]


def test_a_batch_links_the_requests_it_served(tmp_path, traced):
    """A batch serves several requests (fan-in): each request's batch span is its own
    request span's child, and links to the request spans of the others in its batch."""
    repo = tmp_path / "models"
    add_mlp(repo, "wide", hidden=1024, layers=2,
            config={"max_batch_size": 16, "batching": {"workers": 1}})
    agent = traced(repo)
    agent.infer("wide")  # loaded
    agent.spans.clear()

    def client(i: int) -> None:
        for _ in range(6):
            agent.infer("wide")

    with futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    spans = agent.finished()
    requests = {s.context.span_id: s for s in named(spans, "edgeagent.infer")}
    assert len(requests) == 96
    batches = named(spans, "edgeagent.batch")
    assert len(batches) == 96  # one per request
    runs: dict[tuple[int, int], list] = {}
    for batch in batches:
        mine = requests[batch.parent.span_id]  # under its own request
        assert mine.context.trace_id == batch.context.trace_id
        runs.setdefault((batch.start_time, batch.end_time), []).append(batch)
    shared = [run for run in runs.values() if len(run) > 1]
    assert shared, "16 clients on one worker: some batch served several requests"
    for run in shared:
        assert all(b.attributes["edgeagent.batch.requests"] == len(run) for b in run)
        own = {b.parent.span_id for b in run}
        for batch in run:
            linked = {link.context.span_id for link in batch.links}
            assert linked == own - {batch.parent.span_id}  # the others, not itself
            assert all(link.context.trace_id == requests[link.context.span_id]
                       .context.trace_id != batch.context.trace_id
                       for link in batch.links)  # each another client's trace


def _fleet(tmp_path, traced, repo, models: dict[str, dict[str, int]]):
    """Two routing agents, edge-a and edge-b, both given the table ``models``."""
    nodes = []
    for name in ("edge-a", "edge-b"):
        link = CoordinatorLink(url="http://127.0.0.1:9", node_name=name,
                               report_interval_s=3600)  # no coordinator: tables are given
        node = traced(repo, name, coordinator=link, routing=RoutingSettings())
        node.agent.node.router.listening(node.agent.url, node.grpc.address)
        nodes.append(node)
    table = RoutingTable(version=1, max_age_s=60.0, models=models,
                         nodes={n.name: n.agent.node.router.address for n in nodes})

    async def take(router):
        router.take(Directives(ttl_s=60, routing_version=1, routing=table))

    for node in nodes:
        node.agent.call(take(node.agent.node.router))
    return nodes


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_forwarded_request_continues_the_trace_on_its_peer(tmp_path, traced, protocol):
    repo = tmp_path / "models"
    add_mlp(repo, "mlp")
    a, b = _fleet(tmp_path, traced, repo, {"mlp": {"edge-b": 1}})
    status, served_by = a.infer("mlp", protocol, TRACEPARENT)
    assert served_by in (None, "edge-b")
    (there,) = named(b.finished(), "edgeagent.infer")  # served by edge-b
    (here,) = named(a.finished(), "edgeagent.infer")  # where it landed
    assert here.parent.span_id == int(CLIENT_SPAN, 16)
    assert there.context.trace_id == here.context.trace_id == int(CLIENT_TRACE, 16)
    assert there.parent.span_id == here.context.span_id and there.parent.is_remote
    assert not named(a.finished(), "edgeagent.batch")  # nothing ran where it landed
    assert named(b.finished(), "edgeagent.batch")


def test_a_selection_apps_members_are_in_its_trace_here_and_on_a_peer(tmp_path, traced):
    repo = tmp_path / "models"
    for i in range(3):
        add_classifier(repo, f"c{i}", classes=10, seed=7, error=0.1 * i)
    add_app(repo, "vote", ["c0", "c1", "c2"], policy="exp4", slo_ms=5000)
    a, b = _fleet(tmp_path, traced, repo, {"c2": {"edge-b": 1}})
    x = np.stack([np.arange(4, dtype=np.float32), np.zeros(4, np.float32),
                  np.zeros(4, np.float32)], 1)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [4, 3],
                        "data": x.ravel().tolist()}]}
    a.infer("vote", "http", TRACEPARENT, body)
    wait_for(lambda: named(b.finished(), "edgeagent.infer"), what="the peer's span")
    spans = a.finished()
    (app,) = named(spans, "edgeagent.infer")
    assert app.attributes["edgeagent.model"] == "vote"
    # the members served here: their phases under the app's request span
    batches = [s for s in children(spans, app) if s.name == "edgeagent.batch"]
    assert sorted(s.attributes["edgeagent.model"] for s in batches) == ["c0:1", "c1:1"]
    # the member on edge-b: its request span the child of the app's
    (member,) = named(b.finished(), "edgeagent.infer")
    assert member.attributes["edgeagent.model"] == "c2"
    assert member.context.trace_id == int(CLIENT_TRACE, 16)
    assert member.parent.span_id == app.context.span_id


def test_the_sample_ratio_and_the_callers_decision(tmp_path, traced):
    repo = tmp_path / "models"
    add_mlp(repo, "mlp")
    agent = traced(repo, tracing={"sample_ratio": 0.0, "service_name": "edge-box"})
    for _ in range(5):  # no caller's decision: the ratio's (none)
        agent.infer("mlp")
    assert agent.finished() == []
    unsampled = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"
    agent.infer("mlp", "http", unsampled)
    agent.infer("mlp", "grpc", unsampled)
    assert agent.finished() == []
    agent.infer("mlp", "grpc", TRACEPARENT)  # the caller sampled it: so is it here
    spans = agent.finished()
    assert {s.name for s in spans} == {"edgeagent.infer", "edgeagent.admission",
                                       "edgeagent.queue", "edgeagent.batch"}
    assert all(s.context.trace_id == int(CLIENT_TRACE, 16) for s in spans)
    assert spans[0].resource.attributes["service.name"] == "edge-box"
    assert spans[0].resource.attributes["service.instance.id"] == \
        agent.agent.node.config.node_name


def test_a_failed_load_is_an_error_in_its_trace(tmp_path, traced):
    repo = tmp_path / "models"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model" * 100)
    agent = traced(repo)
    status, _, doc = agent.agent.request("POST", "/v2/models/broken/infer", ROW,
                                         {"traceparent": TRACEPARENT})
    assert status == 503, doc
    spans = agent.finished()
    (request,) = named(spans, "edgeagent.infer")
    assert request.status.status_code is StatusCode.ERROR
    assert request.attributes["http.response.status_code"] == 503
    (cold,) = children(spans, request)
    assert cold.name == "edgeagent.cold_start" and cold.status.status_code is StatusCode.ERROR
    (load,) = children(spans, cold)
    assert load.name == "edgeagent.load" and load.status.status_code is StatusCode.ERROR
    assert load.attributes["error.type"] == "BackendError", load.attributes


def test_tracing_off_is_a_context_variables_read(tmp_path, start_agent):
    """Off (no tracing: section), all a request does in agent.tracing is ``span`` (the
    admission's) and ``queued``: each reads the context variable and returns a shared
    do-nothing or None, making no object and calling no SDK (the lean tests show
    ``serve`` never imports it)."""
    repo = tmp_path / "models"
    add_mlp(repo, "mlp")
    agent = start_agent(repo)
    assert agent.node.tracing is None
    body = json.dumps(ROW).encode()
    agent.request("POST", "/v2/models/mlp/infer", body)  # loaded
    module = tracing.__file__
    calls: Counter[str] = Counter()
    returned = []

    def profile(frame, event, arg):
        if frame.f_code.co_filename == module:
            if event == "call":
                calls[frame.f_code.co_name] += 1
            elif event == "return":
                returned.append(arg)

    async def profiled(hook):  # the agent's event loop thread: where requests run
        sys.setprofile(hook)

    agent.call(profiled(profile))
    try:
        for _ in range(200):
            status, _, _ = agent.request("POST", "/v2/models/mlp/infer", body)
            assert status == 200
    finally:
        agent.call(profiled(None))
    assert calls == {"span": 200, "queued": 200, "__enter__": 200, "__exit__": 200}
    assert all(value is tracing.NOTHING or value is None for value in returned)
    # and outside a traced request, every entry point is the same nothing
    assert tracing.span("edgeagent.admission", "m") is tracing.NOTHING
    assert tracing.queued() is None and tracing.load_began("m") is None
    assert tracing.outgoing() == ()


# -- the agent as a process, sending OTLP to a collector ----------------------------------


class Collector:
    """A real OTLP trace collector on loopback (gRPC or HTTP/protobuf) that keeps the
    spans it receives."""

    def __init__(self, protocol: str) -> None:
        self.spans: list = []
        self.resources: list = []
        if protocol == "grpc":
            self.server = grpc.server(futures.ThreadPoolExecutor(2))
            otlp_grpc.add_TraceServiceServicer_to_server(self._Service(self), self.server)
            port = self.server.add_insecure_port("127.0.0.1:0")
            self.server.start()
            self.endpoint = f"http://127.0.0.1:{port}"
            self.stop = lambda: self.server.stop(0)
        else:
            collector = self

            class Handler(BaseHTTPRequestHandler):
                def do_POST(self) -> None:
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                    assert self.path == "/v1/traces", self.path
                    collector.keep(otlp.ExportTraceServiceRequest.FromString(body))
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.end_headers()
                    self.wfile.write(otlp.ExportTraceServiceResponse().SerializeToString())

                def log_message(self, *args) -> None:
                    pass

            self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=self.http.serve_forever, daemon=True).start()
            self.endpoint = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
            self.stop = self.http.shutdown

    def keep(self, request) -> None:
        for resource_spans in request.resource_spans:
            self.resources.append({a.key: a.value.string_value
                                   for a in resource_spans.resource.attributes})
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)

    class _Service(otlp_grpc.TraceServiceServicer):
        def __init__(self, collector) -> None:
            self.collector = collector

        def Export(self, request, context):
            self.collector.keep(request)
            return otlp.ExportTraceServiceResponse()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_agent_sends_its_spans_to_the_collector_its_config_names(tmp_path, protocol):
    repo = tmp_path / "models"
    add_mlp(repo, "mlp")
    collector = Collector(protocol)
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"tracing": {
        "endpoint": collector.endpoint, "protocol": protocol, "service_name": "box-7"}}))
    proc = subprocess.Popen(
        [EDGEAGENT, "serve", "--config", str(config), "--repository", str(repo),
         "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "data"),
         "--cpu-budget", "200MB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        url = line.split()[3]
        request = urllib.request.Request(
            f"{url}/v2/models/mlp/infer", data=json.dumps(ROW).encode(), method="POST",
            headers={"Content-Type": "application/json", "traceparent": TRACEPARENT})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)  # the exporter's buffer is sent as it stops
        _, err = proc.communicate(timeout=60)
        collector.stop()
    assert proc.returncode == 0, err[-3000:]
    names = sorted(s.name for s in collector.spans)
    assert names == ["edgeagent.admission", "edgeagent.batch", "edgeagent.cold_start",
                     "edgeagent.first_run", "edgeagent.infer", "edgeagent.load",
                     "edgeagent.queue"], names
    assert {s.trace_id.hex() for s in collector.spans} == {CLIENT_TRACE}
    assert collector.resources[0]["service.name"] == "box-7"


def test_tracing_asked_for_without_the_sdk_says_how_to_install_it(tmp_path):
    repo = tmp_path / "models"
    add_mlp(repo, "mlp")
    config = tmp_path / "agent.yaml"
    config.write_text("tracing:\n  protocol: http/protobuf\n")
    env = without_packages(tmp_path / "site", ("opentelemetry",))
    for command in (["config", "check", "agent", str(config)],
                    ["serve", "--config", str(config), "--repository", str(repo),
                     "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "d")]):
        done = subprocess.run([EDGEAGENT, *command], capture_output=True, text=True,
                              env=env, timeout=120)
        said = [line for line in done.stderr.splitlines() if not line.startswith("BLOCKED")]
        assert done.returncode != 0, done.stdout + done.stderr
        assert any(f"{config}: tracing: needs the tracing extra" in line
                   and "-m pip install" in line and "opentelemetry-sdk" in line
                   for line in said), said
