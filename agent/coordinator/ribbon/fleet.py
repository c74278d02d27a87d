"""The live-fleet evaluator: a candidate pool scored by Faro's allocator (issue 12, 2b).

Same interface as :class:`~agent.coordinator.ribbon.evaluators.LookupGridEvaluator`, so
``search`` runs unchanged: Ribbon chooses the pool, Faro fills it. Inputs (built from the
coordinator's reports, catalog and forecast by ``agent.coordinator.sizing``): per kind
of node its price, cores, memory and the measured processing time of each model on it;
per model the planner's forecast rate and its SLO (``faro.JobSpec``).

``measure(counts)``, for ``counts[i]`` nodes of kind ``i``:

1. Faro's allocator (``solve``, the ``fast`` solver, no Stage-3 shrink: the pool is
   there to be used) over the pool's cores and memory, each model's processing time
   the core-weighted mean over the pool's kinds; then again (``PASSES`` in all) at the
   processing time of where the last pass placed each model's replicas. The pool
   scores the best of its passes (the allocation a coordinator would run): with one
   pass a model sized at the mean could land on a slow kind, and adding a node lowered
   QoS by tens of points on heterogeneous fleets.
2. Replicas are placed on the kinds where each model runs fastest while their cores
   last, the models with the most work first (as a scheduler that knows the measured
   timings would; splitting them in proportion to cores instead put replicas on slow
   kinds, so that adding a slow node lowered QoS and pruning removed optima). A model's
   requests go to its replicas in proportion to their service rates (``replicas /
   proc`` per kind), as a least-loaded balancer would.
3. Each (model, kind) group is an M/D/c queue (``faro.latency.mdc_within_slo``, the
   planner's model): the share of its requests within the model's SLO.

QoS is the share of all forecast requests within their SLO, in percent. A pool too
small for one replica of each model scores 0. Placement on single nodes (a replica
does not straddle two) is not modelled; measurements are cached per pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from agent.coordinator.faro import Capacity, JobSpec, Problem, ProblemError, solve
from agent.coordinator.faro.latency import mdc_within_slo
from agent.coordinator.ribbon.evaluators import Measurement
from agent.coordinator.ribbon.space import DEFAULT_TARGET_PERCENT, SearchSpace


@dataclass(frozen=True)
class PoolType:
    """One kind of node as the evaluator sees it; ``proc_s`` per model name."""

    name: str
    price_per_hour: float
    max_count: int
    cores: float
    cpu_memory_bytes: float
    proc_s: dict[str, float]


@dataclass(frozen=True)
class PoolScore:
    """What ``measure`` found for one pool: QoS and Faro's replicas per kind."""

    price: float
    qos_percent: float
    replicas: dict[str, dict[str, int]]       # model -> kind -> replicas
    within_slo: dict[str, float]              # model -> share of its requests


PASSES = 3   # Faro allocations per pool (each at the processing times of the last placement)


