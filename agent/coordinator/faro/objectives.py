"""Faro's five cluster objectives (§3.2) and the AWS-style drop penalty, step and relaxed.

Every objective is written as one value to *maximise*:

* ``sum``:            Σ π_i U_i
* ``fair``:           −(max_i U_i − min_i U_i)   (the paper minimises the spread)
* ``fairsum``:        Σ π_i U_i − γ (max_i U_i − min_i U_i),  γ = number of models
* ``penaltysum``:     Σ π_i EU_i,  EU_i = φ(d_i) U_i(λ_i (1 − d_i))
* ``penaltyfairsum``: Σ π_i EU_i − γ (max_i EU_i − min_i EU_i)

Decisions: the paper's Fair has no priorities, so neither has ours. The drop rate d_i
of the penalty variants is chosen per model to maximise its own EU_i (a model never
drops requests to help fairness), on the grid ``DROP_GRID`` (0 to 20 % in 0.5 % steps,
which contains every corner of the penalty function). The relaxed multiplier φ is
piecewise linear through the step function's corners (d = 1 %, 5 %, 10 % → 1, 0.75,
0.5), free up to 1 % as in the AWS table, and keeps falling at the last slope to 0 at
d = 20 %; it is never below the step version.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from agent.coordinator.choices import OBJECTIVES
DROP_GRID = np.round(np.arange(0.0, 0.2000001, 0.005), 6)
_PHI_D = np.array([0.0, 0.01, 0.05, 0.10, 0.20, 1.0])
_PHI_V = np.array([1.0, 1.0, 0.75, 0.50, 0.0, 0.0])
# Weight of Σπ U used only to break ties of the pure ``fair`` objective (all-equal
# utilities at 0.2 and at 1.0 are both optimal): small against the 1e-6 we promise.
FAIR_TIEBREAK = 1e-7


def penalty(availability: float) -> float:
    """AWS service-credit fraction (Faro Table 5) for an availability in [0, 1]."""
    if availability >= 0.99:
        return 0.0
    if availability >= 0.95:
        return 0.25
    if availability >= 0.90:
        return 0.50
    return 1.0


def step_penalty_multiplier(drop_rate: float) -> float:
    """φ(d) = 1 − penalty(1 − d), the precise (plateau) multiplier."""
    return 1.0 - penalty(1.0 - drop_rate)


@njit(cache=True)
def relaxed_penalty_multiplier(drop_rate):
    """Piecewise-linear φ(d) through the step function's corners (see module doc)."""
    return np.interp(drop_rate, _PHI_D, _PHI_V)


def uses_penalty(objective: str) -> bool:
    """Whether ``objective`` scores effective utilities EU (with drop penalties)."""
    return objective.startswith("penalty")


def objective_weights(objective: str, n_models: int, priorities: np.ndarray, gamma: float | None):
    """``(A, G)`` such that the search maximises ``A Σ π v − G (max v − min v)``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
    g = float(n_models) if gamma is None else float(gamma)
    if objective in ("sum", "penaltysum"):
        return 1.0, 0.0
    if objective == "fair":
        return FAIR_TIEBREAK / max(1.0, float(np.sum(priorities))), 1.0
    return 1.0, g


def cluster_objective(
    objective: str, values: np.ndarray, priorities: np.ndarray, gamma: float | None = None
) -> float:
    """The exact objective value (no tie-break) of per-model utilities ``values``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
    values = np.asarray(values, dtype=float)
    priorities = np.asarray(priorities, dtype=float)
    spread = float(values.max() - values.min()) if values.size else 0.0
    total = float(np.dot(priorities, values))
    g = float(values.size) if gamma is None else float(gamma)
    if objective in ("sum", "penaltysum"):
        return total
    if objective == "fair":
        return -spread
    return total - g * spread
