"""``simulate`` replays a fleet (issue 34 item 8): one trace spread round robin over N
nodes and routed by a routing table as the nodes' routers route it, or several nodes'
own records, each node its own cache, and the fleet's sum."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from cachepolicies import twin
from cachepolicies.fleet import fleet_nodes, fleet_total, replay_nodes, routing_weights, spread
from cachepolicies.simulator import simulate
from cachepolicies.traces import make_profiles, make_trace


@pytest.fixture
def workload(tmp_path):
    names = ["a", "b", "c"]
    profiles = make_profiles(names, np.array([100, 100, 100]), np.array([1.0, 1.0, 1.0]),
                             np.array([0.01, 0.01, 0.01]))
    rng = np.random.default_rng(4)
    models = [names[i] for i in rng.integers(0, 3, 300)]
    trace = make_trace(np.arange(300) * 0.1, models, profiles)
    (tmp_path / "trace.csv").write_text("timestamp,model\n" + "".join(
        f"{t:.1f},{m}\n" for t, m in zip(np.arange(300) * 0.1, models)))
    (tmp_path / "profiles.csv").write_text(
        "model,size_bytes,load_seconds,exec_seconds\n"
        + "".join(f"{n},100,1.0,0.01\n" for n in names))
    return trace, profiles, models


def test_the_trace_lands_round_robin_and_goes_where_the_table_says(workload):
    trace, profiles, models = workload
    weights = routing_weights({"models": {"a": {"n0": 1}, "c": {"n1": 3, "n2": 1}}})
    nodes = fleet_nodes(3, weights)
    assert nodes == ["n0", "n1", "n2"]
    parts = spread(trace, profiles, nodes, weights)
    assert sum(len(p) for p in parts.values()) == len(trace)
    served = {n: [profiles.names[i] for i in p.model_ids] for n, p in parts.items()}
    assert "a" not in served["n1"] + served["n2"]  # a runs on n0 only
    # b has no node: served where it landed (request i on node i mod 3)
    landed_b = {n: sum(1 for i, m in enumerate(models) if m == "b" and i % 3 == k)
                for k, n in enumerate(nodes)}
    assert {n: served[n].count("b") for n in nodes} == landed_b
    c = {n: served[n].count("c") for n in nodes}
    assert c["n0"] == 0 and abs(c["n1"] / (c["n1"] + c["n2"]) - 0.75) < 0.05
    for part in parts.values():  # each node's share keeps the trace's order
        assert np.all(np.diff(part.timestamps) >= 0)


def test_the_fleet_is_the_sum_of_its_nodes(workload):
    trace, profiles, _ = workload
    parts = spread(trace, profiles, ["x", "y"], {})
    results = [simulate(p, profiles, 150, "lru") for p in parts.values()]
    total = fleet_total(results)
    assert total.requests == len(trace) == sum(r.requests for r in results)
    assert total.misses == sum(r.misses for r in results)
    assert total.capacity_bytes == 300
    assert total.mean_load_delay_seconds == pytest.approx(total.load_delay_seconds / 300)


def test_each_node_replays_its_share_with_its_own_settings_and_directives(workload):
    # 3 models of 100 B round robin over two nodes of 200 B: a pinned on x is loaded
    # once (prefetched) and b and c take turns in the other slot; y keeps what its LRU
    # keeps
    trace, profiles, _ = workload
    parts = spread(trace, profiles, ["x", "y"], {})
    pin_a = [twin.Directive(0.0, frozenset({0}), (0,))]
    plain = replay_nodes(parts, {"x": profiles, "y": profiles}, 200, "lru",
                         twin.Queueing())
    pinned = replay_nodes(parts, {"x": profiles, "y": profiles}, 200, "lru",
                          {"x": twin.Queueing(), "y": twin.Queueing(workers=2)},
                          directives={"x": pin_a})
    assert pinned["x"].loads[0] == 1 < plain["x"].loads[0]  # prefetched, never evicted
    assert pinned["x"].loads[1:] != plain["x"].loads[1:]  # b and c share one slot
    assert pinned["y"].loads == plain["y"].loads  # no directives on y
    one = simulate(parts["x"], profiles, 200, "lru", queueing=twin.Queueing(),
                   directives=pin_a)
    assert one.misses == sum(pinned["x"].loads)  # prefetches are loads too
    with pytest.raises(ValueError, match="twin only"):
        simulate(parts["x"], profiles, 200, "lru", directives=pin_a)


def test_routing_weights_read_every_form():
    table = {"version": 1, "max_age_s": 60, "nodes": {}, "models": {"a": {"n0": 2}}}
    seen = {"models": {"a": {"planned": {"n0": 2}, "forwarded": 3}}}
    plan = {"assignment": {"n0": {"a": 2}}}
    assert routing_weights(table) == routing_weights(seen) == routing_weights(plan) == \
        {"a": {"n0": 2}}
    with pytest.raises(ValueError, match="node -> replicas"):
        routing_weights({"models": {"a": {"n0": "two"}}})
    with pytest.raises(ValueError, match="'models'"):
        routing_weights({"nodes": {}})
    with pytest.raises(ValueError, match="--nodes is 1"):
        fleet_nodes(1, {"a": {"n0": 1, "n1": 1}})


def test_simulate_nodes_with_a_routing_table(workload, tmp_path):
    (tmp_path / "routing.json").write_text(json.dumps(
        {"models": {"a": {"n0": 1}, "b": {"n1": 1}, "c": {"n2": 1}}}))
    args = ["simulate", "--trace", str(tmp_path / "trace.csv"), "--profiles",
            str(tmp_path / "profiles.csv"), "--capacity", "150", "--policy", "lru",
            "--nodes", "3", "--json", "--no-progress"]
    routed = CliRunner().invoke(main, [*args, "--routing", str(tmp_path / "routing.json")])
    assert routed.exit_code == 0, routed.output
    rows = {r["node"]: r for r in json.loads(routed.output)}
    assert set(rows) == {"n0", "n1", "n2", "fleet"}
    assert rows["fleet"]["misses"] == 3  # each model loaded once, on its node
    plain = CliRunner().invoke(main, args)
    spread_rows = {r["node"]: r for r in json.loads(plain.output)}
    assert spread_rows["fleet"]["requests"] == 300
    assert spread_rows["fleet"]["misses"] > 3 * rows["fleet"]["misses"]
    bad = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "trace.csv"),
                                    "--profiles", str(tmp_path / "profiles.csv"),
                                    "--capacity", "150", "--policy", "lru",
                                    "--routing", str(tmp_path / "routing.json")])
    assert bad.exit_code != 0 and "--routing needs --nodes" in bad.output
