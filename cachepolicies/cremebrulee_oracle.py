"""CremeBrulee-oracle: utility = penalty / (size · B), B = requests until the next use.

B counts requests from the current one to the model's next request (inf if none, so
utility 0). The paper (§V-A) argues the utility order of two cached models cannot change
between their uses; that is false in general: with B shrinking by one per request,
p1/(s1·(n1−t)) < p2/(s2·(n2−t)) can flip as t grows when p1/s1 > p2/s2 and n1 > n2.
So utilities are computed afresh at every eviction rather than kept in a stale order.
Ties go to the model whose next use is farther.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

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
        # Resident keys in slots (swap-with-last on removal) so an eviction ranks them
        # with numpy: penalty, max(size, 1), next use and admission order per slot.
        self._slot: dict[Key, int] = {}
        self._keys: list[Key] = []
        self._slot_penalty = np.empty(16)
        self._slot_size = np.empty(16)
        self._slot_next = np.empty(16)
        self._slot_order = np.empty(16, dtype=np.int64)
        self._admissions = 0

    def record_access(self, key: Key, now: float) -> None:
        nxt = self._clock.advance(key)
        self._next_use[key] = nxt
        slot = self._slot.get(key)
        if slot is not None:
            self._slot_next[slot] = nxt

    def _utility(self, key: Key) -> float:
        distance = self._next_use[key] - self._clock.position
        return self._penalties[key] / (max(self._sizes[key], 1) * distance)

    def _on_admit(self, key: Key, now: float) -> None:
        slot = len(self._keys)
        if slot == len(self._slot_next):
            self._grow()
        self._slot[key] = slot
        self._keys.append(key)
        self._slot_penalty[slot] = self._penalties[key]
        self._slot_size[slot] = max(self._sizes[key], 1)
        self._slot_next[slot] = self._next_use.setdefault(key, math.inf)
        self._slot_order[slot] = self._admissions
        self._admissions += 1

    def _on_remove(self, key: Key) -> None:
        slot = self._slot.pop(key)
        last = len(self._keys) - 1
        moved = self._keys.pop()
        if slot != last:
            self._keys[slot] = moved
            self._slot[moved] = slot
            for column in (self._slot_penalty, self._slot_size, self._slot_next, self._slot_order):
                column[slot] = column[last]

    def _grow(self) -> None:
        grown = 2 * len(self._slot_next)
        for name in ("_slot_penalty", "_slot_size", "_slot_next", "_slot_order"):
            old = getattr(self, name)
            new = np.empty(grown, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _candidates(self, now: float) -> Iterator[Key]:
        """Lowest utility first; ties: next use farther first, then admitted earlier."""
        n = len(self._keys)
        if n == 0:
            return
        nxt = self._slot_next[:n]
        order = self._slot_order[:n]
        keys = self._keys
        # A fresh array: taken slots are set to inf. One O(n) pass per candidate, as
        # usually a few victims suffice.
        with np.errstate(invalid="ignore"):
            utility = self._slot_penalty[:n] / (self._slot_size[:n] * (nxt - self._clock.position))
        taken = []
        while len(taken) < n:
            low = utility.min()
            if low != low:  # NaN: an infinite penalty never needed again; keep it last
                utility[np.isnan(utility)] = math.inf
                continue
            if low == math.inf:
                break
            tied = np.flatnonzero(utility == low)
            if len(tied) > 1:
                farthest = nxt[tied]
                tied = tied[farthest == farthest.max()]
            slot = int(tied[np.argmin(order[tied])] if len(tied) > 1 else tied[0])
            utility[slot] = math.inf
            taken.append(slot)
            yield keys[slot]
        # Whatever is left has infinite utility (an infinite penalty): by tie-breaks.
        rest = np.setdiff1d(np.arange(n), taken)
        for slot in rest[np.lexsort((order[rest], -nxt[rest]))].tolist():
            yield keys[slot]

    def priority(self, key: Key, now: float) -> float:
        return self._utility(key) if key in self._sizes else 0.0
