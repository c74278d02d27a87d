"""The planner: reports → faro.Problem → solve/place, the reactive loop, directives."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.faro import Capacity, JobSpec, Problem, forecast, solve
from agent.coordinator.plan import Plan, directive_rows, directives_from_row
from agent.coordinator.planner import PlanError, PlannerLoops, rate_series
from agent.wire import DirectiveBook, Directives
from tests.helpers import feed, node_report


def test_rate_series_spreads_intervals_over_bins():
    # 10 requests over (0, 10] with 5 s bins: 1/s in both; a later gap stays 0
    series = rate_series([(10.0, 10.0, 10.0), (30.0, 5.0, 20.0)], end=30.0, step=5.0, span=60)
    assert series.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 4.0]  # leading empty bins dropped
    # two nodes in the same bin add up; an interval straddling bins is split by overlap
    series = rate_series([(5.0, 5.0, 10.0), (5.0, 5.0, 20.0), (12.5, 5.0, 10.0)],
                         end=15.0, step=5.0, span=15)
    assert series.tolist() == pytest.approx([6.0, 1.0, 1.0])
    assert rate_series([], end=10, step=5, span=10).size == 0


def test_plan_matches_solve_on_the_same_problem(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(ModelSLO("a", slo_ms=120, percentile=99), 0)
    store.put_model(ModelSLO("b", slo_ms=400, priority=2, proc_ms=30), 0)
    store.put_model(ModelSLO("c", slo_ms=100), 0)  # on no node: not planned
    a = {"resident": True, "size_bytes": 1e6,
         "batches": {"1": {"count": 800, "seconds": 32.0}, "4": {"count": 50, "seconds": 4.0}}}
    feed(store, clock, "n1", {"a": 30.0, "b": 4.0}, {"a": a, "b": {}},
         also=[("n2", {"a": 30.0}, {"a": a})])
    clock.t += 1
    problem, details, live = planner.build(clock.t)
    assert set(live) == {"n1", "n2"}
    assert problem.capacity == Capacity(cpu=8, memory_bytes=2e9)
    specs = {m.name: m for m in problem.models}
    assert set(specs) == {"a", "b"}
    # p = busy seconds / requests over both nodes: (32 + 4) / (800 + 200)
    assert specs["a"].proc_s == pytest.approx(0.036) and details["a"]["proc_source"] == "measured"
    assert specs["b"].proc_s == pytest.approx(0.030) and details["b"]["proc_source"] == "catalog"
    # both nodes' arrivals overlap: the planner's history sums them, 60 req/s steady
    history = rate_series([(t, 5.0, 300.0) for t in np.arange(1005, 1061, 5)], end=1060,
                          step=5, span=120)
    expected = forecast(history, 6, n_samples=200, seed=0).window_quantile(0.9)
    assert specs["a"].rate == pytest.approx(expected) and 55 < specs["a"].rate < 65
    by_hand = Problem(capacity=Capacity(8, 2e9), objective="fairsum", estimator="mdc",
                      models=(JobSpec("a", specs["a"].rate, 0.036, 0.12, 99.0),
                              JobSpec("b", specs["b"].rate, 0.030, 0.4, 99.0, 2.0)))
    stored = planner.plan_now("long-term")
    allocation = solve(by_hand)
    assert {m: v["replicas"] for m, v in stored.plan["models"].items()} == allocation.replicas
    assert stored.plan["models"]["a"]["utility"] == pytest.approx(allocation.utility["a"])
    assert stored.plan["models"]["a"]["predicted_latency_ms"] == \
        pytest.approx(allocation.latency_s["a"] * 1000)
    # placement: b only where its repository is; every replica placed within cores
    assignment = stored.plan["assignment"]
    assert "b" not in assignment.get("n2", {})
    assert sum(row.get("a", 0) for row in assignment.values()) == allocation.replicas["a"]
    assert all(sum(row.values()) <= 4 for row in assignment.values())
    assert stored.plan["models"]["a"]["unplaced"] == 0


def test_placement_is_stable_across_plans(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(ModelSLO("a", slo_ms=200), 0)
    feed(store, clock, "n1", {"a": 20.0}, {"a": {"resident": True}},
         also=[("n2", {"a": 20.0}, {"a": {}})])
    first = planner.plan_now().plan["assignment"]
    clock.t += 1
    second = planner.plan_now()
    assert second.plan["assignment"] == first and second.plan["moves"]["started"] == 0


def test_plan_errors(planner_setup):
    store, planner, clock = planner_setup
    with pytest.raises(PlanError, match="no live nodes"):
        planner.plan_now()
    feed(store, clock, "n1", {}, {"a": {}}, steps=1)
    with pytest.raises(PlanError, match="no catalogued model"):
        planner.plan_now()
    store.put_model(ModelSLO("a", slo_ms=100, cpu_per_replica=8), 0)
    with pytest.raises(PlanError, match="capacity too small"):
        planner.plan_now()
    clock.t += 31  # the node timed out
    with pytest.raises(PlanError, match="no live nodes"):
        planner.plan_now()
    assert planner.last_error and store.current_plan() is None


def test_reactive_adds_after_three_violations_and_never_scales_down(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(ModelSLO("a", slo_ms=100), 0)
    store.put_model(ModelSLO("b", slo_ms=100), 0)
    fast = {"a": {"batches": {"1": {"count": 100, "seconds": 1.0}}}, "b": {}}
    feed(store, clock, "n1", {"a": 10.0}, fast, cores=4)
    base = planner.plan_now().plan
    start = base["models"]["a"]["replicas"]

    def tick(latency_ms, models=("a",), fresh=True):
        clock.t += 10
        if fresh:
            store.record_report("n1", node_report({m: {"latency_ms": {"p99": latency_ms},
                                                  "batches": fast["a"]["batches"]}
                                              for m in ("a", "b") if m in models}
                                             | {m: {} for m in ("a", "b") if m not in models}),
                                {}, clock.t, keep_s=120)
        return planner.reactive_tick()

    assert tick(500) is None and tick(500) is None
    assert tick(50) is None  # back under the SLO: the count restarts
    assert tick(500) is None and tick(500) is None
    assert tick(500, fresh=False) is None  # no new report: no new evidence
    grown = tick(500)
    assert grown is not None and grown.kind == "reactive"
    assert grown.plan["models"]["a"]["replicas"] == start + 1
    assert grown.plan["models"]["b"]["replicas"] == base["models"]["b"]["replicas"]
    assert sum(grown.plan["assignment"]["n1"].values()) == start + 1 + 1
    assert grown.plan["models"]["a"]["predicted_latency_ms"] <= \
        base["models"]["a"]["predicted_latency_ms"]
    for _ in range(6):  # good latency never scales down
        assert tick(1) is None
    assert store.current_plan().plan["models"]["a"]["replicas"] == start + 1
    while sum(store.current_plan().plan["assignment"]["n1"].values()) < 4:
        for _ in range(3):
            tick(500)
    for _ in range(6):  # no free core left: violations change nothing
        assert tick(500) is None
    assert store.current_plan().plan["models"]["a"]["replicas"] == 3
    # the long-term plan owns the count again
    assert planner.plan_now().plan["models"]["a"]["replicas"] == start


async def test_loops_plan_as_soon_as_possible_and_on_schedule(planner_setup):
    store, planner, clock = planner_setup
    planner.config = CoordinatorConfig(state_dir=planner.config.state_dir,
                                       plan_interval_s=0.2, reactive_interval_s=0.05)
    loops = PlannerLoops(planner)
    loops.start()
    try:
        await asyncio.sleep(0.15)
        assert store.current_plan() is None  # nothing to plan yet; loops keep going
        store.put_model(ModelSLO("a", slo_ms=100), 0)
        feed(store, clock, "n1", {"a": 5.0}, {"a": {}}, steps=2)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if store.current_plan() is not None:
                break
        first = store.current_plan()
        assert first is not None and first.kind == "long-term"
        for _ in range(100):
            await asyncio.sleep(0.02)
            if store.current_plan().id > first.id:
                break
        assert store.current_plan().id > first.id
        replanned = await loops.replan()
        assert replanned.kind == "manual"
    finally:
        await loops.stop()
    assert all(t.done() for t in loops.tasks) or loops.tasks == []


def test_directives_from_a_plans_rows():
    plan = {"assignment": {"n1": {"a": 2, "b": 1, "c": 0}, "n2": {"a": 1}},
            "models": {"a": {"drop_rate": 0.0}, "b": {"drop_rate": 0.05}}}
    rows = directive_rows(plan)
    assert set(rows) == {"n1", "n2"} and all(isinstance(r, bytes) for r in rows.values())
    d = directives_from_row(rows["n1"], "n1", resident={"a"}, ttl_s=30, plan_id=4)
    assert d == Directives(node="n1", ttl_s=30, plan_id=4, workers={"a": 2, "b": 1},
                           pin=("a", "b"), prefetch=("b",), drop_rate={"b": 0.05})
    assert Directives.from_json(d.to_json()) == d
    typed = Plan.from_json(plan)  # the typed plan's JSON form has the same rows
    assert directive_rows(typed.to_json()) == rows
    assert directives_from_row(rows.get("n9"), "n9", set(), 30) == Directives(node="n9", ttl_s=30)


@pytest.mark.parametrize("doc, words", [
    ([], "JSON object"), ({"ttl_s": 0}, "ttl_s"), ({"ttl_s": 5, "workers": {"a": -1}}, "workers"),
    ({"ttl_s": 5, "pin": "a"}, "pin"), ({"ttl_s": 5, "drop_rate": {"a": 2}}, "drop_rate"),
])
def test_directives_from_bad_json(doc, words):
    with pytest.raises(ValueError, match=words):
        Directives.from_json(doc)


def test_directives_expire():
    book = DirectiveBook()
    d = Directives(node="n1", ttl_s=10, workers={"a": 1})
    book.issue(d, now=100)
    assert book.current("n1", 105) == d and book.expires_at("n1") == 110
    assert book.current("n1", 110) is None and book.current("n2", 100) is None
    book.issue(Directives(node="n1", ttl_s=10), now=109)  # renewed in time
    assert book.current("n1", 115) is not None
    assert book.expire("n1") is not None and book.current("n1", 115) is None
