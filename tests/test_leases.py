"""Leases and changes (issue 36): a node renews a small lease at its interval and sends
its full report only when something the planner uses changed, or every
``full_report_s``; an unchanged answer is a few bytes; a node silent past its lease
leaves the plan as a silent node always has. Real processes on loopback: an
``edgeagent serve`` agent reporting to an ``edgeagent coordinator serve``."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request

import pytest
import yaml

from agent.node.lease import WINDOW_S, LeaseKeeper
from agent.percentiles import histogram_quantile
from agent.wire import Directives
from tests.helpers import BODY, Agent, CoordinatorProcess, add_synthetic, request, wait_for


def post_raw(url: str, body: bytes) -> tuple[int, bytes]:
    """(status, the answer's bytes as they came) for one POST."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def metric(co: CoordinatorProcess, name: str) -> float:
    with urllib.request.urlopen(co.url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


ANSWERED = 'edgeagent_coordinator_reports_total{answer="answered"}'
LEASES = "edgeagent_coordinator_leases_total"
REPORT = {"capacity": {"cores": 2, "cpu_memory_bytes": 1_000_000_000},
          "models": {"m": {"resident": True, "size_bytes": 1000,
                           "arrivals": [[0, 1, 5]], "rate": 5.0}}}


def infer(agent: Agent, model: str) -> None:
    req = urllib.request.Request(f"{agent.url}/v2/models/{model}/infer",
                                 data=json.dumps(BODY).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def leasing_agent(tmp_path, repo, co: CoordinatorProcess, name: str) -> Agent:
    """An agent reporting to ``co`` as ``name`` every 0.2 s, a full report at least
    every 600 s."""
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"coordinator": {
        "url": co.url, "node_name": name, "report_interval_s": 0.2, "full_report_s": 600}}))
    return Agent(repo, tmp_path / "data", "--config", str(config))


def leases_renewed(agent: Agent, count: int) -> dict:
    """The agent's coordinator status once it renewed ``count`` leases."""
    return wait_for(lambda: (lambda s: s["leases_renewed"] >= count and s)(
        agent.get("/v1/coordinator")), 30, f"{count} leases renewed")


