"""A fleet that serves as one (issue 34), as processes on loopback: a coordinator and
three ``edgeagent serve`` agents that report to it, clients spread round-robin over the
nodes. The plan's routing table reaches every node through its reports; a model's
requests are served by the nodes the plan runs it on, split by its replicas; and when
one agent is killed (SIGKILL) no request sent to the others fails while the next plan
moves its models. The fleet is shared by the module's tests (several processes are
expensive to start: the module is slow); the kill runs last. tests/test_routing.py
covers each rule quickly, in process."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.helpers import Agent, CoordinatorProcess, add_synthetic, request, wait_for

pytestmark = pytest.mark.slow

NODES = ("edge-0", "edge-1", "edge-2")
NODE_TIMEOUT_S = 3.0
PLAN_INTERVAL_S = 6.0
#: model -> (size bytes, ms per request); "hot" gets replicas on more than one node
MODELS = {"hot": (8_000_000, 50), "a": (8_000_000, 2), "b": (12_000_000, 2),
          "c": (16_000_000, 2), "d": (20_000_000, 2), "e": (24_000_000, 2)}
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


def infer(url, model, timeout=30):
    status, doc, headers = request(f"{url}/v2/models/{model}/infer", "POST", BODY,
                                   timeout=timeout)
    return status, headers.get("edgeagent-served-by"), doc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    repo = work / "models"
    for name, (size, ms) in MODELS.items():
        add_synthetic(repo, name, size_bytes=size, base_ms=ms, load_ms=100,
                      max_batch_size=1, slo={"latency_ms": 200})
    co = CoordinatorProcess(None, work / "coordinator", node_timeout_s=NODE_TIMEOUT_S,
                            plan_interval_s=3600, reactive_interval_s=3600,
                            rate_step_s=1, plan_window_s=5, history_s=60,
                            directive_ttl_s=30)
    agents = {}
    try:
        for name in MODELS:  # hot takes a core a replica, the others a quarter
            assert request(f"{co.url}/v1/models/{name}", "PUT", {
                "slo_ms": 200, "cpu_per_replica": 1 if name == "hot" else 0.25})[0] == 201
        budget = sum(size for size, _ in MODELS.values()) * 0.45
        for name in NODES:
            config = work / f"{name}.yaml"
            config.write_text(yaml.safe_dump({
                "infer_threads": 4, "cpu_budget": int(budget),
                "coordinator": {"url": co.url, "node_name": name, "cores": 2,
                                "report_interval_s": 0.3}}))
            agents[name] = Agent(repo, work / name, "--config", str(config),
                                 "--cpu-budget", str(int(budget)))
        urls = [agents[n].url for n in NODES]
        # traffic for the first plan's rates: hot busy until the plan (a burst that
        # ended is rightly forecast lower), the others now and then
        with ThreadPoolExecutor(6) as pool:
            for i in range(300):
                model = "hot" if i % 3 else list(MODELS)[1 + i % 5]
                pool.submit(infer, urls[i % 3], model)
            time.sleep(1.0)
            status, plan = wait_for(lambda: (lambda r: r[0] == 200 and r)(
                request(f"{co.url}/v1/plan", "POST", timeout=120)[:2]), 60, "a plan")

        def routed():  # every node holds the plan's table and has prefetched its models
            for name in NODES:
                doc = agents[name].get("/v1/routing")
                if not doc["trusted"] or set(doc["models"]) < set(plan["models"]):
                    return False
                if agents[name].get("/v1/coordinator")["prefetching"]:
                    return False
            return True
        wait_for(routed, 30, "every node routes by the plan's table")
        yield co, agents, plan
    finally:
        for agent in agents.values():
            if agent.proc.poll() is None:
                agent.stop()
        co.stop()


def placement(plan, model):
    return {n: k for n, k in plan["models"][model]["placement"].items()}


def test_requests_go_where_the_plan_runs_their_model(fleet):
    co, agents, plan = fleet
    urls = [agents[n].url for n in NODES]
    loads = sum(m["loads"] for a in agents.values() for m in a.get("/v1/cache"))
    served: dict[str, dict[str, int]] = {m: {} for m in MODELS}
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda i: (list(MODELS)[i % len(MODELS)],
                                           *infer(urls[i % 3], list(MODELS)[i % 6])),
                                range(360)))
    for model, status, by, doc in answers:
        assert status == 200, doc
        served[model][by] = served[model].get(by, 0) + 1
    for model, where in served.items():
        weights = placement(plan, model)
        assert set(where) <= set(weights), (model, where, weights)
        total = sum(weights.values())
        for node, count in where.items():  # within 10 % of the plan's weights
            share, planned = count / sum(where.values()), weights[node] / total
            assert abs(share - planned) <= 0.1 * planned, (model, where, weights)
    assert any(len(placement(plan, m)) > 1 for m in MODELS), plan["assignment"]
    # every model was loaded where the plan put it, before: no load since
    assert sum(m["loads"] for a in agents.values() for m in a.get("/v1/cache")) == loads
    shown = request(f"{co.url}/v1/models/hot")[1]["routed"]
    wait_for(lambda: request(f"{co.url}/v1/models/hot")[1]["routed"], 10, "routed shown")
    assert set(shown) <= set(NODES)


def test_a_killed_node_loses_no_request_sent_to_the_others(fleet):
    co, agents, plan = fleet
    victim = max(NODES, key=lambda n: len(plan["assignment"].get(n, {})))
    moved = set(plan["assignment"][victim])
    alive = [agents[n].url for n in NODES if n != victim]
    answers = []

    def client(i):
        answers.append(infer(alive[i % 2], list(MODELS)[i % len(MODELS)]))

    with ThreadPoolExecutor(4) as pool:
        for i in range(60):
            pool.submit(client, i)
            time.sleep(0.01)
        killed = time.monotonic()
        agents[victim].proc.kill()
        agents[victim].proc.wait()

        def replanned():
            now = request(f"{co.url}/v1/plan")[1]
            return victim not in now["assignment"] and now
        i, new, took = 60, None, None
        give_up = killed + NODE_TIMEOUT_S + PLAN_INTERVAL_S + 30
        while (new is None and time.monotonic() < give_up) or i < 300:
            pool.submit(client, i)
            i += 1
            time.sleep(0.02)
            if new is None:
                new = replanned() or None
                took = time.monotonic() - killed
    assert new is not None, "no plan without the killed node"
    assert [a for a in answers if a[0] != 200] == []
    assert took <= NODE_TIMEOUT_S + PLAN_INTERVAL_S, took
    placed = {m for row in new["assignment"].values() for m in row}
    # each of the victim's models runs on a survivor now, or fits nowhere on the two
    # (then it is served where it lands)
    assert all(m in placed or new["models"][m]["unplaced"] for m in moved), new
    assert not set(new["assignment"]) - set(NODES) - {victim}
