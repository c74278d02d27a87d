"""The live-fleet evaluator: a candidate pool scored by Faro's allocator (issue 12, 2b).

Same interface as :class:`~agent.coordinator.ribbon.evaluators.LookupGridEvaluator`, so
``search`` runs unchanged: Ribbon chooses the pool, Faro fills it. Inputs (built from the
coordinator's reports, catalog and forecast by ``agent.coordinator.sizing``): per kind
of node its price, cores, memory and the measured processing time of each model on it;
per model the planner's forecast rate and its SLO (``faro.ModelSpec``).

``measure(counts)``, for ``counts[i]`` nodes of kind ``i``:

1. Faro's allocator (``solve``, the ``fast`` solver, no Stage-3 shrink: the pool is
   there to be used) over the pool's cores and memory, each model's processing time
   the core-weighted mean over the pool's kinds.
2. Each model's replicas are split over the kinds in proportion to their cores
   (largest remainder), and its requests over its replicas in proportion to their
   service rates (``replicas / proc`` per kind), as a least-loaded balancer would.
3. Each (model, kind) group is an M/D/c queue (``faro.latency.mdc_within_slo``, the
   planner's model): the share of its requests within the model's SLO.

QoS is the share of all forecast requests within their SLO, in percent. A pool too
small for one replica of each model scores 0. Placement on single nodes (a replica
does not straddle two) is not modelled; measurements are cached per pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from agent.coordinator.faro import Capacity, ModelSpec, Problem, ProblemError, solve
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


class FleetEvaluator:
    """Prices and predicted QoS of pools of ``types`` serving ``models``."""

    def __init__(self, types: list[PoolType], models: list[ModelSpec], *,
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
        specs = tuple(replace(m, proc_s=float(np.dot(cores, self._procs(m)) / total))
                      for m in self.models)
        try:
            allocation = solve(Problem(Capacity(total, memory), specs, self.objective,
                                       self.estimator), "fast", shrink_result=False)
        except ProblemError:
            return none
        replicas, within, served, offered = {}, {}, 0.0, 0.0
        for m in self.models:
            split = _split(allocation.replicas[m.name], cores)
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

    def _procs(self, m: ModelSpec) -> np.ndarray:
        return np.array([t.proc_s.get(m.name, m.proc_s) for t in self.types], dtype=float)


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` as integers in proportion to ``weights`` (largest remainder)."""
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - out), kind="stable")[: total - int(out.sum())]:
        out[i] += 1
    return out
