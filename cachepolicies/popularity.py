"""Popularity: keep the most requested models, evict the lowest estimated rate.

The CremeBrulee paper's non-penalty-aware baseline: it ignores load penalty and size.
"""

from __future__ import annotations

from cachepolicies.base import HeapPolicy, Key
from cachepolicies.rates import make_rate_estimator


class Popularity(HeapPolicy):
    name = "popularity"
    trims_eviction_set = True

    def __init__(self, rate: str = "decayed", half_life: float = 600.0) -> None:
        super().__init__()
        self._rates = make_rate_estimator(rate, half_life)

    def record_access(self, key: Key, now: float) -> None:
        log_rate = self._rates.record(key, now)
        if key in self._sizes:
            self._set_priority(key, log_rate)

    def _on_admit(self, key: Key, now: float) -> None:
        self._set_priority(key, self._rates.log_score(key))

    def priority(self, key: Key, now: float) -> float:
        return self._rates.rate(key, now)

    def request_rate(self, key: Key, now: float) -> float:
        return self._rates.rate(key, now)
