"""CremeBrulee-oracle: utility = penalty / (size · B), B = requests until the next use.

B counts requests from the current one to the model's next request (inf if none, so
utility 0). The paper (§V-A) argues the utility order of two cached models cannot change
between their uses; that is false in general: with B shrinking by one per request,
p1/(s1·(n1−t)) < p2/(s2·(n2−t)) can flip as t grows when p1/s1 > p2/s2 and n1 > n2.
So utilities are computed afresh at every eviction rather than kept in a stale order.
Ties go to the model whose next use is farther.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cachepolicies.base import Key, Policy
from cachepolicies.future import OracleClock


class CremeBruleeOracle(Policy):
    name = "cremebrulee-oracle"
    needs_future = True
    trims_eviction_set = True

    def __init__(self, future: Sequence[Key]) -> None:
        super().__init__()
        self._clock = OracleClock(future)
        self._next_use: dict[Key, float] = {}

    def record_access(self, key: Key, now: float) -> None:
        self._next_use[key] = self._clock.advance(key)

    def _utility(self, key: Key) -> float:
        distance = self._next_use[key] - self._clock.position
        return self._penalties[key] / (max(self._sizes[key], 1) * distance)

    def _candidates(self, now: float) -> Iterator[Key]:
        ranked = sorted(self._sizes, key=lambda k: (self._utility(k), -self._next_use[k]))
        return iter(ranked)

    def priority(self, key: Key, now: float) -> float:
        return self._utility(key) if key in self._sizes else 0.0
