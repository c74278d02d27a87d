"""Autoscaling policies for the fleet simulator: Faro and the baselines of §6 (Table 6).

* ``FairShare``: no autoscaling, ⌊total / models⌋ replicas each.
* ``Oneshot``: after 30 s over the SLO, replicas × latency/SLO at once; after 5 min
  under it, scaled down the same way.
* ``AIAD``: the same triggers, ±1 replica.
* ``MArkStyle``: per model, independently, every minute: replicas for the forecast
  peak of the next 5 minutes at the single-replica SLO throughput (M/D/1), plus +1 when
  the last tick missed the SLO (MArk §4.3–4.4). Cluster limits are not considered.
* ``FaroPolicy``: every 5 min, forecast 7 min, plan for the 0.9 quantile of the window
  and solve the chosen objective (Stage 3 included); every tick, ``reactive_step``.
"""

from __future__ import annotations

import math

import numpy as np

from agent.coordinator.faro.fleetsim import FleetDecision, FleetConfig, Observation
from agent.coordinator.faro.forecast import forecast
from agent.coordinator.faro.latency import mdc_latency
from agent.coordinator.faro.problem import Capacity, JobSpec, Problem
from agent.coordinator.faro.reactive import ReactiveState, reactive_step
from agent.coordinator.faro.solver import solve

UP_AFTER_S = 30.0
DOWN_AFTER_S = 300.0


class FairShare:
    name = "FairShare"

    def __init__(self) -> None:
        self.done = False

    def decide(self, obs: Observation, config: FleetConfig) -> FleetDecision | None:
        if self.done:
            return None
        self.done = True
        n = len(obs.replicas)
        return FleetDecision(np.full(n, max(config.total_replicas // n, 1)))


class _Triggered:
    """Shared 30 s-up / 5 min-down trigger bookkeeping of Oneshot and AIAD."""

    def __init__(self) -> None:
        self.over_since: dict[int, float] = {}
        self.under_since: dict[int, float] = {}

    def triggers(self, obs: Observation, config: FleetConfig):
        ups, downs = [], []
        for i, lat in enumerate(obs.latency_s):
            lat = 0.0 if math.isnan(lat) else float(lat)
            if lat > config.slo_s[i]:
                self.under_since.pop(i, None)
                since = self.over_since.setdefault(i, obs.now)
                if obs.now - since >= UP_AFTER_S:
                    ups.append((i, lat))
                    self.over_since[i] = obs.now
            else:
                self.over_since.pop(i, None)
                since = self.under_since.setdefault(i, obs.now)
                if obs.now - since >= DOWN_AFTER_S:
                    downs.append((i, lat))
                    self.under_since[i] = obs.now
        return ups, downs


class Oneshot(_Triggered):
    name = "Oneshot"

    def decide(self, obs, config):
        ups, downs = self.triggers(obs, config)
        if not ups and not downs:
            return None
        x = obs.replicas.copy()
        for i, lat in ups + downs:
            x[i] = max(1, math.ceil(x[i] * min(lat / config.slo_s[i], 1e3)))
        return FleetDecision(x)


class AIAD(_Triggered):
    name = "AIAD"

    def decide(self, obs, config):
        ups, downs = self.triggers(obs, config)
        if not ups and not downs:
            return None
        x = obs.replicas.copy()
        for i, _ in ups:
            x[i] += 1
        for i, _ in downs:
            x[i] = max(1, x[i] - 1)
        return FleetDecision(x)


def single_replica_throughput(proc: float, slo: float, percentile: float) -> float:
    """Largest rate one M/D/1 replica serves within the SLO (bisection)."""
    lo, hi = 0.0, 1.0 / proc
    for _ in range(60):
        mid = (lo + hi) / 2
        if mdc_latency(percentile, proc, mid, 1) <= slo:
            lo = mid
        else:
            hi = mid
    return max(lo, 1e-9)


class MArkStyle:
    name = "MArk"

    def __init__(self, window_min: int = 60, ahead_min: int = 5) -> None:
        self.window = window_min
        self.ahead = ahead_min
        self.next_plan = -1.0

    def decide(self, obs, config):
        n = len(obs.replicas)
        x = obs.replicas.copy()
        changed = False
        if obs.now >= self.next_plan:
            self.next_plan = obs.now + 60.0
            for i in range(n):
                peak = float(np.max(forecast(obs.history[-self.window:, i], self.ahead).mean))
                cap = single_replica_throughput(config.proc_s[i], config.slo_s[i],
                                                config.percentile)
                x[i] = max(1, math.ceil(peak / cap))
            changed = True
        for i, lat in enumerate(obs.latency_s):
            if not math.isnan(lat) and lat > config.slo_s[i]:
                x[i] += 1
                changed = True
        return FleetDecision(x) if changed else None


class FaroPolicy:
    """Faro's hybrid autoscaler with one of the five objectives."""

    def __init__(self, objective: str = "fairsum", method: str = "fast",
                 period_s: float = 300.0, window_min: int = 7, history_min: int = 60,
                 quantile: float = 0.9, seed: int = 0) -> None:
        self.objective = objective
        self.method = method
        self.name = f"Faro-{objective}"
        self.period = period_s
        self.window = window_min
        self.history = history_min
        self.quantile = quantile
        self.seed = seed
        self.next_plan = -1.0
        self.states: list[ReactiveState] = []
        self.drops = None

    def plan(self, obs: Observation, config: FleetConfig) -> FleetDecision:
        models = []
        for i in range(len(obs.replicas)):
            f = forecast(obs.history[-self.history:, i], self.window, seed=self.seed + i)
            models.append(JobSpec(f"m{i}", f.window_quantile(self.quantile),
                                    config.proc_s[i], config.slo_s[i], config.percentile))
        problem = Problem(Capacity(config.total_replicas, 0.0), tuple(models), self.objective)
        result = solve(problem, self.method)
        x = np.array([result.replicas[m.name] for m in models], dtype=np.int64)
        drops = np.array([result.drop_rate[m.name] for m in models])
        return FleetDecision(x, drops)

    def decide(self, obs, config):
        if obs.now >= self.next_plan:
            self.next_plan = obs.now + self.period
            decision = self.plan(obs, config)
            self.states = [ReactiveState(int(r)) for r in decision.replicas]
            self.drops = decision.drop_rate
            return decision
        spare = config.total_replicas - int(obs.replicas.sum())
        changed = False
        for i, lat in enumerate(obs.latency_s):
            lat = 0.0 if math.isnan(lat) else float(lat)
            state = ReactiveState(int(obs.replicas[i]), self.states[i].violations)
            new = reactive_step(state, lat, config.slo_s[i], max_replicas=state.replicas + spare)
            spare -= new.replicas - state.replicas
            changed |= new.replicas != state.replicas
            self.states[i] = new
        if not changed:
            return None
        return FleetDecision(np.array([s.replicas for s in self.states]), self.drops)
