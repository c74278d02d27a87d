"""The future request sequence given to oracle policies (BeladyMIN, CremeBrulee-oracle)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cachepolicies.base import Key

NEVER = math.inf


def next_use_positions(keys: Sequence[Key] | np.ndarray) -> list[float]:
    """For each position i, the position of the next request for ``keys[i]`` (or inf)."""
    n = len(keys)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        nxt = np.full(n, np.inf)
        same = ordered[:-1] == ordered[1:]
        nxt[order[:-1][same]] = order[1:][same]
        return nxt.tolist()
    result = [NEVER] * n
    seen: dict[Key, int] = {}
    for i in range(n - 1, -1, -1):
        key = keys[i]
        j = seen.get(key)
        if j is not None:
            result[i] = j
        seen[key] = i
    return result


class OracleClock:
    """Tracks an oracle policy's position in the future it was given.

    ``advance(key)`` is called once per request, in trace order; it checks the request
    matches the future and returns (position, next position of the same key).
    """

    def __init__(self, future: Sequence[Key] | np.ndarray) -> None:
        if isinstance(future, np.ndarray):
            self._keys = future.tolist()
        else:
            self._keys = list(future)
        self._next = next_use_positions(future)
        self.position = -1

    def advance(self, key: Key) -> float:
        """Step to the next request (which must be for ``key``); return its next use."""
        self.position += 1
        i = self.position
        if i >= len(self._keys) or self._keys[i] != key:
            expected = self._keys[i] if i < len(self._keys) else "end of the future"
            raise ValueError(
                f"oracle out of step at request {i}: got {key!r}, future says {expected!r}"
            )
        return self._next[i]
