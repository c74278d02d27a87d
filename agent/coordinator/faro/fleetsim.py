"""Trace-driven fleet simulator matched to Faro §6.4 (Ray Serve over Kubernetes).

Each model is a FIFO queue served by its replicas, each taking exactly ``proc_s`` per
request (M/D/c). Arrivals are Poisson within each minute at the trace's per-minute
rate. A router tail-drops a request when ``queue_limit`` (50, §5) requests already
wait, and drops a further ``drop_rate`` share at random when a policy asks for it
(Faro's penalty variants). New replicas serve only after ``cold_start_s``; removed
replicas stop taking requests at once (cold ones first). Every ``tick_s`` the policy
sees the last tick's tail latency and arrival rate and returns replica counts; the
cluster grants increases in a random (seeded) order until ``total_replicas`` is
reached, as a resource quota would.

Metrics (§6): a request violates its SLO when dropped or slower than the SLO; a model's
violation rate is violations / requests, the cluster's is the mean over models. Every
minute each model's p99 latency (drops count as ∞) gives its relaxed utility; lost
utility = models − Σ utility, averaged over the minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numba import njit

from agent.coordinator.faro.utility import relaxed_utility


@dataclass(frozen=True)
class FleetConfig:
    """The simulated cluster: per-model processing time and SLO, size, timings."""

    proc_s: tuple[float, ...]
    slo_s: tuple[float, ...]
    total_replicas: int
    percentile: float = 99.0
    cold_start_s: float = 60.0
    queue_limit: int = 50
    tick_s: float = 10.0
    seed: int = 0


@dataclass(frozen=True)
class Observation:
    """What a policy sees at a tick."""

    now: float
    latency_s: np.ndarray  # last tick's p-th percentile latency per model (nan: no requests)
    rate: np.ndarray  # last tick's arrival rate per model (req/s)
    history: np.ndarray  # per-minute rates (req/s) of all finished minutes, (minutes, models)
    replicas: np.ndarray  # current replica counts (starting ones included)


@dataclass
class FleetDecision:
    """A policy's answer: replica counts and optional per-model drop rates."""

    replicas: np.ndarray
    drop_rate: np.ndarray | None = None


class FleetPolicy(Protocol):
    def decide(self, obs: Observation, config: FleetConfig) -> FleetDecision | None: ...


@dataclass(frozen=True)
class FleetResult:
    violation_rate: float
    lost_utility: float
    per_model_violation: np.ndarray
    requests: int
    minute_utility: np.ndarray = field(repr=False)


@njit(cache=True)
def _serve(arrivals, free, proc, limit, ring, state, drop_rate, u, latency):
    """FIFO M/D/c with tail drop over sorted ``arrivals``; writes latencies (inf: drop)."""
    cap = ring.shape[0]
    head = state[0]
    count = state[1]
    for r in range(arrivals.shape[0]):
        t = arrivals[r]
        while count > 0 and ring[head] <= t:
            head = (head + 1) % cap
            count -= 1
        if count >= limit or u[r] < drop_rate:
            latency[r] = np.inf
            continue
        k = np.argmin(free)
        start = max(t, free[k])
        free[k] = start + proc
        latency[r] = start + proc - t
        if start > t:
            ring[(head + count) % cap] = start
            count += 1
    state[0] = head
    state[1] = count


def _resize(free: np.ndarray, target: int, now: float, cold: float) -> None:
    active = np.flatnonzero(np.isfinite(free))
    if target > active.size:
        idle = np.flatnonzero(~np.isfinite(free))[: target - active.size]
        free[idle] = now + cold
    elif target < active.size:
        order = active[np.argsort(-free[active], kind="stable")]
        free[order[: active.size - target]] = np.inf


def simulate(rates_per_min: np.ndarray, history_min: int, policy: FleetPolicy,
             config: FleetConfig, initial: np.ndarray | None = None) -> FleetResult:
    """Replay minutes ``history_min..`` of ``rates_per_min`` (models × minutes, req/min)."""
    rates = np.asarray(rates_per_min, dtype=float)
    n, minutes = rates.shape
    rng = np.random.default_rng(config.seed)
    proc = np.asarray(config.proc_s, dtype=float)
    slo = np.asarray(config.slo_s, dtype=float)
    total = int(config.total_replicas)
    free = np.full((n, total), np.inf)
    replicas = np.ones(n, dtype=np.int64) if initial is None else np.asarray(initial).copy()
    for i in range(n):
        free[i, : replicas[i]] = 0.0
    drop = np.zeros(n)
    rings = np.zeros((n, config.queue_limit + 1))
    states = np.zeros((n, 2), dtype=np.int64)
    history = list(rates[:, :history_min].T / 60.0)
    ticks_per_min = int(round(60.0 / config.tick_s))
    requests = np.zeros(n)
    violations = np.zeros(n)
    minute_util = []
    last_lat = np.full(n, np.nan)
    last_rate = np.zeros(n)
    q = config.percentile
    for minute in range(history_min, minutes):
        minute_lat = [[] for _ in range(n)]
        for tick in range(ticks_per_min):
            now = minute * 60.0 + tick * config.tick_s
            obs = Observation(now, last_lat.copy(), last_rate.copy(),
                              np.array(history), replicas.copy())
            decision = policy.decide(obs, config)
            if decision is not None:
                replicas = _grant(replicas, np.asarray(decision.replicas), total, rng)
                for i in range(n):
                    _resize(free[i], int(replicas[i]), now, config.cold_start_s)
                if decision.drop_rate is not None:
                    drop = np.asarray(decision.drop_rate, dtype=float)
            for i in range(n):
                count = rng.poisson(rates[i, minute] / 60.0 * config.tick_s)
                arrivals = np.sort(now + rng.uniform(0.0, config.tick_s, count))
                lat = np.empty(count)
                _serve(arrivals, free[i], proc[i], config.queue_limit, rings[i], states[i],
                       drop[i], rng.uniform(0.0, 1.0, count), lat)
                minute_lat[i].append(lat)
                last_rate[i] = count / config.tick_s
                last_lat[i] = np.quantile(lat, q / 100.0, method="higher") if count else np.nan
                requests[i] += count
                violations[i] += np.count_nonzero(~(lat <= slo[i]))
        utils = []
        for i in range(n):
            lat = np.concatenate(minute_lat[i])
            p = np.quantile(lat, q / 100.0, method="higher") if lat.size else 0.0
            utils.append(relaxed_utility(p, slo[i], 1.0))
        minute_util.append(utils)
        history.append(np.array([sum(a.size for a in minute_lat[i]) / 60.0 for i in range(n)]))
    per_model = np.where(requests > 0, violations / np.maximum(requests, 1), 0.0)
    mu = np.array(minute_util)
    return FleetResult(float(per_model.mean()), float(np.mean(n - mu.sum(axis=1))),
                       per_model, int(requests.sum()), mu)


def _grant(current: np.ndarray, wanted: np.ndarray, total: int, rng) -> np.ndarray:
    """Apply decreases at once, then increases in random order while the quota allows."""
    out = np.minimum(current, np.maximum(wanted, 1)).astype(np.int64)
    room = total - int(out.sum())
    for i in rng.permutation(len(out)):
        extra = min(max(int(wanted[i]) - int(out[i]), 0), max(room, 0))
        out[i] += extra
        room -= extra
    return out
