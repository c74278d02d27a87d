"""Faro's short-term reactive autoscaler (§4.4): additive scale-up on repeated violations.

Every reactive tick (10 s in Faro) feeds the observed tail latency. After ``patience``
consecutive ticks over the SLO (3 ticks = the 30 s scale-up trigger of §6) the model
gets ``step`` more replicas and the count restarts. It never scales down: the long-term
planner owns the replica count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ReactiveState:
    """Replicas of one model and how many ticks in a row violated its SLO."""

    replicas: int
    violations: int = 0


def reactive_step(state: ReactiveState, observed_latency: float, slo: float, *,
                  patience: int = 3, step: int = 1,
                  max_replicas: int | None = None) -> ReactiveState:
    """The state after one tick; adds ``step`` replicas (up to ``max_replicas``) when due."""
    if observed_latency <= slo:
        return replace(state, violations=0)
    violations = state.violations + 1
    if violations < patience:
        return replace(state, violations=violations)
    target = state.replicas + step
    if max_replicas is not None:
        target = max(state.replicas, min(target, max_replicas))
    return ReactiveState(replicas=target, violations=0)
