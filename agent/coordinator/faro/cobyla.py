"""Faro's own solver (§3.4, §4.2, §5): COBYLA on the relaxed objective, then integers.

Decisions where the paper is vague:

* Continuous replicas: the objective at a fractional x interpolates each model's value
  table linearly between neighbouring integers (Erlang C has no integer-free form).
* Start point: every model at 1 replica plus an equal share of the spare capacity,
  capped at what it can use; ``rhobeg`` = 2 ("initial variable change of 2"), 1,000
  iterations.
* Integer post-processing: round down (≥ 1), drop replicas that lose least while the
  rounded point still breaks a limit (COBYLA may end slightly infeasible), then fill the
  remaining capacity with the ratio greedy of ``allocator``.
* Hierarchical optimisation (§3.4): models are dealt at random (seeded) into G groups;
  a group is one M/D/c queue with λ = Σλ, p = mean p, SLO = mean SLO, percentile = the
  strictest, priority = Σπ and per-replica resources = mean resources. A group's
  integer replicas are split among its members in proportion to their offered load
  λp (each at least 1, largest remainders first); the result is repaired and filled as
  above.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from agent.coordinator.faro.allocator import ratio_greedy
from agent.coordinator.faro.problem import Capacity, JobSpec, Problem
from agent.coordinator.faro.tables import ValueTables, build_tables


def _interpolated(tables: ValueTables, x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 1.0, tables.length.astype(float))
    lo = np.floor(x).astype(np.int64)
    hi = np.minimum(lo + 1, tables.length)
    frac = x - lo
    v_lo = tables.values[tables.offsets + lo - 1]
    v_hi = tables.values[tables.offsets + hi - 1]
    return v_lo + frac * (v_hi - v_lo)


def _search_value(v, prios, A, G):
    return A * float(np.dot(prios, v)) - G * float(v.max() - v.min())


def cobyla_continuous(tables, prios, cpu, mem, cap_cpu, cap_mem, A, G, maxiter=1000,
                      lower=None):
    """COBYLA's continuous replica vector for the interpolated relaxed objective."""
    n = len(prios)
    lower = np.ones(n) if lower is None else np.asarray(lower, dtype=float)
    # + 0.5 keeps every variable free: SciPy's COBYLA drops fixed variables and then
    # calls the constraints with a shorter vector. The objective clips to the table.
    upper = np.maximum(tables.length.astype(float), lower) + 0.5
    spare = max(cap_cpu - float(np.dot(cpu, lower)), 0.0) / max(float(np.sum(cpu)), 1e-12)
    x0 = np.minimum(lower + spare, upper)
    constraints = [{"type": "ineq", "fun": lambda x: cap_cpu - float(np.dot(cpu, x))}]
    if np.any(mem > 0):
        constraints.append({"type": "ineq", "fun": lambda x: cap_mem - float(np.dot(mem, x))})
    bounds = list(zip(lower, upper))
    result = minimize(
        lambda x: -_search_value(_interpolated(tables, x), prios, A, G),
        x0, method="COBYLA", constraints=constraints, bounds=bounds,
        options={"rhobeg": 2.0, "maxiter": maxiter},
    )
    return np.asarray(result.x, dtype=float)


def integerise(x_cont, tables, prios, cpu, mem, cap_cpu, cap_mem, A, G):
    """Round down, repair any broken limit, then fill spare capacity greedily."""
    x = np.clip(np.floor(x_cont + 1e-9), 1, tables.length).astype(np.int64)
    tol_c = 1e-9 * max(1.0, cap_cpu)
    tol_m = 1e-9 * max(1.0, cap_mem)
    while float(np.dot(cpu, x)) > cap_cpu + tol_c or float(np.dot(mem, x)) > cap_mem + tol_m:
        base = _search_value(tables.at(x)[0], prios, A, G)
        best, best_i = np.inf, -1
        for i in np.flatnonzero(x > 1):
            x[i] -= 1
            loss = base - _search_value(tables.at(x)[0], prios, A, G)
            x[i] += 1
            if loss < best:
                best, best_i = loss, i
        if best_i < 0:
            break
        x[best_i] -= 1
    cost = np.maximum(np.maximum(cpu / cap_cpu, mem / max(cap_mem, 1e-300)), 1e-12)
    ratio_greedy(x, tables.values, tables.offsets, tables.length, prios, cpu, mem,
                 float(cap_cpu), float(cap_mem), float(A), float(G), cost)
    return x


