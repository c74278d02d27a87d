"""Per-model utility of Faro §3.1: the SLO step and the relaxed ``min((s/l)^α, 1)``.

A latency within ``1e-9`` (relative) of the SLO counts as meeting it, so that the
paper's exact-boundary example (10 replicas × 60 ms of work per replica = 600 ms)
is not lost to floating-point rounding.
"""

from __future__ import annotations

import math

from numba import njit

SLO_TOLERANCE = 1e-9


@njit(cache=True)
def step_utility(latency, slo):
    """``U_original``: 1 when the latency meets the SLO, else 0."""
    return 1.0 if latency <= slo * (1.0 + SLO_TOLERANCE) else 0.0


@njit(cache=True)
def relaxed_utility(latency, slo, alpha):
    """``U = min((s/l)^α, 1)``; 0 for an infinite latency."""
    if latency <= slo * (1.0 + SLO_TOLERANCE):
        return 1.0
    if math.isinf(latency):
        return 0.0
    return (slo / latency) ** alpha
