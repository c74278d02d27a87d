"""Percentiles from cumulative histograms (Prometheus' ``histogram_quantile``), as nodes
report them (``latency_ms``) and rollouts judge them (``agent.coordinator.rollout``)."""

from __future__ import annotations

import math


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) from cumulative ``(upper_bound, count)`` buckets, linear
    within a bucket; the highest finite bound for the +Inf bucket; None when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(upper):
                return lower
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = upper, cumulative
    return lower


#: The latency percentiles a node reports (``latency_ms``).
REPORTED_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentiles_ms(buckets: list[tuple[float, float]]) -> dict[str, float]:
    """A report's ``latency_ms`` (``{"p50": ms, ...}``) from cumulative ``(upper bound
    seconds, count)`` buckets; empty when they count nothing."""
    return {f"p{p:g}": round(v * 1000.0, 3) for p in REPORTED_PERCENTILES
            for v in [histogram_quantile(p / 100.0, buckets)] if v is not None}
