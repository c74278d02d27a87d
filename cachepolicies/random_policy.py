"""Random: evict uniformly random resident keys (seeded, so runs repeat)."""

from __future__ import annotations

import random
from collections.abc import Iterator

from cachepolicies.base import Key, Policy


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._keys: list[Key] = []
        self._index: dict[Key, int] = {}

    def record_access(self, key: Key, now: float) -> None:
        pass

    def _on_admit(self, key: Key, now: float) -> None:
        self._index[key] = len(self._keys)
        self._keys.append(key)

    def _on_remove(self, key: Key) -> None:
        i = self._index.pop(key)
        last = self._keys.pop()
        if i < len(self._keys):
            self._keys[i] = last
            self._index[last] = i

    def _candidates(self, now: float) -> Iterator[Key]:
        # A lazy Fisher-Yates shuffle over the resident keys.
        keys, index, rng = self._keys, self._index, self._rng
        for i in range(len(keys)):
            j = rng.randrange(i, len(keys))
            keys[i], keys[j] = keys[j], keys[i]
            index[keys[i]] = i
            index[keys[j]] = j
            yield keys[i]
