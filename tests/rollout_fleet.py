"""A fleet on loopback for rollouts, shared by tests/test_rollout_fleet.py and
bench/rollout.py: ``edgeagent serve`` processes (six by default) reporting to one
``edgeagent coordinator serve`` process, one model ``m`` whose versions are real ONNX
MLPs published to moto's S3 server (``tests.servers.s3_server``), and a client at a
steady rate on every node throughout.

Each agent's repository has ``m`` as a sourced model (``source: s3://models/zoo/m``),
as an operator would lay out a fleet that serves one model everywhere; the catalog
names the same source and the version served, so the coordinator's version pins (and
its rollouts) move every node. Versions: ``good`` (new weights, the same shape),
``slow`` (the same weights run three times as many times over: as large, about three
times slower: ``write_mlp``'s ``repeat``) and ``broken`` (a file no runtime loads).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.modelzoo import write_mlp
from tests.helpers import Agent, CoordinatorProcess, request, reserved_port, wait_for

MODEL = "m"
SHAPE = dict(inputs=4, hidden=512, layers=8, outputs=2)
#: How many times over a version runs its hidden layers: a good one 32 times (its compute,
#: not the HTTP and the box's contention around it, is most of a request's time), a slow
#: one three times that
REPEAT = {"good": 32, "slow": 96}
#: The SLO nodes and the catalog give m: loose, so that a loaded box sheds nothing, at
#: the median: on a small box shared with others a p90 measures the box's stalls (tens of
#: ms for a model of a few), not the version
SLO_MS = 2000
SLO_PERCENTILE = 50
BUCKET = "models"
PREFIX = "zoo/m"
BODY = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                               "data": [0.5, 1.0, 1.5, 2.0]}]}).encode()


@dataclass
class Answer:
    """One client request: when it was sent (monotonic), its status, the version that
    answered it and its latency."""

    sent: float
    status: int
    version: str | None
    seconds: float


class SteadyClient:
    """v2 infer requests for ``m`` to one node at ``rate`` a second (open loop, each
    request in a pool thread, 10 s timeout) until ``stop``."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = f"{url}/v2/models/{MODEL}/infer"
        self.period = 1.0 / rate
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="client")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _one(self, sent: float) -> None:
        req = urllib.request.Request(self.url, data=BODY,
                                     headers={"Content-Type": "application/json"})
        status, version = 0, None
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, version = resp.status, json.loads(resp.read()).get("model_version")
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError:
            status = 0  # refused, reset, timed out
        with self._lock:
            self.answers.append(Answer(sent, status, version, time.monotonic() - sent))

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one, time.monotonic())
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> list[Answer]:
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=True)
        return sorted(self.answers, key=lambda a: a.sent)