def test_an_agent_leases_while_quiet_reports_a_change_and_leaves_the_plan_when_silent(
        tmp_path, repo):
    """A quiet agent renews leases (the coordinator counts them, not full reports); a
    model becoming resident sends one full report; a lease whose answer stands gets a
    few bytes, and one after a new plan the new directives; an agent silent past
    ``node_timeout_s`` is out of the next plan, as a silent node always was."""
    co = CoordinatorProcess(None, tmp_path / "co", node_timeout_s=4, directive_ttl_s=30)
    add_synthetic(repo, "m")
    add_synthetic(repo, "n")
    agent = leasing_agent(tmp_path, repo, co, "edge-a")
    try:
        # quiet: a full report (after the lease that asked whether it takes them; a
        # second where the first went before the agent knew its address), then leases
        status = leases_renewed(agent, 10)
        assert status["leases"] is True and status["full_reports"] <= 2, json.dumps(status)
        assert status["directives"] is not None and status["directives"]["answer"]
        full, leases = status["full_reports"], status["leases_renewed"]
        time.sleep(2)
        status = agent.get("/v1/coordinator")
        assert status["full_reports"] == full and status["leases_renewed"] >= leases + 5, \
            json.dumps(status)
        assert status["failures"] == 0
        assert metric(co, ANSWERED) == full and metric(co, LEASES) >= leases + 5
        node = co.get("/v1/nodes/edge-a")[1]
        assert node["alive"] and node["last_seen"] > node["last_report"]  # leases move it
        assert node["models"]["m"]["resident"] is False

        # a change: m becomes resident (and has traffic): a full report goes at once
        infer(agent, "m")
        status = wait_for(lambda: (lambda s: s["full_reports"] == full + 1 and s)(
            agent.get("/v1/coordinator")), 10, "a full report after the change")
        assert status["last_full_report_reason"] in ("models changed", "m: new traffic"), \
            status["last_full_report_reason"]
        wait_for(lambda: co.get("/v1/nodes/edge-a")[1]["models"]["m"]["resident"], 5)
        leases = status["leases_renewed"]
        time.sleep(2)  # quiet again: leases, no report
        status = agent.get("/v1/coordinator")
        assert status["leases_renewed"] >= leases + 5 and status["full_reports"] == full + 1, \
            json.dumps(status)

        # a lease whose answer stands is a few bytes; one naming another report asks
        # for the full one; a new plan's directives come with the next lease
        probe = f"{co.url}/v1/nodes/probe"
        assert post_raw(probe + "/lease", b"{}") == (200, b'{"report":true}\n')
        status_, raw = post_raw(probe + "/report", json.dumps(
            {**REPORT, "report_id": 7}).encode())
        assert status_ == 200, raw
        version = json.loads(raw)["answer"]
        lease = json.dumps({"report": 7, "answer": version}).encode()
        assert post_raw(probe + "/lease", lease) == (200, b'{"answer":%d}\n' % version)
        assert len(post_raw(probe + "/lease", lease)[1]) < 32 < len(raw)
        assert post_raw(probe + "/lease", json.dumps({"report": 8, "answer": version})
                        .encode()) == (200, b'{"report":true}\n')
        for bad, field in ((b'{"report": -1}', "report"), (b'{"answer": "x"}', "answer"),
                           (b'{"what": 1}', "what"), (b'[1]', "")):
            code, answer = post_raw(probe + "/lease", bad)
            assert code == 400 and field in json.loads(answer)["error"], (bad, answer)
        assert co.get("/v1/nodes/probe")[1]["alive"]

        assert request(f"{co.url}/v1/models/m", "PUT", {"slo_ms": 200})[0] == 201
        code, plan, _ = co.post("/v1/plan")
        assert code == 200, plan
        code, raw = post_raw(probe + "/lease", lease)
        directives = Directives.from_json(json.loads(raw))
        assert directives.plan_id == plan["id"] and directives.answer != version
        wait_for(lambda: (agent.get("/v1/coordinator")["directives"] or {}).get("plan_id")
                 == plan["id"], 10, "the plan's directives on the agent")

        # silent: past node_timeout_s the agent is not alive, and a new plan leaves it out
        agent.proc.kill()
        agent.proc.wait()
        renewed = json.dumps({"report": 7, "answer": directives.answer}).encode()
        deadline = time.monotonic() + 5.5
        while time.monotonic() < deadline:  # the probe keeps renewing its lease
            assert post_raw(probe + "/lease", renewed)[0] == 200
            time.sleep(0.5)
        nodes = {n["name"]: n for n in co.get("/v1/nodes")[1]}
        assert not nodes["edge-a"]["alive"] and nodes["probe"]["alive"]
        code, plan, _ = co.post("/v1/plan")
        assert code == 200, plan
        assert set(plan["assignment"]) <= {"probe"} and "probe" in plan["assignment"]
    finally:
        if agent.proc.poll() is None:
            agent.stop()
        co.stop()


def test_leases_through_report_workers_are_counted_and_written(tmp_path, repo):
    """With two report workers a lease is answered by the worker that answered the
    node's full report (its kept connection), handed over, counted in /metrics and
    written: after a restart the node's ``last_seen`` is its last lease's."""
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2)
    add_synthetic(repo, "m")
    agent = leasing_agent(tmp_path, repo, co, "edge-w")
    try:
        status = leases_renewed(agent, 15)
        # a connection that lands on the other worker costs one full report more
        assert status["full_reports"] <= 3 and status["failures"] == 0, status
        wait_for(lambda: metric(co, LEASES) >= 15, 10, "the workers' leases counted")
        agent.stop()

        def settled() -> dict | None:  # the last renewals handed over and written
            first = co.get("/v1/nodes/edge-w")[1]
            time.sleep(1.0)
            second = co.get("/v1/nodes/edge-w")[1]
            return second if second["last_seen"] == first["last_seen"] else None
        seen = wait_for(settled, 20, "the last lease written")
        assert seen["last_seen"] > seen["last_report"]
    finally:
        if agent.proc.poll() is None:
            agent.stop()
        co.stop()
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2)
    try:
        again = co.get("/v1/nodes/edge-w")[1]
        assert (again["last_seen"], again["last_report"]) == (seen["last_seen"],
                                                              seen["last_report"])
    finally:
        co.stop()


