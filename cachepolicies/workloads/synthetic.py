"""Synthetic per-minute invocation counts shaped like the Azure Functions 2019 trace.

Lets every workload run without the real trace. Seeded and vectorised: 30,000 functions
over a day (~2 million invocations with the defaults) take a second or two.
"""

from __future__ import annotations

import numpy as np

from cachepolicies.workloads.errors import WorkloadError
from cachepolicies.workloads.invocations import InvocationCounts

# Approximate shares of functions per trigger in the Azure 2019 trace (Shahrad et al.,
# "Serverless in the Wild", ATC'20, Fig. 2); HTTP is the largest group.
TRIGGER_SHARES = {"http": 0.55, "queue": 0.15, "timer": 0.15, "orchestration": 0.07,
                  "storage": 0.03, "event": 0.02, "others": 0.03}
TIMER_PERIODS_MINUTES = (1, 5, 10, 15, 30, 60, 120, 1440)
MINUTES_PER_DAY = 1440


def synthetic_invocations(functions: int, minutes: int = MINUTES_PER_DAY, *, seed: int = 0,
                          median_per_day: float = 10.0, sigma: float = 2.0,
                          diurnal_amplitude: float = 0.5) -> InvocationCounts:
    """Counts for ``functions`` functions over ``minutes`` minutes.

    Popularity is heavy-tailed: each function's mean invocations per day is lognormal
    (median ``median_per_day``, log standard deviation ``sigma``), so a few functions
    receive most requests. A function's invocations in the window are Poisson with that
    mean (scaled to the window) and fall in minute ``t`` with density
    ``1 + a·sin(2π(t/1440 − φ))``: a daily rhythm with a per-function amplitude ``a``
    around ``diurnal_amplitude`` and a phase ``φ`` near a shared afternoon peak. Timer
    functions instead fire once every period (1 minute to 1 day) from a random offset.
    """
    if functions < 1 or minutes < 1:
        raise WorkloadError(f"need at least 1 function and 1 minute, got {functions} "
                            f"functions and {minutes} minutes")
    if median_per_day <= 0 or sigma < 0 or not 0 <= diurnal_amplitude <= 1:
        raise WorkloadError("need median_per_day > 0, sigma >= 0 and 0 <= diurnal_amplitude <= 1")
    rng = np.random.default_rng(seed)
    names = np.array(list(TRIGGER_SHARES))
    shares = np.array(list(TRIGGER_SHARES.values()))
    triggers = names[rng.choice(len(names), size=functions, p=shares / shares.sum())]
    timer = triggers == "timer"

    per_day = median_per_day * np.exp(sigma * rng.standard_normal(functions))
    totals = rng.poisson(per_day * minutes / MINUTES_PER_DAY)
    totals[timer] = 0
    amplitude = np.clip(diurnal_amplitude * rng.uniform(0.5, 1.5, functions), 0.0, 1.0)
    phase = 0.3 + 0.05 * rng.standard_normal(functions)
    function_of_event = np.repeat(np.arange(functions), totals)
    minute_of_event = _diurnal_minutes(rng, function_of_event, amplitude, phase, minutes)

    counts = np.zeros((functions, minutes), dtype=np.int32)
    np.add.at(counts, (function_of_event, minute_of_event), 1)
    timer_rows = np.flatnonzero(timer)
    period = rng.choice(TIMER_PERIODS_MINUTES, size=len(timer_rows))
    offset = rng.integers(0, period)
    fires = (np.arange(minutes)[None, :] - offset[:, None]) % period[:, None] == 0
    counts[timer_rows] = fires

    app_of_function = np.cumsum(rng.random(functions) < 0.5)
    owner_of_app = np.cumsum(rng.random(app_of_function[-1] + 1) < 0.6)
    apps = _hashes(rng, app_of_function[-1] + 1)
    owners = _hashes(rng, owner_of_app[-1] + 1)
    return InvocationCounts(
        owners=owners[owner_of_app[app_of_function]],
        apps=apps[app_of_function],
        functions=_hashes(rng, functions),
        triggers=triggers.astype(object),
        counts=counts,
    )


def _diurnal_minutes(rng: np.random.Generator, function_of_event: np.ndarray,
                     amplitude: np.ndarray, phase: np.ndarray, minutes: int) -> np.ndarray:
    """A minute for each event, drawn by rejection from its function's diurnal density."""
    minute = np.empty(len(function_of_event), dtype=np.int64)
    pending = np.arange(len(function_of_event))
    while len(pending):
        proposal = rng.integers(0, minutes, len(pending))
        f = function_of_event[pending]
        density = 1.0 + amplitude[f] * np.sin(2 * np.pi * (proposal / MINUTES_PER_DAY - phase[f]))
        accepted = rng.random(len(pending)) * (1.0 + amplitude[f]) < density
        minute[pending[accepted]] = proposal[accepted]
        pending = pending[~accepted]
    return minute


def _hashes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random 64-hex-digit strings, like the trace's SHA-256 hashes (object array)."""
    text = rng.bytes(32 * n).hex()
    return np.array([text[64 * i:64 * (i + 1)] for i in range(n)], dtype=object)
