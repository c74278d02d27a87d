"""CremeBrulee (online): evict the lowest utility = penalty / (size · B), B ≈ 1/λ.

The Belady boundary B (time to the model's next request) is estimated from its request
rate λ (paper §V-A), so utility = penalty · λ / size. λ comes from a rate estimator
(``rate``): ``decayed`` (default, half-life ``half_life`` seconds) follows popularity as
it shifts; ``cumulative`` counts the whole history as the paper's artifact does. With
either, the order of two models only changes when one is requested, so a heap holds it.

The eviction set follows §V-B: take lowest utility first until enough bytes are freed,
then keep only the largest of those that suffice.
"""

from __future__ import annotations

import math

from cachepolicies.base import HeapPolicy, Key
from cachepolicies.rates import make_rate_estimator


class CremeBrulee(HeapPolicy):
    name = "cremebrulee"
    trims_eviction_set = True

    def __init__(self, rate: str = "decayed", half_life: float = 600.0) -> None:
        super().__init__()
        self._rates = make_rate_estimator(rate, half_life)
        # log(penalty / size) of each resident key, fixed while it stays resident.
        self._log_worth: dict[Key, float] = {}

    def record_access(self, key: Key, now: float) -> None:
        log_rate = self._rates.record(key, now)
        log_worth = self._log_worth.get(key)
        if log_worth is not None:
            self._set_priority(key, log_worth + log_rate)

    def _on_admit(self, key: Key, now: float) -> None:
        penalty = self._penalties[key]
        if penalty <= 0:
            log_worth = -math.inf
        else:
            log_worth = math.log(penalty) - math.log(max(self._sizes[key], 1))
        self._log_worth[key] = log_worth
        self._set_priority(key, log_worth + self._rates.log_score(key))

    def _on_remove(self, key: Key) -> None:
        super()._on_remove(key)
        del self._log_worth[key]

    def _log_utility(self, key: Key) -> float:
        """log(penalty · λ / size) up to a term shared by all keys (-inf: no penalty)."""
        return self._log_worth[key] + self._rates.log_score(key)

    def priority(self, key: Key, now: float) -> float:
        """Utility in seconds of load time saved per byte per second."""
        if key not in self._sizes:
            return 0.0
        return self._penalties[key] * self._rates.rate(key, now) / max(self._sizes[key], 1)

    def request_rate(self, key: Key, now: float) -> float:
        return self._rates.rate(key, now)