# -- what a node measures changes against (agent.node.lease), on a clock of its own ----


def keeper() -> LeaseKeeper:
    k = LeaseKeeper(300.0, 0.25, quantile=histogram_quantile, rng=random.Random(1).random)
    k.supported = True
    return k


def steady(k: LeaseKeeper, rate: float, start: float, seconds: float, rng: random.Random,
           step: float = 5.0) -> float:
    t = start
    while t < start + seconds:
        t += step
        k.observe("m", t, step, rng.gauss(rate * step, (rate * step) ** 0.5), 0.0, [])
    return t


REPORT_BODY = {"capacity": {"cores": 4}, "models": {"m": {"device": "cpu",
                                                          "resident": True,
                                                          "size_bytes": 1e6}}}


@pytest.mark.parametrize("rate", [0.2, 5.0, 400.0])
def test_a_steady_model_is_noise_and_a_doubled_one_a_change(rate):
    """A model's traffic wandering as Poisson noise does sends no report, at a slow, a
    middling or a busy rate; the same model at twice its rate does, within a window."""
    rng = random.Random(36)
    k = keeper()
    t = steady(k, rate, 0.0, WINDOW_S, rng)
    body = k.prepare(json.loads(json.dumps(REPORT_BODY)))
    assert body["models"]["m"]["rate"] == pytest.approx(rate, rel=0.5)
    k.reported(body, Directives(node="n", plan_id=None, ttl_s=60, answer=1), t, "first")
    for _ in range(40):  # 200 s of noise
        t = steady(k, rate, t, 5.0, rng)
        assert k.due(json.loads(json.dumps(REPORT_BODY)), t) is None
    t = steady(k, rate * 2 + 1, t, WINDOW_S, rng)
    reason = k.due(json.loads(json.dumps(REPORT_BODY)), t)
    assert reason is not None and reason.startswith("m: arrivals"), reason


def test_what_the_planner_uses_changed_or_the_longest_wait_passed():
    k = keeper()
    body = k.prepare(json.loads(json.dumps(REPORT_BODY)))
    k.reported(body, Directives(node="n", plan_id=None, ttl_s=60, answer=1), 0.0, "first")
    same = json.loads(json.dumps(REPORT_BODY))
    assert k.due(same, 10.0) is None
    bigger = json.loads(json.dumps(REPORT_BODY))
    bigger["models"]["m"]["size_bytes"] = 1.5e6  # beyond 25 %
    assert k.due(bigger, 10.0).startswith("m: size")
    bigger["models"]["m"]["size_bytes"] = 1.1e6  # within it
    assert k.due(bigger, 10.0) is None
    evicted = json.loads(json.dumps(REPORT_BODY))
    evicted["models"]["m"]["resident"] = False
    assert k.due(evicted, 10.0) == "models changed"
    disk = {**json.loads(json.dumps(REPORT_BODY)), "disk": [{"model": "x", "version": "1",
                                                             "bytes": 5}]}
    assert k.due(disk, 10.0) == "disk changed"
    watched = {**json.loads(json.dumps(REPORT_BODY)), "version_stats": {"m": [
        {"version": 2, "serving": True, "requests": 10}]}}
    assert k.due(watched, 10.0) == "a rollout under way"  # every interval, in full
    assert k.due(same, 300.0) == "every 300 s"
    k.answered(asked=True)  # the coordinator asked for it
    assert k.due(same, 11.0) == "asked by the coordinator"