def cobyla_allocate(tables, prios, cpu, mem, cap_cpu, cap_mem, A, G, maxiter=1000):
    """Faro's flat solver: COBYLA over every model, then integer post-processing."""
    prios, cpu, mem = (np.asarray(a, dtype=float) for a in (prios, cpu, mem))
    x_cont = cobyla_continuous(tables, prios, cpu, mem, cap_cpu, cap_mem, A, G, maxiter)
    return integerise(x_cont, tables, prios, cpu, mem, cap_cpu, cap_mem, A, G)


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` (>= len(weights)) as integers >= 1, proportional to ``weights``."""
    k = len(weights)
    extra = total - k
    w = weights / weights.sum() if weights.sum() > 0 else np.full(k, 1.0 / k)
    share = w * extra
    out = np.floor(share).astype(np.int64)
    order = np.argsort(-(share - out), kind="stable")
    out[order[: extra - int(out.sum())]] += 1
    return out + 1


def hierarchical_allocate(problem: Problem, tables, prios, cpu, mem, cap_cpu, cap_mem, A, G, groups=10,
                          seed=0, maxiter=1000):
    """Faro's hierarchical solver: COBYLA over G random groups, then split and repair."""
    models = problem.models
    n = len(models)
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(n) % groups)
    members = [np.flatnonzero(label == g) for g in range(groups) if np.any(label == g)]
    group_models = []
    for g, idx in enumerate(members):
        ms = [models[i] for i in idx]
        group_models.append(JobSpec(
            name=f"group{g}",
            rate=sum(m.rate for m in ms),
            proc_s=float(np.mean([m.proc_s for m in ms])),
            slo_s=float(np.mean([m.slo_s for m in ms])),
            percentile=max(m.percentile for m in ms),
            priority=sum(m.priority for m in ms),
            cpu_per_replica=float(np.mean([m.cpu_per_replica for m in ms])),
            memory_per_replica_bytes=float(np.mean([m.memory_per_replica_bytes for m in ms])),
        ))
    gcpu = np.array([m.cpu_per_replica for m in group_models])
    gmem = np.array([m.memory_per_replica_bytes for m in group_models])
    sizes = np.array([len(idx) for idx in members])
    cap = problem.capacity
    gproblem = Problem(Capacity(cap.cpu, cap.memory_bytes), tuple(group_models),
                       problem.objective, problem.estimator, problem.alpha, problem.gamma,
                       problem.rho_max)
    # a group must keep one replica per member: give its table that floor
    gtables = build_tables(gproblem, max_replicas=_group_caps(gcpu, gmem, sizes, cap))
    gprios = np.array([m.priority for m in group_models])
    x_cont = cobyla_continuous(gtables, gprios, gcpu, gmem, cap.cpu, cap.memory_bytes, A, G,
                               maxiter, lower=sizes)
    x_group = np.maximum(np.floor(x_cont + 1e-9).astype(np.int64), sizes)
    x = np.ones(n, dtype=np.int64)
    for idx, total in zip(members, x_group):
        load = np.array([models[i].rate * models[i].proc_s for i in idx])
        x[idx] = _split(int(total), load)
    x = np.minimum(x, tables.length)
    return integerise(x.astype(float), tables, prios, cpu, mem, cap.cpu, cap.memory_bytes, A, G)


def _group_caps(gcpu, gmem, sizes, cap: Capacity) -> np.ndarray:
    spare_c = cap.cpu - float(np.dot(gcpu, sizes))
    out = sizes + np.floor(np.maximum(spare_c, 0) / gcpu + 1e-9)
    if np.any(gmem > 0):
        spare_m = cap.memory_bytes - float(np.dot(gmem, sizes))
        by_m = np.where(gmem > 0, sizes + np.floor(np.maximum(spare_m, 0) / np.where(gmem > 0, gmem, 1) + 1e-9), np.inf)
        out = np.minimum(out, by_m)
    return np.maximum(out, 1).astype(np.int64)
