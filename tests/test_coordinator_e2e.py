"""End to end on loopback: a coordinator and two real agents with synthetic models.

Stats flow in, a plan's directives change worker counts and pins on the agents, and
when the coordinator stops the agents keep serving and revert its pins after the ttl.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agent.config import AgentConfig, CoordinatorLink
from tests.helpers import BODY, AgentServer, add_synthetic, wait_for

TTL = 1.5


def infer(agent, model):
    status, _, doc = agent.request("POST", f"/v2/models/{model}/infer", BODY)
    assert status == 200, doc
    return doc


def test_coordinator_and_two_agents(start_coordinator, tmp_path):
    co = start_coordinator(directive_ttl_s=TTL, rate_step_s=0.5, plan_window_s=2,
                           history_s=30, node_timeout_s=30)
    repo = tmp_path / "models"
    # one request per run: its 25 ms is the per-request cost whatever the concurrency
    add_synthetic(repo, "hot", base_ms=25, size_bytes=20_000_000, max_batch_size=1)
    add_synthetic(repo, "cold", base_ms=1, size_bytes=10_000_000)
    add_synthetic(repo, "free", base_ms=1, size_bytes=1_000_000)  # not in the catalog
    agents = {}
    try:
        for name in ("edge-a", "edge-b"):
            link = CoordinatorLink(url=co.url, report_interval_s=0.2, node_name=name, cores=2)
            cfg = AgentConfig(repository=repo, data_dir=tmp_path / name, cpu_budget=100_000_000,
                              infer_threads=4, coordinator=link)
            agents[name] = AgentServer(cfg, budgets={"cpu": 100_000_000})
        a, b = agents["edge-a"], agents["edge-b"]
        default_workers = {m: a.request("GET", f"/v1/cache/{m}")[2]["workers"]
                           for m in ("hot", "cold", "free")}
        assert co.request("PUT", "/v1/models/hot", {"slo_ms": 80})[0] == 201
        assert co.request("PUT", "/v1/models/cold", {"slo_ms": 80})[0] == 201

        # stats flow in: both nodes register; hot's arrivals and latencies arrive. The
        # load goes on until the plan is made: the planner forecasts the rate of the
        # coming window, and a burst that has already ended is rightly forecast lower.
        busy = threading.Event()
        busy.set()

        def keep_hot_busy() -> None:
            while busy.is_set():
                list(pool.map(lambda _: infer(a, "hot"), range(4)))
        pool = ThreadPoolExecutor(4)
        loader = threading.Thread(target=keep_hot_busy)
        loader.start()
        time.sleep(1.5)
        infer(b, "free")

        def stats_in():
            nodes = {n["name"]: n for n in co.request("GET", "/v1/nodes")[1]}
            hot = nodes.get("edge-a", {}).get("models", {}).get("hot", {})
            return len(nodes) == 2 and hot.get("batches") and hot.get("resident") and nodes
        nodes = wait_for(stats_in)
        assert nodes["edge-a"]["capacity"] == {"cores": 2, "cpu_memory_bytes": 100_000_000,
                                               "gpus": []}
        assert set(nodes["edge-b"]["models"]) == {"hot", "cold", "free"}

        try:
            status, plan = co.request("POST", "/v1/plan")
        finally:
            busy.clear()
            loader.join()
            pool.shutdown()
        assert status == 200, plan
        hot = plan["models"]["hot"]
        # per request: a 25 ms batch shared by the requests batched together
        assert hot["proc_source"] == "measured" and 0 < hot["proc_ms"] <= 40
        assert hot["rate"] > 20 and hot["replicas"] >= 2
        assert plan["models"]["cold"]["replicas"] == 1 and "free" not in plan["models"]
        assignment = plan["assignment"]
        assert sum(sum(row.values()) for row in assignment.values()) <= 4

        # directives reach the agents: worker counts, pins, prefetched models
        for name, agent in agents.items():
            row = assignment.get(name, {})

            def applied(agent=agent, row=row):
                s = agent.request("GET", "/v1/coordinator")[2]
                return s["directives"] and s["directives"]["plan_id"] == plan["id"] and s
            status_doc = wait_for(applied)
            assert status_doc["workers"] == row and status_doc["workers_applied"]
            assert status_doc["pinned_by_coordinator"] == sorted(row)
            for model in ("hot", "cold", "free"):
                entry = agent.request("GET", f"/v1/cache/{model}")[2]
                assert entry["pinned"] == (model in row), (name, model)
                assert entry["workers"] == row.get(model, default_workers[model])
            for model in row:  # prefetched: resident without a request
                wait_for(lambda m=model, ag=agent:
                         ag.request("GET", f"/v1/cache/{m}")[2]["state"] == "ready")
        pinned_somewhere = {m for row in assignment.values() for m in row}
        assert pinned_somewhere == {"hot", "cold"}
        assert any(row.get("hot", 0) > default_workers["hot"] for row in assignment.values())
        # the agents report the worker counts they run
        wait_for(lambda: co.request("GET", "/v1/nodes/edge-a")[1]["models"]["hot"]["workers"]
                 == assignment.get("edge-a", {}).get("hot", default_workers["hot"]))

        # the coordinator goes away: agents keep serving, then revert the pins
        co.close()
        for agent in agents.values():
            infer(agent, "hot")
            infer(agent, "cold")
        for name, agent in agents.items():
            s = wait_for(lambda ag=agent: (lambda d: d["directives"] is None and d)(
                ag.request("GET", "/v1/coordinator")[2]), timeout=TTL + 10)
            assert s["failures"] >= 1 and s["last_error"]
            assert s["pinned_by_coordinator"] == [] and s["workers"] == {}
            for model in ("hot", "cold"):
                entry = agent.request("GET", f"/v1/cache/{model}")[2]
                assert entry["pinned"] is False
                assert entry["workers"] == default_workers[model]
            infer(agent, "hot")
            assert agent.request("GET", "/v2/health/ready")[0] == 200
    finally:
        for agent in agents.values():
            agent.close()
