"""Timer-triggered requests: functions that fire on a schedule, as a large share of the
Azure Functions triggers do (Shahrad et al., ATC'20: timers are the second trigger type).

A timer function has a period ``P`` (drawn log-uniformly in ``periods`` seconds) and a
phase (uniform in ``[0, P)``); it fires at every scheduled time ``phase + k·P`` in the
window, each firing moved by up to ``jitter × P`` either way (uniform, not accumulated:
a late firing does not delay the next one, as a scheduler's clock does not drift).
"""

from __future__ import annotations

import numpy as np

from cachepolicies.workloads.errors import WorkloadError

#: The default range of periods (seconds) and the default jitter (a share of the period).
TIMER_PERIODS = (30.0, 600.0)
TIMER_JITTER = 0.02


def check_timer_options(share: float, periods: tuple[float, float], jitter: float) -> None:
    """Raise ``WorkloadError`` naming the first bad timer option."""
    if not 0.0 <= share <= 1.0:
        raise WorkloadError(f"timer share must be in [0, 1], got {share}")
    low, high = periods
    if not 0.0 < low <= high:
        raise WorkloadError(f"timer periods must satisfy 0 < shortest <= longest, got "
                            f"{low:g} and {high:g} seconds")
    if not 0.0 <= jitter < 0.5:
        raise WorkloadError(f"timer jitter must be in [0, 0.5) of the period, got {jitter:g}")


def timer_events(functions: int, seconds: float, rng: np.random.Generator, *,
                 periods: tuple[float, float] = TIMER_PERIODS,
                 jitter: float = TIMER_JITTER) -> tuple[np.ndarray, np.ndarray]:
    """``(times, rows)``: the firings of ``functions`` timers within ``[0, seconds)``,
    sorted by time; ``rows[i]`` (0 … functions − 1) is the timer of firing ``i``."""
    check_timer_options(0.0, periods, jitter)
    low, high = periods
    period = np.exp(rng.uniform(np.log(low), np.log(high), functions))
    phase = rng.random(functions) * period
    firings = np.ceil((seconds - phase) / period).astype(np.int64)  # scheduled in the window
    rows = np.repeat(np.arange(functions), firings)
    starts = np.cumsum(firings) - firings
    k = np.arange(len(rows)) - np.repeat(starts, firings)
    times = phase[rows] + k * period[rows]
    times += jitter * period[rows] * rng.uniform(-1.0, 1.0, len(rows))
    inside = (times >= 0.0) & (times < seconds)
    times, rows = times[inside], rows[inside]
    order = np.argsort(times, kind="stable")
    return times[order], rows[order]
