"""Brute-force references: enumerate every replica vector of a small problem.

``brute_force`` scores allocations with the scalar formulas (``tables.model_value``),
not with the solvers' tables, so it checks them independently; ``enumerate_best`` is the
solver's exact mode over its value tables (``solver``'s ``exhaustive`` run). Exponential:
tiny problems only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from agent.coordinator.faro.allocator import MIN_GAIN
from agent.coordinator.faro.objectives import cluster_objective
from agent.coordinator.faro.problem import Problem, validate
from agent.coordinator.faro.tables import model_value


def brute_force(problem: Problem, max_replicas: int = 64) -> tuple[float, tuple[int, ...]]:
    """``(best objective, replicas)`` over all feasible vectors; each x_i <= max_replicas."""
    validate(problem)
    models = problem.models
    cap = problem.capacity
    cpu = [m.cpu_per_replica for m in models]
    mem = [m.memory_per_replica_bytes for m in models]
    tol_c = 1e-9 * max(1.0, cap.cpu)
    tol_m = 1e-9 * max(1.0, cap.memory_bytes)
    rest_cpu = [sum(cpu[k:]) for k in range(len(models) + 1)]
    rest_mem = [sum(mem[k:]) for k in range(len(models) + 1)]
    columns = []
    for i, m in enumerate(models):
        top = int(min(max_replicas, (cap.cpu - rest_cpu[0] + tol_c) // cpu[i] + 1))
        if mem[i] > 0:
            top = int(min(top, (cap.memory_bytes - rest_mem[0] + tol_m) // mem[i] + 1))
        columns.append([model_value(m, x, problem)[0] for x in range(1, top + 1)])
    prios = np.array([m.priority for m in models])
    best = (-np.inf, ())
    x = [0] * len(models)

    def walk(k: int, used_c: float, used_m: float) -> None:
        nonlocal best
        if k == len(models):
            vals = np.array([columns[i][x[i] - 1] for i in range(len(models))])
            obj = cluster_objective(problem.objective, vals, prios, problem.gamma)
            if obj > best[0]:
                best = (obj, tuple(x))
            return
        for r in range(1, len(columns[k]) + 1):
            c = used_c + cpu[k] * r
            mm = used_m + mem[k] * r
            if c + rest_cpu[k + 1] > cap.cpu + tol_c or mm + rest_mem[k + 1] > cap.memory_bytes + tol_m:
                break
            x[k] = r
            walk(k + 1, c, mm)

    walk(0, 0.0, 0.0)
    return best


@njit(cache=True)
def enumerate_best(values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G):
    """Exact optimum by enumerating every feasible vector (for tiny problems only)."""
    n = length.shape[0]
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    rest_c = np.zeros(n + 1)
    rest_m = np.zeros(n + 1)
    for i in range(n - 1, -1, -1):
        rest_c[i] = rest_c[i + 1] + cpu[i]
        rest_m[i] = rest_m[i + 1] + mem[i]
    x = np.ones(n, np.int64)
    best_x = x.copy()
    best = -np.inf
    v = np.empty(n)
    while True:
        for i in range(n):
            v[i] = values[offsets[i] + x[i] - 1]
        obj = A * np.dot(prios, v) - G * (v.max() - v.min())
        if obj > best + MIN_GAIN:
            best = obj
            best_x[:] = x
        k = n - 1
        while k >= 0:
            x[k] += 1
            if x[k] <= length[k]:
                used_c = rest_c[k + 1]
                used_m = rest_m[k + 1]
                for i in range(k + 1):
                    used_c += cpu[i] * x[i]
                    used_m += mem[i] * x[i]
                if used_c <= cap_c + tol_c and used_m <= cap_m + tol_m:
                    break
            x[k] = 1
            k -= 1
        if k < 0:
            break
    return best_x
