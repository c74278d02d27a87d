"""Planning isolates a model whose inputs still make planning fail (issue 13): it is left
out of that plan, with the reason under ``excluded`` in the plan JSON (``/v1/plan``), and
the rest of the fleet is planned. Faults are injected into one model's stored inputs,
past the report ingestion's range checks (which would refuse them over HTTP)."""

from __future__ import annotations

import pytest

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.faro import solver as faro_solver
from agent.coordinator.planner import PlanError, check_spec
from agent.coordinator.faro import JobSpec, ProblemError
from tests.helpers import feed, node_report


def _fleet(store, clock):
    store.put_model(ModelSLO("a", slo_ms=200), 0)
    store.put_model(ModelSLO("b", slo_ms=300), 0)
    store.put_model(ModelSLO("bad", slo_ms=200), 0)
    feed(store, clock, "n1", {"a": 20.0, "b": 5.0, "bad": 1.0},
         {"a": {"resident": True}, "b": {}, "bad": {}})


def test_arrivals_of_1e308_leave_that_model_out(planner_setup):
    store, planner, clock = planner_setup
    _fleet(store, clock)
    # a poisoned arrival count straight into the store (HTTP would refuse it: 400)
    store.record_report("n1", node_report({"a": {}, "b": {}, "bad": {}}),
                        {"bad": [(clock.t, 5.0, 1e308)], "a": [(clock.t, 5.0, 100.0)]},
                        clock.t, keep_s=120)
    clock.t += 1
    stored = planner.plan_now()
    plan = stored.plan
    assert set(plan["models"]) == {"a", "b"}
    assert plan["models"]["a"]["replicas"] >= 1 and plan["models"]["b"]["replicas"] >= 1
    [excluded] = plan["excluded"]
    assert excluded["model"] == "bad" and "rate" in excluded["reason"], excluded
    # directives still go out for the planned models
    assert sum(row.get("a", 0) for row in plan["assignment"].values()) >= 1


def test_a_model_the_solver_cannot_take_is_left_out(planner_setup, monkeypatch):
    store, planner, clock = planner_setup
    _fleet(store, clock)
    clock.t += 1
    real = faro_solver.solve

    def fragile(problem, *args, **kwargs):  # the solver fails on any problem with "bad"
        if any(m.name == "bad" for m in problem.models):
            raise ArithmeticError("overflow in the latency estimator")
        return real(problem, *args, **kwargs)

    monkeypatch.setattr("agent.coordinator.planner.solve", fragile)
    plan = planner.plan_now().plan
    assert set(plan["models"]) == {"a", "b"}
    assert plan["excluded"] == [{"model": "bad", "reason":
                                 "ArithmeticError: overflow in the latency estimator"}]
    assert planner.last_error is None


def test_a_failure_of_the_whole_fleet_is_still_a_plan_error(planner_setup, monkeypatch):
    store, planner, clock = planner_setup
    _fleet(store, clock)
    clock.t += 1
    real = faro_solver.solve

    def together(problem, *args, **kwargs):  # fine alone, infeasible together
        if len(problem.models) > 1:
            raise ProblemError("not enough cores for every model's minimum")
        return real(problem, *args, **kwargs)

    monkeypatch.setattr("agent.coordinator.planner.solve", together)
    with pytest.raises(PlanError, match="not enough cores"):
        planner.plan_now()


def test_every_model_left_out_is_a_plan_error_naming_them(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(ModelSLO("bad", slo_ms=200), 0)
    feed(store, clock, "n1", {"bad": 1.0}, {"bad": {}})
    store.record_report("n1", node_report({"bad": {}}), {"bad": [(clock.t, 5.0, 1e308)]},
                        clock.t, keep_s=120)
    clock.t += 1
    with pytest.raises(PlanError, match="every model was left out of the plan: bad: "):
        planner.plan_now()


@pytest.mark.parametrize("field, value", [("rate", float("inf")), ("rate", -1.0),
                                          ("proc_s", float("nan")), ("proc_s", 0.0),
                                          ("slo_s", 0.0), ("cpu_per_replica", float("inf"))])
def test_check_spec_names_the_field(field, value):
    good = dict(name="m", rate=1.0, proc_s=0.01, slo_s=0.1, percentile=99.0)
    check_spec(JobSpec(**good))
    with pytest.raises(ValueError, match=field):
        check_spec(JobSpec(**{**good, field: value}))
