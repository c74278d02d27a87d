"""Per-model value tables: utility (or effective utility) for 1, 2, ... replicas.

The solvers work on these tables rather than on formulas. Row i holds ``V_i(x)`` (relaxed utility, capped by the stable fraction of
the load, see ``latency``; times the penalty multiplier for the penalty objectives) for
``x = 1 .. length[i]``; ``V_i`` is non-decreasing and constant beyond ``length[i]``
(the model reached utility 1, or its latency reached the processing time, or its
replicas hit what the capacity could ever give it), so no solver looks further.
``model_value`` computes one entry from the scalar formulas; tests use it to check the
tables and the brute-force reference uses it instead of the tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from agent.coordinator.faro.latency import (
    UPPER_BOUND_WINDOW_S,
    _mdc_from_c,
    erlang_b,
    erlang_c_from_b,
    estimate_latency,
    stable_fraction,
)
from agent.coordinator.faro.objectives import (
    DROP_GRID,
    relaxed_penalty_multiplier,
    uses_penalty,
)
from agent.coordinator.faro.problem import Problem
from agent.coordinator.faro.utility import relaxed_utility


@dataclass(frozen=True)
class ValueTables:
    """Flat tables: model i's ``V(x)`` is ``values[offsets[i] + min(x, length[i]) - 1]``."""

    values: np.ndarray
    latency_s: np.ndarray
    drop_rate: np.ndarray
    offsets: np.ndarray
    length: np.ndarray

    def at(self, replicas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Value, latency and drop rate of every model at ``replicas``."""
        x = np.minimum(np.asarray(replicas, dtype=np.int64), self.length)
        idx = self.offsets + x - 1
        return self.values[idx], self.latency_s[idx], self.drop_rate[idx]


def model_value(model, replicas: int, problem: Problem) -> tuple[float, float, float]:
    """``(V, latency_s, drop_rate)`` of one model at ``replicas``, from the scalar formulas."""
    drops = DROP_GRID if uses_penalty(problem.objective) else np.zeros(1)
    best = (-1.0, math.inf, 0.0)
    for d in drops:
        latency = estimate_latency(
            model.percentile, model.proc_s, model.rate * (1.0 - d), replicas,
            problem.estimator, problem.rho_max,
        )
        utility = min(
            relaxed_utility(latency, model.slo_s, problem.alpha),
            stable_fraction(model.proc_s, model.rate * (1.0 - d), replicas, problem.rho_max),
        )
        value = relaxed_penalty_multiplier(d) * utility
        if value > best[0]:
            best = (float(value), float(latency), float(d))
    return best


@njit(cache=True)
def _stable_load_erlang_b(xmax, rho_max):
    """``B(x, ρ_max x)`` for x = 0..xmax: the Erlang B of every relaxed (unstable) point."""
    out = np.zeros(xmax + 1)
    for x in range(1, xmax + 1):
        out[x] = erlang_b(x, rho_max * x)
    return out


@njit(cache=True)
def _build(rate, proc, slo, pct, cap, drops, phi, upper, alpha, rho_max, window, bu,
           values, lat_out, drop_out, offsets, length):
    n = rate.shape[0]
    nd = drops.shape[0]
    b_run = np.empty(nd)
    pos = 0
    for i in range(n):
        offsets[i] = pos
        for k in range(nd):
            b_run[k] = 1.0
        p = proc[i]
        for x in range(1, cap[i] + 1):
            best_v = -1.0
            best_l = 0.0
            best_d = 0.0
            flat = False
            for k in range(nd):
                r = rate[i] * (1.0 - drops[k])
                load = r * p
                b_run[k] = load * b_run[k] / (x + load * b_run[k])
                if upper:
                    lat = max(p, p * r * window / x)
                elif load <= rho_max * x:
                    lat = _mdc_from_c(pct[i], p, r, x, erlang_c_from_b(x, load, b_run[k]))
                else:
                    stable = rho_max * x / p
                    c = erlang_c_from_b(x, rho_max * x, bu[x])
                    lat = r / stable * _mdc_from_c(pct[i], p, stable, x, c)
                u = min(relaxed_utility(lat, slo[i], alpha), stable_fraction(p, r, x, rho_max))
                v = phi[k] * u
                if v > best_v:
                    best_v = v
                    best_l = lat
                    best_d = drops[k]
                if k == 0 and (lat <= p or v >= 1.0):
                    flat = True
            values[pos] = best_v
            lat_out[pos] = best_l
            drop_out[pos] = best_d
            pos += 1
            if flat:
                break
        length[i] = pos - offsets[i]
    return pos


def build_tables(problem: Problem, max_replicas: np.ndarray | None = None) -> ValueTables:
    """Tables for every model of ``problem`` up to what the capacity could give each."""
    models = problem.models
    n = len(models)
    cpu = np.array([m.cpu_per_replica for m in models])
    mem = np.array([m.memory_per_replica_bytes for m in models])
    if max_replicas is None:
        max_replicas = affordable_replicas(cpu, mem, problem.capacity.cpu,
                                           problem.capacity.memory_bytes)
    cap = np.maximum(np.asarray(max_replicas, dtype=np.int64), 1)
    rate = np.array([m.rate for m in models], dtype=float)
    proc = np.array([m.proc_s for m in models], dtype=float)
    slo = np.array([m.slo_s for m in models], dtype=float)
    pct = np.array([m.percentile for m in models], dtype=float)
    drops = DROP_GRID if uses_penalty(problem.objective) else np.zeros(1)
    phi = np.array([relaxed_penalty_multiplier(d) for d in drops])
    upper = problem.estimator == "upper"
    unstable_top = np.ceil(rate * proc / problem.rho_max).astype(np.int64) + 1
    xmax = int(min(np.max(np.minimum(unstable_top, cap)), np.max(cap))) if n else 1
    bu = _stable_load_erlang_b(max(xmax, 1), problem.rho_max) if not upper else np.zeros(2)
    if not upper and xmax < int(np.max(cap)):
        bu = np.concatenate([bu, np.zeros(int(np.max(cap)) - xmax)])
    total = int(np.sum(cap))
    values = np.empty(total)
    lat = np.empty(total)
    drop = np.empty(total)
    offsets = np.zeros(n, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    used = _build(rate, proc, slo, pct, cap, drops, phi, upper, float(problem.alpha),
                  float(problem.rho_max), UPPER_BOUND_WINDOW_S, bu,
                  values, lat, drop, offsets, length)
    return ValueTables(values[:used].copy(), lat[:used].copy(), drop[:used].copy(),
                       offsets, length)


def affordable_replicas(cpu: np.ndarray, mem: np.ndarray, cap_cpu: float,
                        cap_mem: float) -> np.ndarray:
    """The most replicas each model could get if every other model kept just one."""
    spare_cpu = cap_cpu - cpu.sum()
    spare_mem = cap_mem - mem.sum()
    by_cpu = np.floor(spare_cpu / cpu + 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_mem = np.where(mem > 0, np.floor(spare_mem / np.where(mem > 0, mem, 1) + 1e-9), np.inf)
    extra = np.maximum(np.minimum(by_cpu, by_mem), 0)
    return (1 + np.minimum(extra, 10**7)).astype(np.int64)
