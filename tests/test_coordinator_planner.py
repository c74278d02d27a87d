"""The planner: reports → faro.Problem → solve/place, the reactive loop, directives."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.faro import Capacity, JobSpec, Problem, forecast, solve
from agent.coordinator.ingest import ReportWriter
from agent.coordinator.plan import Plan, directive_rows, directives_from_row
from agent.coordinator.planner import PlanError, Planner, PlannerLoops, rate_series
from agent.coordinator.store import ReportRecord, Store
from agent.wire import DirectiveBook, Directives
from tests.helpers import Clock, feed, node_report


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


def test_a_forecast_ends_now_while_a_nodes_leases_are_held_as_when_every_one_is_written(
        tmp_path):
    """``lease_write_s`` 15: n2 only renews leases after 1060, and the writer holds them
    (its stored ``last_seen`` stays 1060); n1's full reports show hot's arrivals rising
    since. The forecast still ends at now for n2 (its stored time plus 15 s is later),
    and the planned rate is exactly the one of a store that got every lease; ended at
    the stored 1060 instead, the rise n1 reported is not seen and the rate is lower."""
    clock = Clock(1000.0)
    runs = {}
    for lease_write_s in (15.0, 0.0):
        config = CoordinatorConfig(state_dir=tmp_path / str(lease_write_s), rate_step_s=5,
                                   history_s=120, plan_window_s=30, node_timeout_s=60,
                                   lease_write_s=lease_write_s)
        config.state_dir.mkdir()
        store = Store(config.database, rate_step_s=5)
        store.put_model(ModelSLO("hot", slo_ms=200, proc_ms=20), 0)
        writer = ReportWriter(store, keep_s=120, lease_write_s=config.lease_lag_s)

        def full(node: str, t: float, rate: float) -> None:
            body = {**node_report({"hot": {"resident": True, "rate": rate}}), "report_id": 1}
            writer.submit(ReportRecord(node, body, {"hot": [(t, 5.0, rate * 5)]}, t))

        for t in np.arange(1005.0, 1061.0, 5.0):
            full("n1", t, 10.0)
            full("n2", t, 10.0)
        for t in (1065.0, 1070.0):
            full("n1", t, 40.0)  # hot's rise, on n1
            writer.renew("n2", t)
        writer.flush()
        clock.t = 1070.0
        planner = Planner(store, config, clock=clock)
        fleet = planner.read_fleet(clock.t)
        problem, _, _ = planner.build(clock.t)
        [hot] = problem.models
        runs[lease_write_s] = ({n.name: n.last_seen for n in store.nodes()},
                               fleet.held["hot"].end, hot.rate,
                               planner.planning_rate("hot", 1060.0, fleet.tails["hot"])[0])
        writer.close()
        store.close()
    (held_seen, held_end, held_rate, ended_at_1060), (seen, end, rate, _) = \
        runs[15.0], runs[0.0]
    assert held_seen == {"n1": 1070.0, "n2": 1060.0} and seen == {"n1": 1070.0, "n2": 1070.0}
    assert held_end == end == 1070.0
    assert held_rate == rate
    assert ended_at_1060 < 0.9 * rate  # what a forecast ended at the stored time plans


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


def test_reactive_hears_a_node_whose_leases_are_held_as_one_whose_leases_are_written(
        tmp_path):
    """``lease_write_s`` 15: n1's full report shows hot's p99 five times its SLO, then n1
    only renews leases every 5 s; the writer stores one in three. Each 10 s check still
    counts n1 heard from, as it would with every lease written: the third adds a
    replica (by stored times alone, the 10 s one sees nothing new). Once n1 is silent,
    its last word counts until its stored time plus 15 s, then no more."""
    clock = Clock(1000.0)
    config = CoordinatorConfig(state_dir=tmp_path, rate_step_s=5, history_s=120,
                               plan_window_s=30, node_timeout_s=60, reactive_patience=3)
    store = Store(config.database, rate_step_s=5)
    planner = Planner(store, config, clock=clock)
    writer = ReportWriter(store, keep_s=120, lease_write_s=config.lease_lag_s)
    store.put_model(ModelSLO("a", slo_ms=100), 0)
    model = {"batches": {"1": {"count": 100, "seconds": 1.0}}, "rate": 10.0}
    feed(store, clock, "n1", {"a": 10.0}, {"a": model})
    start = planner.plan_now().plan["models"]["a"]["replicas"]
    slow = {**node_report({"a": {**model, "latency_ms": {"p99": 500.0}}}), "report_id": 1}
    writer.submit(ReportRecord("n1", slow, {"a": [(clock.t, 5.0, 50.0)]}, clock.t))
    writer.flush()
    t0, seen, leased = clock.t, [], [clock.t]

    def check(at: float, leases_until: float) -> tuple[int, int]:
        """Leases every 5 s up to ``leases_until``, then a check at ``at``: (replicas,
        violations in a row)."""
        while leased[-1] + 5.0 <= min(at, leases_until):
            leased.append(leased[-1] + 5.0)
            writer.renew("n1", leased[-1])
        writer.flush()
        clock.t = at
        seen.append(store.node("n1").last_seen)
        planner.reactive_tick()
        state = planner.reactive["a"]
        return state.replicas, state.violations

    assert check(t0 + 1, math.inf) == (start, 1)
    assert check(t0 + 11, math.inf) == (start, 2)  # its last lease, t0 + 10, held
    assert check(t0 + 21, math.inf) == (start + 1, 0)
    assert store.current_plan().plan["models"]["a"]["replicas"] == start + 1
    assert seen == [t0, t0, t0 + 15]
    assert check(t0 + 31, t0 + 25) == (start + 1, 1)  # its last lease t0 + 25: held
    assert check(t0 + 41, t0 + 25) == (start + 1, 1)  # past t0 + 15 + 15: no more
    assert seen[-2:] == [t0 + 15, t0 + 15]
    writer.close()
    store.close()


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
