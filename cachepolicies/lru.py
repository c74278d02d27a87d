"""Least recently used: evict the resident key requested longest ago."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from cachepolicies.base import Key, Policy


class LRU(Policy):
    name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self._last_access: OrderedDict[Key, float] = OrderedDict()  # oldest first

    def record_access(self, key: Key, now: float) -> None:
        last_access = self._last_access
        if key in last_access:
            last_access.move_to_end(key)
            last_access[key] = now

    def _on_admit(self, key: Key, now: float) -> None:
        self._last_access[key] = now

    def _on_remove(self, key: Key) -> None:
        del self._last_access[key]

    def _candidates(self, now: float) -> Iterator[Key]:
        return iter(self._last_access)

    def priority(self, key: Key, now: float) -> float:
        """The time of the key's last request."""
        return self._last_access.get(key, float("-inf"))
