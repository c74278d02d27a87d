"""The rollout as a pure function (``agent.coordinator.rollout``): waves cut from the
nodes, each wave switching then baking, the gates judged over the window of cumulative
counters the nodes report, and the version each node serves at every step. The fleet
end to end is in tests/test_rollout_fleet.py; the routes and the store in
tests/test_rollout_api.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from msgspec import structs

from agent.coordinator.rollout import (BAKING, COMPLETED, ROLLED_BACK, RUNNING, SWITCHING,
                                       Counters, Gates, NodeView, Rollout, RolloutSettings,
                                       judge, new_rollout, split_waves, step, wave_sizes)
from agent.node.cache.versionpins import VersionPin, served_version

NODES = [f"n{i}" for i in range(1, 7)]
BOUNDS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0)


def counters(requests=0, errors=0, latency_ms=2.0, load_failures=0, size=1e6) -> Counters:
    """Cumulative counters of ``requests`` answers, all at ``latency_ms``."""
    ok = requests - errors
    return Counters(requests, errors, ok, load_failures,
                    tuple((b, ok if latency_ms <= b else 0.0) for b in BOUNDS), size)


def views(serving: dict[str, int], figures: dict[str, dict[int, Counters]],
          dead: set[str] = frozenset(), errors: dict[str, dict[int, str]] | None = None):
    return {n: NodeView(alive=n not in dead, serving=serving.get(n),
                        versions=figures.get(n, {}), errors=(errors or {}).get(n, {}))
            for n in NODES}


def start(settings: RolloutSettings | None = None, view=None) -> Rollout:
    settings = settings or RolloutSettings(waves=(1, 2), bake_s=10, wave_timeout_s=30,
                                          settle_s=0)
    view = view or views({n: 1 for n in NODES}, {})
    return new_rollout(7, "m", (1, None), (2, None), settings, NODES, view, 99.0, now=0.0)


def test_wave_sizes_and_their_split():
    assert split_waves(NODES, (1, 2)) == [["n1"], ["n2", "n3"], ["n4", "n5", "n6"]]
    assert split_waves(NODES, (1, "50%")) == [["n1"], ["n2", "n3", "n4"], ["n5", "n6"]]
    assert split_waves(NODES, ("10%",)) == [["n1"], NODES[1:]]  # rounded up, at least 1
    assert split_waves(NODES, ()) == [NODES]
    assert split_waves(NODES[:1], (1, 2)) == [["n1"]]
    for bad in ([0], ["0%"], ["150%"], ["x"], [True], "1", [1.5]):
        with pytest.raises(ValueError, match="wave size|wave sizes"):
            wave_sizes(bad)


def test_the_canary_is_a_live_node():
    view = views({n: 1 for n in NODES}, {}, dead={"n1"})
    r = start(view=view)
    assert r.waves[0] == ("n2",) and "n1" in r.waves[-1]


def test_a_good_version_goes_wave_by_wave_and_each_node_serves_its_waves_version():
    r = start()
    assert [r.version_for(n)[0] for n in NODES] == [2, 1, 1, 1, 1, 1]
    assert r.keep_for("n1") == (1,) and r.keep_for("n2") == ()
    figures = {n: {1: counters(100)} for n in NODES}
    # the canary has not switched yet: still switching
    assert step(r, views({n: 1 for n in NODES}, figures), 1.0) is r
    served = {"n1": 2, **{n: 1 for n in NODES[1:]}}
    figures["n1"][2] = counters(0)
    r = step(r, views(served, figures), 2.0)
    assert (r.phase, r.bake_started, r.history[0]["serving"]) == (BAKING, 2.0, 2.0)
    # it bakes: both sides answer, the new one as fast as the old
    for n in NODES:
        figures[n] = {v: replace(c, requests=c.requests + 50, ok=c.ok + 50,
                                 buckets=tuple((b, k + 50) for b, k in c.buckets))
                      for v, c in figures[n].items()}
    r = step(r, views(served, figures), 5.0)
    assert r.state == RUNNING and r.phase == BAKING and r.figures["new"]["requests"] == 50
    assert r.figures["old"]["requests"] == 250  # five nodes' 50 each, since the bake
    r = step(r, views(served, figures), 12.5)  # the bake is over: wave 2 starts
    assert (r.wave, r.phase, r.history[0]["completed"]) == (1, SWITCHING, 12.5)
    assert [r.version_for(n)[0] for n in NODES] == [2, 2, 2, 1, 1, 1]
    served.update(n2=2, n3=2)
    r = step(r, views(served, figures), 13.0)
    r = step(r, views(served, figures), 24.0)
    assert r.wave == 2
    served.update(n4=2, n5=2, n6=2)
    r = step(r, views(served, figures), 25.0)
    assert r.phase == BAKING
    r = step(r, views(served, figures), 36.0)
    assert r.state == COMPLETED and len(r.history) == 3
    assert [r.version_for(n)[0] for n in NODES] == [2] * 6 and r.keep_for("n1") == ()
    assert Rollout.from_json(r.to_json()) == r  # as the store keeps it


def test_a_version_that_fails_to_load_stops_at_the_canary():
    r = start()
    figures = {"n1": {2: counters(0, load_failures=1)}}
    r = step(r, views({n: 1 for n in NODES}, figures,
                      errors={"n1": {2: "onnxruntime: bad model"}}), 3.0)
    assert r.state == ROLLED_BACK and "n1: version 2 failed to load" in r.reason
    assert "bad model" in r.reason
    assert [r.version_for(n)[0] for n in NODES] == [1] * 6 and r.keep_for("n1") == ()


def test_a_version_the_source_lacks_stops_at_the_canary():
    r = step(start(), views({n: 1 for n in NODES}, {"n1": {2: counters(0)}},
                            errors={"n1": {2: "its source lists no version 2"}}), 1.0)
    assert r.state == ROLLED_BACK and "lists no version 2" in r.reason


def test_a_slow_version_breaches_the_latency_gate_while_it_bakes():
    r = start()
    served = {"n1": 2, **{n: 1 for n in NODES[1:]}}
    figures = {n: {1: counters(10)} for n in NODES}
    figures["n1"][2] = counters(0)
    r = step(r, views(served, figures), 1.0)
    assert r.phase == BAKING
    figures["n1"][2] = counters(499, latency_ms=9.0)  # three to four times slower
    for n in NODES[1:]:
        figures[n][1] = counters(110, latency_ms=2.0)
    r2 = step(r, views(served, figures), 4.0)  # p99 needs 500 answers a side
    assert r2.state == RUNNING and r2.figures["new"]["latency_ms"] > 3 * 2.0
    figures["n1"][2] = counters(500, latency_ms=9.0)
    r = step(r, views(served, figures), 4.0)
    assert r.state == ROLLED_BACK and r.reason.startswith("latency: p99"), r.reason
    assert r.figures["new"]["latency_ms"] > 3 * r.figures["old"]["latency_ms"]


def test_gates_judge_errors_memory_and_wait_for_enough_answers():
    gates = Gates(min_requests=20)
    old = counters(200, errors=2)
    assert judge(gates, counters(10, errors=10), old, 99) is None  # too few to judge
    assert judge(gates, counters(100, errors=2), old, 99) is None
    assert "errors: 5.0%" in judge(gates, counters(100, errors=5), old, 99)
    old = counters(200, errors=2, size=20 * 2**20)
    assert "memory" in judge(gates, counters(100, size=60 * 2**20), old, 99)
    assert judge(structs.replace(gates, max_memory_ratio=None),
                 counters(100, size=60 * 2**20), old, 99) is None
    assert judge(gates, counters(100, size=3e6), counters(100, size=1e6), 99) is None  # noise
    # a sub-millisecond difference is bucket noise, not a breach
    assert judge(gates, counters(100, latency_ms=0.9), counters(100, latency_ms=0.3), 99) \
        is None
    assert "latency" in judge(gates, counters(500, latency_ms=24.0),
                              counters(500, latency_ms=4.0), 99)
    assert judge(gates, counters(499, latency_ms=24.0), counters(500, latency_ms=4.0), 99) \
        is None  # one answer in a hundred is one outlier short of judging p99
    assert "latency" in judge(gates, counters(50, latency_ms=24.0),
                              counters(50, latency_ms=4.0), 90)


def test_the_last_wave_is_judged_on_errors_against_the_old_versions_last_figures():
    settings = RolloutSettings(waves=(3,), bake_s=5, settle_s=0)
    r = start(settings)
    served = {n: (2 if n in r.waves[0] else 1) for n in NODES}
    figures = {n: {1: counters(30)} for n in NODES}
    for n in r.waves[0]:
        figures[n][2] = counters(0)
    r = step(r, views(served, figures), 1.0)
    for n in NODES[3:]:
        figures[n][1] = counters(230, latency_ms=3.0)
    r = step(r, views(served, figures), 7.0)  # wave 1 passes, the reference kept
    assert r.wave == 1 and r.reference is not None and r.reference.requests == 600
    served.update({n: 2 for n in NODES})
    for n in NODES:
        figures[n][2] = counters(0)
    r = step(r, views(served, figures), 8.0)
    assert r.phase == BAKING
    for n in NODES:
        figures[n][2] = counters(90, latency_ms=20.0)
    r2 = step(r, views(served, figures), 9.0)
    # no old side left: latency is not judged against an earlier window's ...
    assert r2.state == RUNNING and r2.figures["old"]["requests"] == 600
    for n in NODES:
        figures[n][2] = counters(90, errors=20)
    r3 = step(r, views(served, figures), 9.0)
    assert r3.state == ROLLED_BACK and "errors" in r3.reason  # ... errors are


def test_a_silent_node_is_not_waited_for_and_a_live_one_has_a_deadline():
    r = start(RolloutSettings(waves=(2,), bake_s=5, wave_timeout_s=30, settle_s=0))
    assert r.waves[0] == ("n1", "n2")
    served = {"n1": 2, **{n: 1 for n in NODES[1:]}}
    r2 = step(r, views(served, {}, dead={"n2"}), 1.0)
    assert r2.phase == BAKING  # n2 is silent: it catches up when it reports again
    assert r2.version_for("n2")[0] == 2
    r3 = step(r, views(served, {}), 31.0)  # n2 is live but does not switch
    assert r3.state == ROLLED_BACK and "n2 did not serve version 2 within 30 s" in r3.reason


def test_counters_that_go_back_start_the_window_again():
    base = counters(100, errors=1)
    assert counters(150, errors=2).since(base).requests == 50
    assert counters(30).since(base).requests == 30  # the node restarted


def test_pause_resume_abort():
    r = start()
    paused = r.paused(5.0)
    assert step(paused, views({n: 2 for n in NODES}, {}), 6.0) is paused
    assert paused.version_for("n1")[0] == 2  # the wave keeps its version
    resumed = paused.resumed(7.0)
    assert (resumed.state, resumed.phase, resumed.wave_started) == (RUNNING, SWITCHING, 7.0)
    aborted = resumed.aborted(8.0, "by hand")
    assert [aborted.version_for(n)[0] for n in NODES] == [1] * 6


def test_no_node_runs_the_model():
    r = new_rollout(1, "m", (1, None), (2, None), RolloutSettings(), [], {}, 99.0, 0.0)
    assert r.state == COMPLETED and r.version_for("anyone")[0] == 2


def test_the_nodes_version_decision():
    assert served_version([1, 2, 3], None) == 3
    assert served_version([1, 2, 3], VersionPin(serve=2)) == 2
    assert served_version([1, 2, 3], VersionPin(bad=frozenset({3}))) == 2
    # pinned to a version not listed yet: the newest below it, never past it
    assert served_version([1, 3], VersionPin(serve=2)) == 1
    assert served_version([3], VersionPin(serve=2)) == 3  # nothing below: what there is
    assert served_version([], VersionPin(serve=2)) is None
    assert served_version([1, 2], VersionPin(serve=1, bad=frozenset({2}))) == 1


def test_a_node_that_begins_to_serve_the_model_joins_the_last_wave():
    r = new_rollout(1, "m", (1, None), (2, None), RolloutSettings(waves=(1,), bake_s=5),
                    NODES[:3], {}, 99.0, 0.0)
    assert r.waves == (("n1",), ("n2", "n3"))
    view = views({"n1": 2, "n2": 1, "n3": 1, "n4": 1}, {})
    r = step(r, view, 1.0)
    assert r.waves == (("n1",), ("n2", "n3", "n4")) and r.version_for("n4")[0] == 1


def test_the_window_begins_once_the_switch_has_settled():
    r = start(RolloutSettings(waves=(1, 2), bake_s=10, settle_s=3))
    served = {"n1": 2, **{n: 1 for n in NODES[1:]}}
    figures = {n: {1: counters(100)} for n in NODES}
    figures["n1"][2] = counters(0)
    r = step(r, views(served, figures), 1.0)
    figures["n1"][2] = counters(600, latency_ms=40.0)  # a slow start: warm-up, unloads
    r = step(r, views(served, figures), 2.0)
    assert r.state == RUNNING and not r.settled and r.figures == {}
    r = step(r, views(served, figures), 4.0)  # the window begins: what came before is out
    assert r.settled and r.figures["new"]["requests"] == 0
    figures["n1"][2] = counters(1200, latency_ms=2.0)
    for n in NODES[1:]:
        figures[n][1] = counters(700, latency_ms=2.0)
    r = step(r, views(served, figures), 6.0)
    assert r.state == RUNNING and r.figures["new"]["requests"] == 600


def test_a_wave_with_no_live_node_waits_for_one_then_for_its_timeout():
    r = start(RolloutSettings(waves=(2,), bake_s=5, wave_timeout_s=30, settle_s=0))
    everyone_silent = views({n: 1 for n in NODES}, {}, dead=set(NODES))
    assert step(r, everyone_silent, 10.0) is r  # a coordinator just back: heard none yet
    assert step(r, everyone_silent, 31.0).phase == BAKING  # not forever


def test_the_version_table_each_answer_is_made_from():
    """The catalog's version for every node, a rollout's per wave (the old one kept
    where the new one serves), bad versions everywhere; pulls carry the node's version;
    a split for the routing table only where the rollout sets a traffic share."""
    from agent.coordinator.catalog import ModelSLO
    from agent.coordinator.versions import build_table
    from agent.wire import Directives, Pull

    catalog = [ModelSLO("m", slo_ms=1, source="file:///m", version=2),
               ModelSLO("plain", slo_ms=1, source="file:///p"),  # newest: not pinned
               ModelSLO("local", slo_ms=1)]  # no source: never pinned
    r = start()  # m: 1 -> 2, the canary n1 switched
    table = build_table(3, catalog, [r], [{"model": "m", "version": 4}])
    assert set(table.models) == {"m"}
    pulls = (Pull(model="m", source="file:///m", version=2), Pull(model="plain",
                                                                  source="file:///p"))
    canary = table.overlay(Directives(node="n1", ttl_s=5, pull=pulls))
    other = table.overlay(Directives(node="n2", ttl_s=5, pull=pulls))
    assert [p.version for p in canary.pull] == [2, None]
    assert [p.version for p in other.pull] == [1, None]
    assert canary.model_versions["m"].to_json() == {"serve": 2, "keep": [1], "bad": [4],
                                                    "rollout": 7}
    assert other.model_versions["m"].to_json() == {"serve": 1, "keep": [], "bad": [4],
                                                   "rollout": 7}
    # a node that serves m from its own repository is pinned too; one without m is not
    assert table.overlay(Directives(node="n3", ttl_s=5), held={"m"}).model_versions[
        "m"].serve == 1
    assert table.overlay(Directives(node="n3", ttl_s=5), held={"x"}).model_versions == {}
    assert table.splits() == {}  # no traffic_share: the plan's replicas weigh
    shared = start(RolloutSettings(waves=(1, 2), bake_s=10, traffic_share=0.25))
    assert build_table(5, catalog, [shared], []).splits() == {
        "m": (frozenset(NODES), frozenset({"n1"}), 0.25)}
    done = build_table(4, catalog, [], [])
    assert done.overlay(Directives(node="n2", ttl_s=5, pull=pulls)).model_versions[
        "m"].to_json() == {"serve": 2, "keep": [], "bad": [], "rollout": None}


def test_the_routing_table_gives_the_new_version_its_share():
    """A rollout's split weighs a model's nodes: the canary carries the share (0.5 of
    the requests from 1 of 4 nodes), the others the rest by the plan's replicas (1 for
    a node the plan runs none of it on), and a node without an address is left out;
    with every node on one side the weights are the replicas."""
    import orjson

    from agent.coordinator.routing import build_table as routing_table, weigh

    addresses = {n: (f"http://{n}:8000", None) for n in ("n1", "n2", "n3", "n4")}
    workers = [("n2", {"m": 2}), ("n3", {"m": 1, "x": 1})]
    splits = {"m": (frozenset({"n1", "n2", "n3", "n4", "gone"}), frozenset({"n1"}), 0.5)}
    _, table = routing_table(workers, addresses, 60.0, splits)
    weights = orjson.loads(table)["models"]
    assert weights["x"] == {"n3": 1}
    m = weights["m"]
    assert set(m) == {"n1", "n2", "n3", "n4"}
    total = sum(m.values())
    assert m["n1"] / total == pytest.approx(0.5, abs=0.002)
    assert m["n2"] == 2 * m["n3"] == 2 * m["n4"]  # the old side by the plan's replicas
    assert weigh({"n1": 2, "n2": 1}, frozenset({"n1", "n2"}), 0.1) == {"n1": 2, "n2": 1}
    assert weigh({"n1": 1, "n2": 1}, frozenset(), 0.1) == {"n1": 1, "n2": 1}
