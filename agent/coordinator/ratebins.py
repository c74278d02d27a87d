"""The fleet's arrival history in bins: a node's arrival points spread over the
``step``-wide bins they overlap (``Store.write_reports`` adds them to the stored bins)."""

from __future__ import annotations

import math
from typing import Iterable


def spread(points: Iterable[tuple[float, float, float]], step: float,
           into: dict[float, float] | None = None) -> dict[float, float]:
    """Add each ``(t_end, seconds > 0, count)`` point to the ``step`` bins it overlaps
    (bin start -> count), in proportion to the overlap; a zero count still marks its
    bins (the history covers them)."""
    bins = {} if into is None else into
    get = bins.get
    for t_end, seconds, count in points:
        lo = t_end - seconds
        # ``seconds`` as the clock's floats hold it: the overlaps sum to it exactly (to
        # ``seconds`` only within ~1e-6 at epoch times), so a point adds exactly its count
        span = t_end - lo
        k = math.floor(lo / step)
        start = k * step
        while start < t_end:  # min and max spelled out: thousands of points a second
            top = start + step
            overlap = (t_end if t_end < top else top) - (lo if lo > start else start)
            if overlap > 0:
                bins[start] = get(start, 0.0) + count * overlap / span
            k += 1
            start = k * step
    return bins
