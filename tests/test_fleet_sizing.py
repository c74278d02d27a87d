"""Sizing (``POST /v1/sizing``, ``edgeagent coordinator size``) and provisioning
(``GET /v1/provisioning``, ``edgeagent coordinator provision``) of a live fleet: real
coordinators on loopback fed the agents' wire reports, and two real agents."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.config import AgentConfig, CoordinatorLink
from agent.coordinator.faro import JobSpec
from agent.coordinator.nodetypes import parse_node_types
from agent.coordinator.ribbon.fleet import FleetEvaluator, PoolType
from agent.coordinator.ribbon.search import search
from agent.wire import parse_report
from tests.helpers import AgentServer, add_synthetic

CATALOGUE = parse_node_types({
    "small": {"price_per_hour": 0.10, "max_count": 8, "launch_s": 60},
    "big": {"price_per_hour": 0.30, "max_count": 4, "launch_s": 120},
})
# per kind: cores, memory, ms per request of a and b
KINDS = {"small": (2, 4e9, {"a": 20.0, "b": 50.0}), "big": (8, 16e9, {"a": 8.0, "b": 20.0})}
RATES = {"a": 200.0, "b": 60.0}   # fleet-wide req/s
T0 = 1_700_000_000.0


def report(kind: str | None, share: float, cores=None) -> dict:
    """An agent's report body (agent.wire): ``share`` of the fleet's arrivals over the
    last 60 s in 10 s points, and per-model batch timings of ``kind``."""
    n_cores, memory, ms = KINDS[kind or "small"]
    body = {"capacity": {"cores": cores or n_cores, "cpu_memory_bytes": memory},
            "models": {m: {"resident": True, "size_bytes": 1000,
                           "arrivals": [[age, 10.0, RATES[m] * share * 10]
                                        for age in range(50, -10, -10)],
                           "batches": {"1": {"count": 1000, "seconds": ms[m]}},
                           "latency_ms": {"p99": 2 * ms[m]}}
                       for m in ("a", "b")}}
    if kind:
        body["node_type"] = kind
    parse_report("x", body)  # the agents' schema
    return body


@pytest.fixture
def fleet(start_coordinator, tmp_path):
    """A coordinator with the catalogue, models a and b, and three reporting nodes:
    two small, one big."""
    started = []

    def start(**config):
        started.append(None)
        config.setdefault("state_dir", tmp_path / f"fleet{len(started)}")
        config.setdefault("node_types", CATALOGUE)
        config.setdefault("clock", lambda: T0)  # reports fill whole 10 s rate bins
        co = start_coordinator(**config)
        for name, slo in (("a", 100), ("b", 200)):
            assert co.request("PUT", f"/v1/models/{name}", {"slo_ms": slo})[0] == 201
        for node, kind, share in (("s1", "small", 0.25), ("s2", "small", 0.25),
                                  ("b1", "big", 0.5)):
            assert co.request("POST", f"/v1/nodes/{node}/report", report(kind, share))[0] == 200
        return co
    return start


def test_sizing_from_reports_finds_the_cheapest_sufficient_pool(fleet):
    co = fleet()
    status, doc = co.request("POST", "/v1/sizing", {"from_reports": True, "seed": 1})
    assert status == 200, doc
    assert set(doc) >= {"best", "price", "qos_percent", "samples", "samples_to_best",
                        "history", "types", "models", "replicas"}
    assert doc["types"] == ["big", "small"]
    # the forecast and the per-kind timings come from the reports
    assert doc["models"]["a"]["rate"] == pytest.approx(200, rel=0.1)
    assert doc["models"]["a"]["proc_ms"] == pytest.approx({"big": 8.0, "small": 20.0})
    assert doc["models"]["b"]["proc_ms"] == pytest.approx({"big": 20.0, "small": 50.0})
    assert doc["qos_percent"] >= 99 and len(doc["history"]) == doc["samples"] <= 100
    assert doc["history"][doc["samples_to_best"] - 1]["counts"] == doc["best"]
    big, small = doc["best"]
    assert doc["price"] == pytest.approx(0.30 * big + 0.10 * small)
    # enough cores for the work (a: 200/s, b: 60/s) on the kinds chosen ...
    assert 8 * big + 2 * small >= 200 * 0.008 + 60 * 0.020
    # ... and the same answer as trying every pool
    status, every = co.request("POST", "/v1/sizing", {"from_reports": True,
                                                      "method": "exhaustive"})
    assert status == 200 and every["samples"] == 5 * 9 - 1
    assert every["price"] == pytest.approx(doc["price"])
    assert every["best"] == doc["best"]
    # Faro filled the chosen pool: replicas per model and kind
    assert sum(doc["replicas"]["a"].values()) >= 2 and set(doc["replicas"]) == {"a", "b"}
    # a cheaper pool misses the target
    cheaper = [h for h in every["history"] if h["price"] < doc["price"] - 1e-9]
    assert cheaper and all(h["qos_percent"] < 99 for h in cheaper)


def test_sizing_with_node_types_in_the_request(fleet):
    co = fleet()
    body = {"node_types": {"small": {"max_count": 3},  # price from the config
                           "gpu": {"price_per_hour": 0.9, "max_count": 2, "cores": 4,
                                   "cpu_memory_bytes": "16GiB",
                                   "proc_ms": {"a": 1.0, "b": 2.0}}},
            "qos_target_percent": 99.9, "method": "random", "max_samples": 12}
    status, doc = co.request("POST", "/v1/sizing", body)
    assert status == 200, doc
    assert doc["types"] == ["small", "gpu"] and doc["samples"] <= 12
    assert doc["qos_target_percent"] == 99.9
    assert doc["models"]["a"]["proc_ms"]["gpu"] == 1.0
    # three small nodes (6 cores) cannot carry 7 cores of work: a gpu is in the pool
    assert doc["best"] is not None and doc["best"][1] >= 1 and doc["qos_percent"] >= 99.9


@pytest.mark.parametrize("body, words", [
    ({}, "either \"from_reports\": true"),
    ({"from_reports": True, "node_types": {}}, "either"),
    ({"from_reports": "yes"}, "from_reports: must be true or false"),
    ({"from_reports": True, "method": "grid"}, "method: must be one of bo, random"),
    ({"from_reports": True, "max_samples": 0}, "max_samples: must be an integer >= 1"),
    ({"from_reports": True, "seed": -1}, "seed: must be an integer >= 0"),
    ({"from_reports": True, "qos_target_percent": 120}, "qos_target_percent"),
    ({"from_reports": True, "budget": 3}, "budget: unknown field"),
    ({"node_types": {"tiny": {"max_count": 2}}}, "node_types.tiny.price_per_hour: missing"),
    ({"node_types": {"tiny": {"price_per_hour": 1}}}, "node_types.tiny.cores: no live node"),
    ({"node_types": {"big": {"price_per_hour": -1}}}, "node_types.big.price_per_hour"),
    ({"node_types": {"big": {"proc_ms": {"a": 0}}}}, "node_types.big.proc_ms.a"),
    ({"node_types": {"big": {"max_count": 0}}}, "max counts"),
    ({"node_types": {"big": {"max_count": 1000}, "small": {"max_count": 1000}}},
     "node_types: max_count allows 1002000 pools; at most 200000"),
    ({"node_types": []}, "node_types: must be a JSON object"),
    ([1], "body: must be a JSON object"),
])
def test_sizing_bad_requests_are_400_naming_the_field(fleet, body, words):
    co = fleet()
    status, doc = co.request("POST", "/v1/sizing", body)
    assert status == 400 and words in doc["error"], doc


def test_sizing_refusals(start_coordinator, fleet):
    co = start_coordinator(node_types=CATALOGUE)
    status, doc = co.request("POST", "/v1/sizing", {"from_reports": True})
    assert status == 409 and "no live nodes" in doc["error"]
    status, doc = co.request("POST", "/v1/sizing", raw=b"{not json")
    assert status == 400 and "not valid JSON" in doc["error"]
    co = fleet(node_types={"big": CATALOGUE["big"]})  # small has no price
    status, doc = co.request("POST", "/v1/sizing", {"from_reports": True})
    assert status == 400 and "'small' (reported by s1, s2) have no price" in doc["error"]
    co = fleet()
    co.request("POST", "/v1/nodes/plain/report", report(None, 0.0))  # states no kind
    assert co.request("POST", "/v1/sizing", {"from_reports": True})[0] == 200


def test_sizing_needs_the_admin_token(start_coordinator, tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef\n")
    co = start_coordinator(admin_token_file=token, node_types=CATALOGUE)
    assert co.request("POST", "/v1/sizing", {"from_reports": True})[0] == 401
    assert co.request("GET", "/v1/provisioning")[0] == 401
    assert co.request("PUT", "/v1/models/a", {"slo_ms": 100}, token="tok-0123456789abcdef0123456789abcdef")[0] == 201
    assert co.request("POST", "/v1/nodes/b1/report", report("big", 1.0), token="tok-0123456789abcdef0123456789abcdef")[0] == 200
    status, doc = co.request("POST", "/v1/sizing", {"from_reports": True}, token="tok-0123456789abcdef0123456789abcdef")
    assert status == 200 and doc["types"] == ["big"] and doc["best"] == [1]
    assert co.request("GET", "/v1/provisioning", token="tok-0123456789abcdef0123456789abcdef")[0] == 200


def test_provisioning(fleet, start_coordinator):
    co = fleet()
    status, doc = co.request("GET", "/v1/provisioning")
    assert status == 200, doc
    # capacity per node: cores over the rate-weighted processing time on that kind
    mean_small = (200 * 0.020 + 60 * 0.050) / 260
    mean_big = (200 * 0.008 + 60 * 0.020) / 260
    assert doc["types"]["small"]["capacity_rps"] == pytest.approx(2 / mean_small, rel=0.02)
    assert doc["types"]["big"]["capacity_rps"] == pytest.approx(8 / mean_big, rel=0.02)
    assert doc["types"]["small"]["running"] == 2 and doc["types"]["big"]["running"] == 1
    assert doc["target_rps"] == pytest.approx(260, rel=0.15)
    assert doc["cost_per_hour_before"] == pytest.approx(0.5)
    # the running big node carries the load alone (743 req/s): stop both small ones
    assert doc["plan"] == {"small": 0, "big": 1} and doc["stop"] == {"small": 2}
    assert doc["launch"] == {} and doc["cost_per_hour_after"] == pytest.approx(0.3)
    # the planner's 10 s forecast over 420 s, as MArk's one-minute steps
    assert len(doc["forecast_rps"]) == 7 and doc["step_s"] == 60
    assert doc["left_out"] == {} and doc["unpriced_running"] == []

    # a heavier load needs more than the big node: MArk launches the cheapest per request
    heavy = fleet()
    for node, kind in (("s1", "small"), ("s2", "small"), ("b1", "big")):
        body = report(kind, 2.0)   # each node now sees twice the fleet's load
        heavy.request("POST", f"/v1/nodes/{node}/report", body)
    status, doc = heavy.request("GET", "/v1/provisioning")
    assert status == 200 and doc["target_rps"] > 743
    planned = sum(doc["types"][k]["capacity_rps"] * n for k, n in doc["plan"].items())
    assert planned >= doc["target_rps"] and doc["launch"]

    status, doc = start_coordinator().request("GET", "/v1/provisioning")
    assert status == 409 and "node_types" in doc["error"]

    # a load no sensible pool serves is refused, not searched for minutes
    flood = fleet(node_types={"small": CATALOGUE["small"]})
    body = report("small", 1.0)
    body["models"]["a"]["arrivals"] = [[age, 10.0, 1e8] for age in range(50, -10, -10)]
    flood.request("POST", "/v1/nodes/s1/report", body)
    status, doc = flood.request("GET", "/v1/provisioning")
    assert status == 409 and "needs more than 1000 nodes" in doc["error"]


def run(*args):
    result = CliRunner().invoke(main, ["coordinator", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_cli_size_and_provision(fleet, tmp_path):
    co = fleet()
    code, out = run("size", "--url", co.url, "--json", "--seed", "1")
    assert code == 0, out
    doc = json.loads(out)
    api = co.request("POST", "/v1/sizing", {"from_reports": True, "seed": 1})[1]
    assert doc == api
    code, out = run("size", "--url", co.url, "--method", "exhaustive")
    assert code == 0 and "exhaustive: 44 pools evaluated" in out
    assert f"price ${doc['price']:.3f}/h" in out and "KIND" in out and "MODEL" in out
    types = tmp_path / "types.json"
    types.write_text(json.dumps({"big": {"max_count": 2}}))
    code, out = run("size", "--url", co.url, "--node-types", str(types), "--json")
    assert code == 0 and json.loads(out)["types"] == ["big"]
    types.write_text(json.dumps({"big": {"max_count": "two"}}))
    code, out = run("size", "--url", co.url, "--node-types", str(types))
    assert code == 1 and "400: node_types.big.max_count: must be an integer" in out
    code, out = run("provision", "--url", co.url)
    assert code == 0 and "$0.500/h -> $0.300/h" in out and "KIND" in out
    code, out = run("provision", "--url", co.url, "--json")
    assert code == 0 and json.loads(out)["stop"] == {"small": 2}


def test_fleet_evaluator_scores_pools_with_faro():
    types = [PoolType("small", 0.1, 8, 2, 4e9, {"a": 0.02}),
             PoolType("big", 0.3, 4, 8, 16e9, {"a": 0.008})]
    ev = FleetEvaluator(types, [JobSpec("a", rate=200, proc_s=0.02, slo_s=0.1)])
    assert ev.measure((0, 0)).qos_percent == 0          # nothing to serve with
    tiny, enough = ev.score((1, 0)), ev.score((0, 1))
    assert tiny.qos_percent < 50 < 99 < enough.qos_percent   # 4 cores of work on 2
    assert enough.replicas == {"a": {"big": enough.replicas["a"]["big"]}}
    # replicas go where the model runs fastest while cores last
    assert set(ev.score((2, 1)).replicas["a"]) == {"big"}
    assert ev.price((2, 1)) == pytest.approx(0.5)
    assert search(ev, "exhaustive").best.counts == (0, 1)
    # 1000 req/s is 8 cores of work on big: one big node misses, small ones top it up
    heavy = FleetEvaluator(types, [JobSpec("a", rate=1000, proc_s=0.02, slo_s=0.1)])
    assert heavy.score((0, 1)).qos_percent < 99
    mixed = heavy.score((4, 1))
    assert mixed.replicas["a"]["big"] == 8 and mixed.replicas["a"]["small"] >= 1
    assert mixed.qos_percent >= 99
    # adding a node of either kind never lowers QoS by more than Ribbon's 1-point
    # pruning threshold on this grid
    for c in heavy.space.iter_grid():
        for i in range(2):
            more = tuple(n + (j == i) for j, n in enumerate(c))
            if heavy.space.contains(more):
                assert heavy.score(more).qos_percent >= heavy.score(c).qos_percent - 1


def test_two_real_agents_reporting_then_sizing(start_coordinator, tmp_path):
    """Real agents on loopback state their node_type; their own measurements and
    arrivals size the fleet."""
    co = start_coordinator(node_types=CATALOGUE, rate_step_s=0.5, plan_window_s=2,
                           history_s=30, node_timeout_s=30)
    repo = tmp_path / "models"
    add_synthetic(repo, "m", base_ms=5, size_bytes=1_000_000)
    co.request("PUT", "/v1/models/m", {"slo_ms": 100})
    agents = []
    try:
        for name, kind, cores in (("edge-s", "small", 2), ("edge-b", "big", 8)):
            link = CoordinatorLink(url=co.url, report_interval_s=0.2, node_name=name,
                                   cores=cores, node_type=kind)
            cfg = AgentConfig(repository=repo, data_dir=tmp_path / name,
                              cpu_budget=100_000_000, infer_threads=4, coordinator=link)
            agents.append(AgentServer(cfg, budgets={"cpu": 100_000_000}))
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                            "data": [1.0, 2.0]}]}
        with ThreadPoolExecutor(4) as pool:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                list(pool.map(lambda a: a.request("POST", "/v2/models/m/infer", body)[0],
                              agents * 2))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            nodes = co.request("GET", "/v1/nodes")[1]
            if len(nodes) == 2 and all(n["models"].get("m", {}).get("batches")
                                       for n in nodes):
                break
            time.sleep(0.1)
        time.sleep(0.5)  # one more report each: the arrivals of the burst are in
        status, doc = co.request("POST", "/v1/sizing", {"from_reports": True})
        assert status == 200, doc
        assert doc["types"] == ["big", "small"] and doc["models"]["m"]["rate"] > 0
        assert doc["best"] is not None and doc["qos_percent"] >= 99
        assert all(ms > 0 for ms in doc["models"]["m"]["proc_ms"].values())
        status, prov = co.request("GET", "/v1/provisioning")
        assert status == 200 and prov["types"]["small"]["running"] == 1
        assert prov["cost_per_hour_before"] == pytest.approx(0.4)
    finally:
        for a in agents:
            a.close()


def test_a_long_sizing_does_not_block_reports(fleet):
    """The search runs in a worker thread: reports are answered while it runs."""
    co = fleet()
    done = {}

    def size():
        done["sizing"] = co.request("POST", "/v1/sizing", {
            "node_types": {"small": {"max_count": 40}, "big": {"max_count": 20}},
            "method": "exhaustive"})
        done["sizing_at"] = time.monotonic()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(size)
        time.sleep(0.3)
        answered = []
        while not future.done() and len(answered) < 5:
            status, _ = co.request("POST", "/v1/nodes/s1/report", report("small", 0.25))
            answered.append((status, time.monotonic()))
        future.result()
    status, doc = done["sizing"]
    assert status == 200 and doc["samples"] == 41 * 21 - 1
    assert answered and all(s == 200 for s, _ in answered)
    assert answered[0][1] < done["sizing_at"]   # answered while the search ran


def test_node_type_in_agent_config_report_and_coordinator_config(fleet, tmp_path):
    from agent.config import parse_agent_config
    from agent.coordinator.config import parse_coordinator_config
    from agent.validation import ConfigError

    cfg = parse_agent_config({"repository": str(tmp_path), "coordinator": {
        "url": "http://127.0.0.1:8100", "node_type": "c5.large"}})
    assert cfg.coordinator.node_type == "c5.large"
    co_cfg = parse_coordinator_config({"node_types": {"c5.large": {
        "price_per_hour": 0.085, "cpu_memory_bytes": "4GiB"}}})
    assert co_cfg.node_types["c5.large"].cpu_memory_bytes == 4 * 2**30
    with pytest.raises(ConfigError, match="c.yaml: node_types.x.price_per_hour: missing"):
        parse_coordinator_config({"node_types": {"x": {"max_count": 2}}}, "c.yaml")
    co = fleet()
    for bad in ("", "a b", 7):
        status, doc = co.request("POST", "/v1/nodes/n/report", {**report(None, 0),
                                                                "node_type": bad})
        assert status == 400 and "node_type" in doc["error"], doc
