"""BeladyMIN: evict the resident key whose next request is farthest in the future.

An oracle: it must be given the whole future request sequence. Optimal for unit sizes
and equal penalties; blind to both otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachepolicies.base import HeapPolicy, Key
from cachepolicies.future import OracleClock


class BeladyMin(HeapPolicy):
    name = "beladymin"
    needs_future = True

    def __init__(self, future: Sequence[Key]) -> None:
        super().__init__()
        self._clock = OracleClock(future)
        self._next_use: dict[Key, float] = {}

    def record_access(self, key: Key, now: float) -> None:
        nxt = self._clock.advance(key)
        self._next_use[key] = nxt
        if key in self._sizes:
            self._set_priority(key, -nxt)

    def _on_admit(self, key: Key, now: float) -> None:
        self._set_priority(key, -self._next_use[key])

    def priority(self, key: Key, now: float) -> float:
        """Minus the position of the key's next request (farther = lower)."""
        return -self._next_use.get(key, float("inf"))
