"""Faro's multi-tenant autoscaler (§4.2–4.3): solve the relaxed objective, then shrink.

``solve`` runs the candidate solvers, keeps the best integer allocation (ties go to the
earlier one in this list) and applies Stage 3:

* ``exhaustive``: enumerate every feasible vector when there are at most
  ``exhaustive_limit`` of them (tiny problems; exact).
* ``fast``: the allocator of ``allocator`` (construction + exchange), always run.
* ``cobyla``: Faro's COBYLA on all models, when there are at most ``cobyla_max_models``
  (SciPy's COBYLA needs tens of seconds at 100 variables).
* ``cobyla-hierarchical``: Faro's grouped COBYLA (G = 10), for
  ``cobyla_max_models`` < n <= ``hierarchical_max_models``; the paper finds grouping
  hurts below ~50 models, where the flat run or ``fast`` wins anyway.

``method`` picks one of them alone instead ("auto" runs all that apply).
Stage 3 sets every model whose utility is 1 to the fewest replicas that keep it at 1
(values are non-decreasing in replicas, so the cluster objective does not change).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from agent.coordinator.choices import METHODS
from agent.coordinator.faro.allocator import fast_allocate
from agent.coordinator.faro.exhaustive import enumerate_best
from agent.coordinator.faro.cobyla import cobyla_allocate, hierarchical_allocate
from agent.coordinator.faro.objectives import cluster_objective, objective_weights
from agent.coordinator.faro.problem import Problem, validate
from agent.coordinator.faro.tables import ValueTables, build_tables

_FULL = 1.0 - 1e-12


@dataclass(frozen=True)
class Allocation:
    """A solved plan: per-model replicas and their predicted latency/utility/drop rate."""

    replicas: dict[str, int]
    latency_s: dict[str, float]
    utility: dict[str, float]
    drop_rate: dict[str, float]
    objective: float
    solver: str
    solve_seconds: float
    candidates: dict[str, float] = field(default_factory=dict)


def shrink(x: np.ndarray, tables: ValueTables) -> np.ndarray:
    """Stage 3: models at utility 1 keep only the fewest replicas with utility 1."""
    x = np.asarray(x, dtype=np.int64).copy()
    values, _, _ = tables.at(x)
    for i in np.flatnonzero(values >= _FULL):
        row = tables.values[tables.offsets[i]: tables.offsets[i] + min(x[i], tables.length[i])]
        x[i] = int(np.argmax(row >= _FULL)) + 1
    return x


def _space(tables: ValueTables, limit: int) -> bool:
    size = 1
    for n in tables.length:
        size *= int(n)
        if size > limit:
            return False
    return True


def solve(
    problem: Problem,
    method: str = "auto",
    *,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    cobyla_max_models: int = 12,
    hierarchical_max_models: int = 200,
    groups: int = 10,
    exhaustive_limit: int = 200_000,
    shrink_result: bool = True,
) -> Allocation:
    """Maximise ``problem``'s relaxed objective under its CPU and memory limits."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    validate(problem)
    start = clock()
    models = problem.models
    n = len(models)
    prios = np.array([m.priority for m in models], dtype=float)
    cpu = np.array([m.cpu_per_replica for m in models], dtype=float)
    mem = np.array([m.memory_per_replica_bytes for m in models], dtype=float)
    cap_c, cap_m = float(problem.capacity.cpu), float(problem.capacity.memory_bytes)
    A, G = objective_weights(problem.objective, n, prios, problem.gamma)
    tables = build_tables(problem)
    args = (tables, prios, cpu, mem, cap_c, cap_m, A, G)

    runs: list[tuple[str, Callable[[], np.ndarray]]] = []
    auto = method == "auto"
    if method == "exhaustive" or (auto and _space(tables, exhaustive_limit)):
        runs.append(("exhaustive", lambda: enumerate_best(
            tables.values, tables.offsets, tables.length, prios, cpu, mem, cap_c, cap_m,
            float(A), float(G))))
    if method == "fast" or auto:
        runs.append(("fast", lambda: fast_allocate(*args)))
    if method == "cobyla" or (auto and n <= cobyla_max_models):
        runs.append(("cobyla", lambda: cobyla_allocate(*args)))
    if method == "cobyla-hierarchical" or (
        auto and cobyla_max_models < n <= hierarchical_max_models
    ):
        runs.append(("cobyla-hierarchical", lambda: hierarchical_allocate(
            problem, *args, groups=min(groups, n), seed=seed)))

    best_x, best_name, best_key = None, "", -np.inf
    candidates = {}
    for name, run in runs:
        x = np.asarray(run(), dtype=np.int64)
        values, _, _ = tables.at(x)
        key = A * float(np.dot(prios, values)) - G * float(values.max() - values.min())
        candidates[name] = cluster_objective(problem.objective, values, prios, problem.gamma)
        if key > best_key + 1e-12:
            best_x, best_name, best_key = x, name, key
    if shrink_result:
        best_x = shrink(best_x, tables)
    values, latency, drops = tables.at(best_x)
    objective = cluster_objective(problem.objective, values, prios, problem.gamma)
    names = [m.name for m in models]
    return Allocation(
        replicas={k: int(v) for k, v in zip(names, best_x)},
        latency_s={k: float(v) for k, v in zip(names, latency)},
        utility={k: float(v) for k, v in zip(names, values)},
        drop_rate={k: float(v) for k, v in zip(names, drops)},
        objective=float(objective),
        solver=best_name,
        solve_seconds=clock() - start,
        candidates=candidates,
    )