class FleetEvaluator:
    """Prices and predicted QoS of pools of ``types`` serving ``models``."""

    def __init__(self, types: list[PoolType], models: list[JobSpec], *,
                 target_percent: float = DEFAULT_TARGET_PERCENT,
                 objective: str = "fairsum", estimator: str = "mdc"):
        if not types:
            raise ValueError("no node types to size with")
        if not models:
            raise ValueError("no models to serve")
        self.types, self.models = list(types), list(models)
        self.space = SearchSpace(tuple(t.name for t in types),
                                 tuple(int(t.max_count) for t in types), float(target_percent))
        self.objective, self.estimator = objective, estimator
        self._scores: dict[tuple[int, ...], PoolScore] = {}

    def price(self, counts: tuple[int, ...]) -> float:
        return float(sum(c * t.price_per_hour for c, t in zip(counts, self.types)))

    def measure(self, counts: tuple[int, ...]) -> Measurement:
        s = self.score(counts)
        return Measurement(s.price, s.qos_percent)

    def score(self, counts: tuple[int, ...]) -> PoolScore:
        counts = tuple(int(c) for c in counts)
        if counts not in self._scores:
            self._scores[counts] = self._score(counts)
        return self._scores[counts]

    def _score(self, counts: tuple[int, ...]) -> PoolScore:
        price = self.price(counts)
        cores = np.array([c * t.cores for c, t in zip(counts, self.types)], dtype=float)
        total = float(cores.sum())
        none = PoolScore(price, 0.0, {}, {m.name: 0.0 for m in self.models})
        if total <= 0:
            return none
        memory = float(sum(c * t.cpu_memory_bytes for c, t in zip(counts, self.types)))
        # pass 1: each model at the core-weighted mean of its processing times; later
        # passes: at the mean over where the last pass placed its replicas
        procs = {m.name: float(np.dot(cores, self._procs(m)) / total) for m in self.models}
        best = none
        for _ in range(PASSES):
            specs = tuple(replace(m, proc_s=procs[m.name]) for m in self.models)
            try:
                allocation = solve(Problem(Capacity(total, memory), specs, self.objective,
                                           self.estimator), "fast", shrink_result=False)
            except ProblemError:
                break
            splits = self._place(allocation.replicas, cores)
            scored = self._shares(price, splits)
            if scored.qos_percent > best.qos_percent + 1e-9:
                best = scored
            procs = {m.name: _placed_proc(splits[m.name], self._procs(m), procs[m.name])
                     for m in self.models}
        return best

    def _shares(self, price: float, splits: dict[str, np.ndarray]) -> PoolScore:
        """QoS of a placement: M/D/c per (model, kind), requests by service rate."""
        replicas, within, served, offered = {}, {}, 0.0, 0.0
        for m in self.models:
            split = splits[m.name]
            procs = self._procs(m)
            replicas[m.name] = {t.name: int(n) for t, n in zip(self.types, split) if n}
            speed = np.where(split > 0, split / procs, 0.0)
            share = 0.0
            for n, p, mu in zip(split, procs, speed):
                if n > 0 and speed.sum() > 0:
                    rate = m.rate * mu / speed.sum()
                    share += mu / speed.sum() * mdc_within_slo(p, rate, int(n), m.slo_s)
            within[m.name] = float(share)
            served += m.rate * share
            offered += m.rate
        if offered > 0:
            qos = 100.0 * served / offered
        else:
            qos = 100.0 if all(replicas.values()) else 0.0
        return PoolScore(price, float(qos), replicas, within)

    def _place(self, replicas: dict[str, int], cores: np.ndarray) -> dict[str, np.ndarray]:
        """Replicas per model and kind: the models with the most work (rate × mean
        processing time) first, each on the kinds where it runs fastest while their
        cores last; what does not fit goes where cores remain (in proportion to them)."""
        free = cores.copy()
        out = {}
        for m in sorted(self.models, key=lambda m: -m.rate * m.proc_s):
            split = np.zeros(len(self.types), dtype=np.int64)
            left = replicas[m.name]
            for i in np.argsort(self._procs(m), kind="stable"):
                take = min(left, int(free[i] // m.cpu_per_replica + 1e-9))
                split[i] += take
                free[i] -= take * m.cpu_per_replica
                left -= take
            if left > 0:
                split += _split(left, np.where(free > 0, free, 0.0) if free.sum() > 0
                                else cores)
            out[m.name] = split
        return out

    def _procs(self, m: JobSpec) -> np.ndarray:
        return np.array([t.proc_s.get(m.name, m.proc_s) for t in self.types], dtype=float)


def _placed_proc(split: np.ndarray, procs: np.ndarray, default: float) -> float:
    """The processing time of a model's replicas as placed (their mean service time)."""
    n = float(split.sum())
    return float(n / np.sum(split / procs)) if n > 0 else default


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` as integers in proportion to ``weights`` (largest remainder)."""
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - out), kind="stable")[: total - int(out.sum())]:
        out[i] += 1
    return out
