"""Faro (EuroSys '25) planning core: relaxed utilities, latency models and solvers.

Modules: ``latency`` (upper bound, relaxed M/D/c), ``utility``, ``objectives``,
``problem`` (dataclasses, JSON), ``tables`` (per-model value tables), ``allocator``
(fast solver), ``cobyla`` (Faro's COBYLA, flat and hierarchical), ``solver`` (``solve``:
best of the solvers + Stage-3 shrink), ``exhaustive`` (brute-force reference),
``forecast`` (probabilistic rates), ``reactive`` (short-term scale-up), ``placement``
(replicas → nodes), ``fleetsim`` / ``fleetpolicies`` (the §6.4 matched simulator).
"""

from agent.coordinator.faro.forecast import RateForecast, forecast
from agent.coordinator.faro.latency import estimate_latency
from agent.coordinator.faro.placement import Machine, ModelDemand, Placement, place
from agent.coordinator.faro.problem import (
    Capacity,
    JobSpec,
    Problem,
    ProblemError,
    planning_rate,
    problem_from_dict,
)
from agent.coordinator.faro.reactive import ReactiveState, reactive_step
from agent.coordinator.faro.solver import Allocation, solve

__all__ = [
    "Allocation", "Capacity", "ModelDemand", "JobSpec", "Machine", "Placement", "Problem",
    "ProblemError", "RateForecast", "ReactiveState", "estimate_latency", "forecast",
    "place", "planning_rate", "problem_from_dict", "reactive_step", "solve",
]
