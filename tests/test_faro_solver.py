"""Faro solvers: value tables, brute-force optimality, shrinking, scale, COBYLA paths."""

import dataclasses

import numpy as np
import pytest

from agent.coordinator.faro.exhaustive import brute_force
from agent.coordinator.faro.objectives import OBJECTIVES, cluster_objective, objective_weights
from agent.coordinator.faro.problem import Capacity, JobSpec, Problem, ProblemError
from agent.coordinator.faro.solver import solve
from agent.coordinator.faro.tables import build_tables, model_value


def random_problem(rng, objective):
    """≤ 5 models, ≤ 20 replicas of CPU, mixed replica sizes, priorities and SLOs."""
    n = int(rng.integers(1, 6))
    models = []
    for i in range(n):
        p = float(rng.uniform(0.02, 0.3))
        models.append(JobSpec(
            f"m{i}", float(rng.uniform(0, 6.0 / p)), p, p * float(rng.uniform(0.8, 6)),
            float(rng.choice([90, 99, 99.9])), float(rng.choice([1, 1, 2, 0.5])),
            float(rng.choice([1, 1, 2])), float(rng.choice([0, 1e9, 2e9]))))
    need_c = sum(m.cpu_per_replica for m in models)
    need_m = sum(m.memory_per_replica_bytes for m in models)
    cpu = max(int(rng.integers(n, 21)), need_c)
    mem = float(rng.uniform(need_m, need_m + 20e9))
    estimator = str(rng.choice(["mdc", "mdc", "upper"]))
    return Problem(Capacity(cpu, mem), tuple(models), objective=objective, estimator=estimator)


def weights(problem):
    prios = np.array([m.priority for m in problem.models])
    return prios, objective_weights(problem.objective, len(prios), prios, problem.gamma)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("estimator", ["mdc", "upper"])
def test_tables_match_scalar_formulas(objective, estimator):
    problem = Problem(Capacity(40, 1e12), (
        JobSpec("a", 40.0, 0.15, 0.6, 99.99), JobSpec("b", 100.0, 0.18, 0.72, 99.0),
        JobSpec("c", 3.0, 0.3, 0.2, 90.0)), objective=objective, estimator=estimator)
    tables = build_tables(problem)
    for i, model in enumerate(problem.models):
        for x in range(1, int(tables.length[i]) + 3):
            value, latency, drop = model_value(model, x, problem)
            got = tables.at(np.array([x if k == i else 1 for k in range(3)]))
            assert got[0][i] == pytest.approx(value, abs=1e-12)
            if x <= tables.length[i]:  # beyond it the table repeats its last entry
                assert got[1][i] == pytest.approx(latency, rel=1e-12)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_solve_matches_brute_force_on_small_instances(objective):
    rng = np.random.default_rng(2024)
    for _ in range(20):
        problem = random_problem(rng, objective)
        best, _ = brute_force(problem)
        result = solve(problem, shrink_result=True)
        assert result.objective == pytest.approx(best, abs=1e-6)
        used = sum(result.replicas[m.name] * m.cpu_per_replica for m in problem.models)
        mem = sum(result.replicas[m.name] * m.memory_per_replica_bytes for m in problem.models)
        assert used <= problem.capacity.cpu + 1e-9
        assert mem <= problem.capacity.memory_bytes + 1e-3


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_fast_allocator_alone_reaches_brute_force_optimum(objective):
    """The heuristic, without the exhaustive candidate (seeded instances; see allocator)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        problem = random_problem(rng, objective)
        best, _ = brute_force(problem)
        result = solve(problem, method="fast")
        assert result.solver == "fast"
        assert result.objective == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("estimator, expected", [("mdc", 8), ("upper", 10)])
def test_paper_example_after_shrinking(objective, estimator, expected):
    problem = Problem(Capacity(64, 1e12), (JobSpec("a", 40.0, 0.15, 0.6, 99.99),),
                      objective=objective, estimator=estimator)
    for method in ("auto", "fast", "cobyla"):
        assert solve(problem, method).replicas == {"a": expected}


def test_shrinking_keeps_utility_one_with_fewest_replicas():
    models = tuple(JobSpec(f"m{i}", 10.0 * (i + 1), 0.1, 0.5, 99.0) for i in range(6))
    problem = Problem(Capacity(200, 1e12), models, objective="sum")
    result = solve(problem, method="fast")
    assert all(u == 1.0 for u in result.utility.values())
    for m in models:
        fewer = model_value(m, result.replicas[m.name] - 1, problem)[0]
        assert result.replicas[m.name] == 1 or fewer < 1.0


def test_oversubscribed_capacity_is_fully_used_and_respected():
    models = tuple(JobSpec(f"m{i}", 30.0, 0.18, 0.72, 99.0, cpu_per_replica=1 + i % 2,
                             memory_per_replica_bytes=1e9) for i in range(8))
    problem = Problem(Capacity(30, 25e9), models, objective="fairsum")
    result = solve(problem)
    cpu = sum(result.replicas[m.name] * m.cpu_per_replica for m in models)
    mem = sum(result.replicas[m.name] * m.memory_per_replica_bytes for m in models)
    assert cpu <= 30 and mem <= 25e9
    assert min(result.replicas.values()) >= 1


def large_problem(n, seed=0):
    rng = np.random.default_rng(seed)
    models = []
    for i in range(n):
        p = float(rng.uniform(0.05, 0.3))
        models.append(JobSpec(f"m{i}", float(rng.gamma(1.0, 3.0 / p)), p, 4 * p, 99.0,
                                float(rng.choice([1, 2])), 1.0, 1e8))
    return models


def test_thousand_models_solve_within_the_capacity():
    """How long it takes (the target: under a second) is bench/faro_solver.py's."""
    problem = Problem(Capacity(3000, 1e12), tuple(large_problem(1000)), objective="fairsum")
    result = solve(problem)
    assert sum(result.replicas.values()) <= 3000


def test_cobyla_paths_are_feasible():
    models = tuple(large_problem(30, seed=3))
    problem = Problem(Capacity(90, 1e12), models, objective="sum")
    for method in ("cobyla-hierarchical", "fast"):
        result = solve(problem, method)
        assert result.solver == method
        assert sum(result.replicas.values()) <= 90
        assert min(result.replicas.values()) >= 1
    small = Problem(Capacity(20, 1e12), models[:4], objective="fairsum")
    result = solve(small, "cobyla")
    assert sum(result.replicas.values()) <= 20
    prios, (A, G) = weights(small)
    assert result.objective == pytest.approx(
        cluster_objective("fairsum", np.array(list(result.utility.values())), prios))


def test_capacity_too_small_is_an_error():
    problem = Problem(Capacity(1, 1e12), (JobSpec("a", 1, 0.1, 0.5), JobSpec("b", 1, 0.1, 0.5)))
    with pytest.raises(ProblemError, match="too small"):
        solve(problem)


def test_penalty_objective_drops_only_when_it_pays():
    problem = Problem(Capacity(4, 1e12), (JobSpec("a", 40.0, 0.1, 0.4, 99.0),),
                      objective="penaltysum")
    result = solve(problem)
    assert 0.0 <= result.drop_rate["a"] <= 0.2
    plain = dataclasses.replace(problem, objective="sum")
    assert solve(problem).objective >= solve(plain).objective - 1e-12
