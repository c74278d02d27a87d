"""Request events from per-minute counts (CremeBrulee §VI-A, "Event Generation")."""

from __future__ import annotations

import numpy as np


def spread_over_minutes(counts: np.ndarray,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(times, rows)``: one request per invocation in ``counts`` (rows × minutes).

    Each invocation of minute ``m`` (0-based column) gets an independent uniformly random
    time in ``[60·m, 60·(m+1))`` seconds; ``times`` is sorted (float64) and ``rows[i]``
    is the row of request ``i``. The paper spreads a minute's invocations "equally ...
    in a random order"; independent uniform times are the seeded, vectorised reading.
    """
    rows, minutes = counts.shape
    per_cell = counts.T.ravel()  # minute-major: all of minute 0, then minute 1, ...
    cells = np.flatnonzero(per_cell)
    repeats = per_cell[cells]
    minute = np.repeat(cells // rows, repeats)
    row = np.repeat(cells % rows, repeats)
    start = minute * 60.0
    times = np.minimum(start + rng.random(len(minute)) * 60.0,
                       np.nextafter(start + 60.0, 0.0))
    order = np.argsort(times, kind="stable")
    return times[order], row[order]