class RolloutFleet:
    """The fleet (see the module docstring). ``coordinator``: coordinator config keys;
    ``rollout``: the catalog entry's rollout settings. Use as a context manager."""

    def __init__(self, tmp: Path, s3: Any, *, nodes: int = 6, rate: float = 3.0,
                 report_interval_s: float = 0.5, coordinator: dict | None = None) -> None:
        self.tmp, self.s3, self.rate = tmp, s3, rate
        self.names = [f"edge-{i}" for i in range(1, nodes + 1)]
        self.report_interval_s = report_interval_s
        self.coordinator_config = {
            "rollout_check_s": 0.2, "node_timeout_s": 3.0, "directive_ttl_s": 30,
            "plan_interval_s": 3600, "reactive_interval_s": 3600, "log_level": "info",
            **(coordinator or {})}
        self.agents: dict[str, Agent] = {}
        self.clients: dict[str, SteadyClient] = {}
        self.finished: dict[str, list[Answer]] = {}  # answers of clients stopped
        self._stack = contextlib.ExitStack()
        self.s3_client = s3.client()
        self.co: CoordinatorProcess | None = None

    # -- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> "RolloutFleet":
        self.port = self._stack.enter_context(reserved_port())
        self.s3_client.create_bucket(Bucket=BUCKET)
        self.publish(1, "good")
        self.start_coordinator()
        with ThreadPoolExecutor(len(self.names)) as pool:
            list(pool.map(self.start_agent, self.names))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in list(self.clients):
            self.stop_client(name)
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                agent.stop()
        if self.co is not None:
            self.co.stop()
        self._stack.close()

    def start_coordinator(self) -> None:
        self.co = CoordinatorProcess(None, self.tmp / "coordinator", port=self.port,
                                     **self.coordinator_config)

    def kill_coordinator(self) -> None:
        """SIGKILL, as a crash: nothing written on the way out."""
        assert self.co is not None
        self.co.proc.kill()
        self.co.proc.wait()
        self.co.log.close()

    def start_agent(self, name: str) -> Agent:
        repo, data = self.tmp / name / "repo", self.tmp / name / "data"
        (repo / MODEL).mkdir(parents=True, exist_ok=True)
        (repo / MODEL / "config.yaml").write_text(yaml.safe_dump({
            "source": f"s3://{BUCKET}/{PREFIX}",
            "source_options": {"endpoint_url": self.s3.endpoint_url},
            "slo": {"latency_ms": SLO_MS}}))
        config = self.tmp / name / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "infer_threads": 1, "load_retry_s": 60,
            "coordinator": {"url": f"http://127.0.0.1:{self.port}", "node_name": name,
                            "report_interval_s": self.report_interval_s, "cores": 2}}))
        agent = Agent(repo, data, "--config", str(config), "--log-level", "warning",
                      env=self.s3.env)
        self.agents[name] = agent
        return agent

    def stop_agent(self, name: str) -> None:
        """SIGTERM (its client stopped first: a stopped node is not a failed request)."""
        self.stop_client(name)
        self.agents.pop(name).stop()

    # -- versions and the catalog ------------------------------------------------------
    def publish(self, version: int, kind: str = "good") -> None:
        """Version ``version`` of m in the bucket: ``good``, ``slow`` or ``broken``."""
        path = self.tmp / "published" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "broken":
            path.write_bytes(b"not an onnx model")
        else:
            write_mlp(path, **SHAPE, seed=version, repeat=REPEAT[kind])
        self.s3_client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{version}/model.onnx",
                                  Body=path.read_bytes())

    def entry(self, version: int, **rollout: Any) -> dict[str, Any]:
        return {"slo_ms": SLO_MS, "percentile": SLO_PERCENTILE, "proc_ms": 3,
                "source": f"s3://{BUCKET}/{PREFIX}",
                "source_options": {"endpoint_url": self.s3.endpoint_url},
                "version": version, **({"rollout": rollout} if rollout else {})}

    def set_version(self, version: int, **rollout: Any) -> dict[str, Any]:
        """PUT m's catalog entry at ``version``; the answer (``rollout_id`` when a
        rollout started)."""
        status, doc, _ = request(f"{self.url}/v1/models/{MODEL}", "PUT",
                                 self.entry(version, **rollout))
        assert status in (200, 201), doc
        return doc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        status, doc, _ = request(self.url + path)
        assert status == 200, (path, doc)
        return doc

    def post(self, path: str, body: Any = None) -> Any:
        status, doc, _ = request(self.url + path, "POST", body)
        assert status in (200, 201), (path, doc)
        return doc

    def served(self, name: str) -> str | None:
        """The version node ``name`` serves requests without a version with, once
        ready."""
        try:
            m = self.agents[name].get(f"/v1/cache/{MODEL}")
        except OSError:
            return None
        return str(m["version"]) if m and m.get("state") == "ready" else None

    def wait_serving(self, version: int, names: list[str] | None = None,
                     timeout: float = 90) -> None:
        names = names or list(self.agents)
        wait_for(lambda: all(self.served(n) == str(version) for n in names), timeout,
                 f"{names} serve version {version}", step=0.2)

    def start_fleet(self, version: int = 1, **rollout: Any) -> None:
        """m at ``version`` in the catalog, served by every node (loaded by a first
        request each), a client on each; every node reporting."""
        self.set_version(version, **rollout)
        for name in self.agents:
            wait_for(lambda: request(f"{self.agents[name].url}/v2/models/{MODEL}/infer",
                                     "POST", json.loads(BODY), timeout=30)[0] == 200, 60,
                     f"{name} serves m", step=0.5)
        self.wait_serving(version)
        wait_for(lambda: len(self.get("/v1/nodes")) == len(self.agents), 30,
                 "every node reports")
        for name in self.agents:
            self.start_client(name)

    def start_client(self, name: str) -> None:
        self.clients[name] = SteadyClient(self.agents[name].url, self.rate)

    def stop_client(self, name: str) -> None:
        client = self.clients.pop(name, None)
        if client is not None:
            self.finished.setdefault(name, []).extend(client.stop())

    def answers(self) -> dict[str, list[Answer]]:
        """Every client's answers so far (stopped clients' included)."""
        out = {n: list(a) for n, a in self.finished.items()}
        for name, client in self.clients.items():
            out.setdefault(name, []).extend(sorted(list(client.answers),
                                                   key=lambda a: a.sent))
        return out

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return self.get(f"/v1/rollouts/{rollout_id}")

    def wait_rollout(self, rollout_id: int, states: tuple[str, ...], timeout: float = 180
                     ) -> dict[str, Any]:
        return wait_for(lambda: (lambda r: r if r["state"] in states else None)(
            self.rollout(rollout_id)), timeout, f"rollout {rollout_id} {states}", step=0.25)


def failed(answers: dict[str, list[Answer]]) -> list[tuple[str, Answer]]:
    return [(n, a) for n, xs in answers.items() for a in xs if a.status != 200]


def late(answers: dict[str, list[Answer]], version: str, slo_s: float) -> int:
    """Requests ``version`` answered after ``slo_s``."""
    return sum(1 for xs in answers.values() for a in xs
               if a.version == version and a.seconds > slo_s)
