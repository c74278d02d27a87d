"""The allocation problem: cluster capacity and per-model demand, and its JSON form.

JSON (``edgeagent plan allocate --problem FILE``)::

    {"capacity": {"cpu": 32, "memory_bytes": 68719476736},
     "models": [{"name": "a", "rate": 40.0, "proc_ms": 150, "slo_ms": 600,
                 "percentile": 99.99, "priority": 1, "cpu_per_replica": 1,
                 "memory_per_replica_bytes": 1000000000}]}

``rate_samples`` (a list of predicted arrival rates over the next window) may replace
``rate``; the planning rate is then their ``rate_quantile`` quantile (0.9 by default):
Faro plans for a high quantile of the predicted window, not its mean (§3.5.2).
Defaults: percentile 99 (the paper's evaluation), priority 1, one core per replica,
no memory per replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.coordinator.choices import DEFAULT_RATE_QUANTILE, ESTIMATORS, OBJECTIVES, RHO_MAX


class ProblemError(ValueError):
    """The problem is malformed or cannot be solved (e.g. one replica each does not fit)."""


@dataclass(frozen=True)
class JobSpec:
    """One model (Faro's job): planning rate (req/s), processing time and SLO (s)."""

    name: str
    rate: float
    proc_s: float
    slo_s: float
    percentile: float = 99.0
    priority: float = 1.0
    cpu_per_replica: float = 1.0
    memory_per_replica_bytes: float = 0.0


@dataclass(frozen=True)
class Capacity:
    """Total vCPU and memory the planner may hand out."""

    cpu: float
    memory_bytes: float


@dataclass(frozen=True)
class Problem:
    """Everything the solver needs; ``gamma`` None means the number of models."""

    capacity: Capacity
    models: tuple[JobSpec, ...]
    objective: str = "fairsum"
    estimator: str = "mdc"
    alpha: float = 1.0
    gamma: float | None = None
    rho_max: float = RHO_MAX


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0.0


def validate(problem: Problem) -> None:
    """Raise ProblemError with a readable message unless ``problem`` is solvable."""
    if problem.objective not in OBJECTIVES:
        raise ProblemError(f"unknown objective {problem.objective!r}; choose from {OBJECTIVES}")
    if problem.estimator not in ESTIMATORS:
        raise ProblemError(f"unknown estimator {problem.estimator!r}; choose from {ESTIMATORS}")
    if not _positive(problem.alpha):
        raise ProblemError(f"alpha must be > 0, got {problem.alpha}")
    if not 0.0 < problem.rho_max < 1.0:
        raise ProblemError(f"rho_max must be in (0, 1), got {problem.rho_max}")
    if problem.gamma is not None and not (math.isfinite(problem.gamma) and problem.gamma >= 0):
        raise ProblemError(f"gamma must be >= 0, got {problem.gamma}")
    cap = problem.capacity
    if not _positive(cap.cpu) or not (math.isfinite(cap.memory_bytes) and cap.memory_bytes >= 0):
        raise ProblemError("capacity needs cpu > 0 and memory_bytes >= 0")
    if not problem.models:
        raise ProblemError("the problem has no models")
    names = [m.name for m in problem.models]
    if len(set(names)) != len(names):
        raise ProblemError("model names must be unique")
    for m in problem.models:
        if not (math.isfinite(m.rate) and m.rate >= 0):
            raise ProblemError(f"model {m.name!r}: rate must be >= 0, got {m.rate}")
        if not _positive(m.proc_s) or not _positive(m.slo_s):
            raise ProblemError(f"model {m.name!r}: proc_ms and slo_ms must be > 0")
        if not 0.0 < m.percentile < 100.0:
            raise ProblemError(f"model {m.name!r}: percentile must be in (0, 100)")
        if not (math.isfinite(m.priority) and m.priority >= 0):
            raise ProblemError(f"model {m.name!r}: priority must be >= 0")
        if not _positive(m.cpu_per_replica):
            raise ProblemError(f"model {m.name!r}: cpu_per_replica must be > 0")
        if not (math.isfinite(m.memory_per_replica_bytes) and m.memory_per_replica_bytes >= 0):
            raise ProblemError(f"model {m.name!r}: memory_per_replica_bytes must be >= 0")
    need_cpu = sum(m.cpu_per_replica for m in problem.models)
    need_mem = sum(m.memory_per_replica_bytes for m in problem.models)
    if need_cpu > cap.cpu * (1 + 1e-12) or need_mem > cap.memory_bytes * (1 + 1e-12):
        raise ProblemError(
            f"capacity too small for one replica per model: needs {need_cpu:g} cpu and "
            f"{need_mem:.0f} bytes, has {cap.cpu:g} cpu and {cap.memory_bytes:.0f} bytes"
        )


def _number(entry: dict, key: str, where: str, default: float | None = None) -> float:
    if key not in entry:
        if default is None:
            raise ProblemError(f"{where}: missing field {key!r}")
        return float(default)
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProblemError(f"{where}: field {key!r} must be a number, got {value!r}")
    return float(value)


def planning_rate(samples, quantile: float = DEFAULT_RATE_QUANTILE) -> float:
    """The rate Faro plans for: the ``quantile`` quantile of predicted window samples."""
    values = np.asarray(samples, dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ProblemError("rate_samples must be a non-empty list of rates >= 0")
    return float(np.quantile(values, quantile))


def problem_from_dict(
    data: object,
    objective: str = "fairsum",
    estimator: str = "mdc",
    rate_quantile: float = DEFAULT_RATE_QUANTILE,
) -> Problem:
    """Parse and validate the JSON problem; raise ProblemError on any bad input."""
    if not isinstance(data, dict):
        raise ProblemError("problem must be a JSON object with 'capacity' and 'models'")
    cap = data.get("capacity")
    if not isinstance(cap, dict):
        raise ProblemError("missing object 'capacity' ({'cpu': ..., 'memory_bytes': ...})")
    capacity = Capacity(
        cpu=_number(cap, "cpu", "capacity"),
        memory_bytes=_number(cap, "memory_bytes", "capacity", default=0.0),
    )
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise ProblemError("missing non-empty list 'models'")
    models = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ProblemError(f"models[{index}] must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ProblemError(f"models[{index}]: missing field 'name'")
        where = f"model {name!r}"
        if "rate_samples" in entry and "rate" not in entry:
            samples = entry["rate_samples"]
            if not isinstance(samples, list) or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool) for s in samples
            ):
                raise ProblemError(f"{where}: rate_samples must be a list of numbers")
            try:
                rate = planning_rate(samples, rate_quantile)
            except ProblemError as exc:
                raise ProblemError(f"{where}: {exc}") from None
        else:
            rate = _number(entry, "rate", where)
        models.append(
            JobSpec(
                name=name,
                rate=rate,
                proc_s=_number(entry, "proc_ms", where) / 1000.0,
                slo_s=_number(entry, "slo_ms", where) / 1000.0,
                percentile=_number(entry, "percentile", where, default=99.0),
                priority=_number(entry, "priority", where, default=1.0),
                cpu_per_replica=_number(entry, "cpu_per_replica", where, default=1.0),
                memory_per_replica_bytes=_number(
                    entry, "memory_per_replica_bytes", where, default=0.0
                ),
            )
        )
    problem = Problem(capacity=capacity, models=tuple(models), objective=objective,
                      estimator=estimator)
    validate(problem)
    return problem
