"""The eviction-policy interface shared by the simulator and the node agent's cache.

Every policy has the same four verbs (libCacheSim style):

- ``record_access(key, now)``: a request for ``key`` arrived at ``now`` (resident or
  not). Called for every request, *before* ``admit`` on a miss.
- ``admit(key, size, penalty, now)``: ``key`` became resident, taking ``size`` bytes,
  and costs ``penalty`` seconds to load again if evicted.
- ``choose_victims(need_bytes, now, evictable)``: resident keys whose removal frees at
  least ``need_bytes``; the caller then calls ``remove`` for each.
- ``remove(key)``: ``key`` left the cache (evicted or unloaded).

A policy never reads a clock (time is passed in) and never tracks capacity: the caller
(simulator or live cache) owns the byte budget and asks for victims when it needs room.

The decisions themselves are compiled kernels over arrays indexed by dense integer ids
(``cachepolicies.kernels``); these methods map keys to ids and back. The simulator's
compiled loop calls the same kernels, so it decides exactly as these methods do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from typing import ClassVar

import numpy as np

from cachepolicies import kernels
from cachepolicies.pool import InsufficientSpace

Key = Hashable
Evictable = Callable[[Key], bool]

#: Ids the arrays hold at first; they double as more keys are seen.
INITIAL_CAPACITY = 64


class Ids:
    """Dense integer ids 0, 1, 2, ... for hashable keys, in the order they are interned."""

    def __init__(self) -> None:
        self._index: dict[Key, int] = {}
        self.keys: list[Key] = []  # id -> key

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, key: Key) -> int | None:
        return self._index.get(key)

    def intern(self, key: Key) -> int:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.keys)
            self.keys.append(key)
        return i

    def intern_many(self, keys: Iterable[Key] | np.ndarray) -> np.ndarray:
        """The ids of ``keys``, interning new ones (fast for numpy integer arrays)."""
        if not (isinstance(keys, np.ndarray) and keys.dtype.kind in "iu" and keys.size):
            return np.array([self.intern(k) for k in keys], dtype=np.int64)
        keys = keys.astype(np.int64, copy=False)
        if keys.min() >= 0 and keys.max() <= 4 * keys.size:  # dense, as model ids: O(n)
            distinct = np.flatnonzero(np.bincount(keys))
            table = np.zeros(distinct[-1] + 1, dtype=np.int64)
            table[distinct] = self._intern_distinct(distinct.tolist())
            return table[keys]
        distinct, inverse = np.unique(keys, return_inverse=True)
        ids = np.array(self._intern_distinct(distinct.tolist()), dtype=np.int64)
        return ids[inverse.reshape(-1)]

    def _intern_distinct(self, keys: list[Key]) -> list[int]:
        """The ids of ``keys`` (distinct), interning new ones in order."""
        if self.keys:
            return [self.intern(k) for k in keys]
        self.keys = list(keys)  # all new: 0, 1, 2, ... (the simulator's 40k models at once)
        self._index = dict(zip(self.keys, range(len(self.keys))))
        return list(range(len(self.keys)))


class Policy:
    """Base class: maps keys to ids and calls the kernels; subclasses build the state.

    A subclass's ``__init__`` calls ``super().__init__()`` and then sets ``self._state``
    to its structref (which holds ``self._res``), made by its module's
    ``new_state(self._res, *self.state_parameters)``; its verbs are kernels registered
    with ``kernels.implements``.
    """

    name: ClassVar[str]
    #: True for oracles that must be given the future request sequence.
    needs_future: ClassVar[bool] = False
    #: CremeBrulee §V-B: after picking lowest-priority entries until enough space is
    #: freed, keep only the largest of them that suffice (fewer models go). Classic
    #: policies (LRU, GDSF, ...) evict strictly in priority order instead.
    trims_eviction_set: ClassVar[bool] = False
    #: The arguments after ``res`` of the policy module's ``new_state`` kernel, which a
    #: replay building a state of its own passes (``cachepolicies.native``); an oracle's
    #: state takes its clock instead, built from the replayed trace.
    state_parameters: tuple = ()

    def __init__(self, ids: Ids | None = None) -> None:
        """``ids``: keys known up front (an oracle's future), so arrays start big enough."""
        self._ids = ids if ids is not None else Ids()
        self._capacity = INITIAL_CAPACITY
        while self._capacity < len(self._ids):
            self._capacity *= 2
        self._res = kernels.new_resident(self._capacity)
        self._state: object = None

    # -- resident set -------------------------------------------------------------
    def __contains__(self, key: Key) -> bool:
        i = self._ids.get(key)
        return i is not None and kernels.is_resident(self._res, i)

    def __len__(self) -> int:
        return kernels.resident_count(self._res)

    def resident(self) -> list[Key]:
        """The resident keys, in admission order."""
        keys = self._ids.keys
        return [keys[i] for i in kernels.resident_ids(self._res).tolist()]

    def size_of(self, key: Key) -> int:
        return int(kernels.size_of(self._res, self._resident_id(key)))

    def penalty_of(self, key: Key) -> float:
        return float(kernels.penalty_of(self._res, self._resident_id(key)))

    # -- the four verbs ---------------------------------------------------------------
    def record_access(self, key: Key, now: float) -> None:
        """Note one request for ``key`` at time ``now`` (seconds), resident or not."""
        if not kernels.access(self._state, self._id(key), float(now)):
            raise self._out_of_step(key)

    def admit(self, key: Key, size: int, penalty: float, now: float) -> None:
        """Make ``key`` resident with ``size`` bytes and reload ``penalty`` seconds."""
        if key in self:
            raise ValueError(f"{key!r} is already resident")
        if size < 0 or penalty < 0:
            what, value = ("size", size) if size < 0 else ("penalty", penalty)
            raise ValueError(f"{what} of {key!r} must be >= 0, got {value}")
        kernels.admit(self._state, self._id(key), int(size), float(penalty), float(now))

    def choose_victims(
        self, need_bytes: int, now: float, evictable: Evictable | None = None
    ) -> list[Key]:
        """Resident keys whose removal frees at least ``need_bytes``.

        Keys are taken lowest priority first and never more than needed; keys for which
        ``evictable(key)`` is false (in use, pinned) are skipped (it is asked once per
        resident key). Does not remove them: the caller calls ``remove`` for each.
        Raises ``InsufficientSpace`` when all evictable keys together free too little.
        """
        if need_bytes <= 0:
            return []
        keys = self._ids.keys
        # The kernels skip ids busy after ``now``: a key that is not evictable is busy forever.
        busy_until = np.full(self._capacity, -math.inf)
        if evictable is not None:
            for i in kernels.resident_ids(self._res).tolist():
                if not evictable(keys[i]):
                    busy_until[i] = math.inf
        victims, freed = kernels.choose(self._state, math.ceil(need_bytes), float(now),
                                        busy_until, self.trims_eviction_set)
        if freed < need_bytes:
            raise InsufficientSpace(need_bytes, int(freed))
        return [keys[i] for i in victims.tolist()]

    def remove(self, key: Key) -> None:
        """``key`` left the cache. Raises ``KeyError`` when it was not resident."""
        kernels.remove(self._state, self._resident_id(key))

    # -- introspection (logs, /v1/cache) ----------------------------------------------
    def priority(self, key: Key, now: float) -> float:
        """The value this policy ranks ``key`` by at ``now``: higher means keep longer."""
        return 0.0

    def request_rate(self, key: Key, now: float) -> float | None:
        """The policy's estimate of requests/s for ``key``, where it keeps one."""
        return None

    def _candidates(self, now: float) -> list[Key]:
        """All resident keys, first to evict first (what ``choose_victims`` walks)."""
        keys = self._ids.keys
        return [keys[i] for i in kernels.eviction_order(self._state, float(now)).tolist()]

    # -- ids ----------------------------------------------------------------------------
    def _id(self, key: Key) -> int:
        """The id of ``key``, interning it (and growing the arrays) when new."""
        i = self._ids.intern(key)
        if i >= self._capacity:
            self._fit()
        return i

    def _intern_all(self, keys: Iterable[Key] | np.ndarray) -> np.ndarray:
        """The ids of ``keys``, interning new ones (the simulator's model ids)."""
        ids = self._ids.intern_many(keys)
        self._fit()
        return ids

    def _fit(self) -> None:
        """Grow the arrays (doubling) until they hold every interned id."""
        capacity = self._capacity
        while capacity < len(self._ids):
            capacity *= 2
        if capacity != self._capacity:
            kernels.grow_state(self._state, capacity)
            self._capacity = capacity

    def _resident_id(self, key: Key) -> int:
        i = self._ids.get(key)
        if i is None or not kernels.is_resident(self._res, i):
            raise KeyError(key)
        return i

    def _out_of_step(self, key: Key) -> Exception:
        """The error for a request the policy refused (only oracles refuse)."""
        return RuntimeError(f"policy {self.name!r} refused a request for {key!r}")
