"""The dashboard's what-if curve: the node's last hour of requests, with its measured
profiles and settings, through its twin (``cachepolicies.twin``) at a few multiples of
its cpu budget under its own policy; response and load delay per capacity.

It runs in a thread, at most once per ``REFRESH_S`` (the page polls far more often), on
the last ``MAX_REQUESTS`` requests of the window at most: the twin interprets the
policy's kernels here as the node does, so its cost is bounded, not free.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable

from agent.config.twinsettings import recorded_settings, twin_settings

if TYPE_CHECKING:
    from agent.node.serving import Serving

#: Capacities the curve shows, as multiples of the cpu budget.
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
WINDOW_S = 3600.0
REFRESH_S = 60.0
MAX_REQUESTS = 20_000


class WhatIf:
    """The curve, cached for ``REFRESH_S``; computed on the first ask."""

    def __init__(self, serving: Serving, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.serving, self.clock = serving, clock
        self._curve: dict[str, Any] | None = None
        self._at = -float("inf")
        self._lock = asyncio.Lock()

    async def curve(self) -> dict[str, Any]:
        async with self._lock:
            if self._curve is None or self.clock() - self._at >= REFRESH_S:
                inputs = self._inputs()
                self._curve = await asyncio.get_running_loop().run_in_executor(
                    None, compute, *inputs)
                self._at = self.clock()
        return self._curve

    def _inputs(self) -> tuple:
        """What the thread needs, copied on the event loop."""
        serving = self.serving
        record = serving.record
        requests = record.since(record.wall_clock() - WINDOW_S)
        pool = serving.cache.pools.get("cpu")
        budget = pool.budget if pool is not None else 0
        rows = serving.profiles()
        return (requests, rows, budget, serving.cache.policy_spec,
                twin_settings(serving.config, recorded_settings(rows)))


def compute(requests, profile_rows: list[dict[str, Any]], budget: int, policy: str,
            settings) -> dict[str, Any]:
    """The curve's JSON: one point per capacity the requested models fit in."""
    import numpy as np

    from cachepolicies import twin
    from cachepolicies.registry import make_policy
    from cachepolicies.traces import make_profiles, make_trace

    rows = [r for r in profile_rows if r["size_bytes"]]
    known = {r["model"] for r in rows}
    keep = np.array([m in known for m in requests.models], dtype=bool)
    kept = np.flatnonzero(keep)
    keep[kept[:-MAX_REQUESTS]] = False  # the latest MAX_REQUESTS at most
    models = [m for m, k in zip(requests.models, keep) if k]
    out: dict[str, Any] = {"window_seconds": WINDOW_S, "requests": len(models),
                           "policy": policy, "budget_bytes": budget, "points": []}
    if not models or not budget:
        return out
    profiles = make_profiles(
        [r["model"] for r in rows], [r["size_bytes"] for r in rows],
        [r["load_seconds"] for r in rows], [r["exec_seconds"] for r in rows],
        [np.nan if r["first_exec_seconds"] is None else r["first_exec_seconds"]
         for r in rows],
        exec_seconds_per_row=[np.nan if r["exec_seconds_per_row"] is None
                              else r["exec_seconds_per_row"] for r in rows],
        load_slot_seconds=[r["load_slot_seconds"] for r in rows])
    arrival = requests.arrival[keep]
    trace = make_trace(arrival - arrival[0], models, profiles)
    largest = int(profiles.size_bytes[np.unique(trace.model_ids)].max())
    for factor in FACTORS:
        capacity = int(budget * factor)
        if capacity < largest:
            continue
        outcome = twin.replay(trace, profiles, capacity, make_policy(policy), settings)
        loads = np.asarray(outcome.loads)
        stats = outcome.stats(settings.slo_seconds)
        out["points"].append({
            "capacity_bytes": capacity, "factor": factor, "loads": int(loads.sum()),
            "mean_load_delay_seconds": float(loads @ profiles.penalty_seconds) / len(trace),
            "mean_response_seconds": stats["mean_response_seconds"],
            "p99_response_seconds": stats["p99_response_seconds"],
            "slo_violations": stats["slo_violations"]})
    return out
