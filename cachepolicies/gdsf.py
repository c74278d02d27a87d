"""GreedyDual-Size-Frequency with the reload penalty as the cost.

priority(k) = L + freq(k) · penalty(k) / size(k), set when k is admitted or requested;
L (the inflation value) rises to the priority of each key that leaves, so keys not used
for a while fall behind newly used ones. freq counts requests since the key was last
admitted (it restarts at 1 after an eviction), as in FaaSCache's keep-alive policy.
"""

from __future__ import annotations

from cachepolicies.base import HeapPolicy, Key


class GDSF(HeapPolicy):
    name = "gdsf"

    def __init__(self) -> None:
        super().__init__()
        self._inflation = 0.0
        self._freq: dict[Key, int] = {}
        self._prio: dict[Key, float] = {}

    def record_access(self, key: Key, now: float) -> None:
        if key in self._sizes:
            self._freq[key] += 1
            self._update(key)

    def _on_admit(self, key: Key, now: float) -> None:
        self._freq[key] = 1
        self._update(key)

    def _update(self, key: Key) -> None:
        size = max(self._sizes[key], 1)
        prio = self._inflation + self._freq[key] * self._penalties[key] / size
        self._prio[key] = prio
        self._set_priority(key, prio)

    def _on_remove(self, key: Key) -> None:
        super()._on_remove(key)
        self._inflation = max(self._inflation, self._prio.pop(key))
        del self._freq[key]

    def priority(self, key: Key, now: float) -> float:
        return self._prio.get(key, 0.0)
