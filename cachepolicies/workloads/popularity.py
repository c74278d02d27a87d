"""Which functions a trace keeps, by popularity (CremeBrulee §VI-A, "Event Generation")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepolicies.workloads.errors import WorkloadError


@dataclass(frozen=True)
class PopularityFilter:
    """The outcome of ``filter_by_popularity``: ``keep`` is a boolean mask over functions."""

    keep: np.ndarray
    threshold: float  # the popularity quantile; functions invoked more often are dropped
    invoked: int  # functions invoked at least once
    too_popular: int  # dropped: above the quantile
    one_hit: int  # dropped: invoked exactly once (0 when one-hit wonders are kept)


def filter_by_popularity(totals: np.ndarray, quantile: float = 0.9,
                         drop_one_hit: bool = True) -> PopularityFilter:
    """Keep functions invoked at least once and at most the ``quantile``-th quantile of
    popularity; drop one-hit wonders (invoked exactly once) if ``drop_one_hit``.

    ``totals`` are invocations per function over the whole window. The quantile is taken
    over the invoked functions only (the trace lists idle ones too) and before one-hit
    wonders are dropped. The paper drops functions above the 0.9 quantile: the most
    popular would run on dedicated accelerators. ``quantile=1`` keeps them all.
    """
    if not 0.0 < quantile <= 1.0:
        raise WorkloadError(f"quantile must be in (0, 1], got {quantile}")
    totals = np.asarray(totals)
    invoked = totals > 0
    if not invoked.any():
        return PopularityFilter(invoked, 0.0, 0, 0, 0)
    threshold = float(np.quantile(totals[invoked], quantile))
    too_popular = invoked & (totals > threshold)
    one_hit = (totals == 1) if drop_one_hit else np.zeros_like(invoked)
    keep = invoked & ~too_popular & ~one_hit
    return PopularityFilter(keep, threshold, int(invoked.sum()), int(too_popular.sum()),
                            int(one_hit.sum()))
