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
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from typing import ClassVar

Key = Hashable
Evictable = Callable[[Key], bool]


class InsufficientSpace(Exception):
    """The evictable resident entries cannot free the bytes asked for."""

    def __init__(self, need_bytes: int, freeable_bytes: int):
        super().__init__(
            f"cannot free {need_bytes} bytes: only {freeable_bytes} bytes are evictable"
        )
        self.need_bytes = need_bytes
        self.freeable_bytes = freeable_bytes


class Policy(ABC):
    """Base class: keeps the resident set and builds eviction sets.

    Subclasses say only what differs: how an access updates their state and in which
    order resident keys are candidates for eviction (``_candidates``).
    """

    name: ClassVar[str]
    #: True for oracles that must be given the future request sequence.
    needs_future: ClassVar[bool] = False
    #: CremeBrulee §V-B: after picking lowest-priority entries until enough space is
    #: freed, keep only the largest of them that suffice (fewer models go). Classic
    #: policies (LRU, GDSF, ...) evict strictly in priority order instead.
    trims_eviction_set: ClassVar[bool] = False

    def __init__(self) -> None:
        self._sizes: dict[Key, int] = {}
        self._penalties: dict[Key, float] = {}

    # -- resident set -------------------------------------------------------------
    def __contains__(self, key: Key) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def resident(self) -> list[Key]:
        """The resident keys, in no particular order."""
        return list(self._sizes)

    def size_of(self, key: Key) -> int:
        return self._sizes[key]

    def penalty_of(self, key: Key) -> float:
        return self._penalties[key]

    # -- the four verbs ---------------------------------------------------------------
    @abstractmethod
    def record_access(self, key: Key, now: float) -> None:
        """Note one request for ``key`` at time ``now`` (seconds), resident or not."""

    def admit(self, key: Key, size: int, penalty: float, now: float) -> None:
        """Make ``key`` resident with ``size`` bytes and reload ``penalty`` seconds."""
        sizes = self._sizes
        if key in sizes:
            raise ValueError(f"{key!r} is already resident")
        if size < 0 or penalty < 0:
            what, value = ("size", size) if size < 0 else ("penalty", penalty)
            raise ValueError(f"{what} of {key!r} must be >= 0, got {value}")
        sizes[key] = int(size)
        self._penalties[key] = float(penalty)
        self._on_admit(key, now)

    def choose_victims(
        self, need_bytes: int, now: float, evictable: Evictable | None = None
    ) -> list[Key]:
        """Resident keys whose removal frees at least ``need_bytes``.

        Keys are taken lowest priority first and never more than needed; keys for which
        ``evictable(key)`` is false (in use, pinned) are skipped. Does not remove them:
        the caller calls ``remove`` for each. Raises ``InsufficientSpace`` when all
        evictable keys together free too little.
        """
        if need_bytes <= 0:
            return []
        chosen: list[Key] = []
        freed = 0
        sizes = self._sizes
        if evictable is None:
            for key in self._candidates(now):
                chosen.append(key)
                freed += sizes[key]
                if freed >= need_bytes:
                    break
        else:
            for key in self._candidates(now):
                if evictable(key):
                    chosen.append(key)
                    freed += sizes[key]
                    if freed >= need_bytes:
                        break
        self._candidates_done()
        if freed < need_bytes:
            raise InsufficientSpace(need_bytes, freed)
        if self.trims_eviction_set and len(chosen) > 1:
            chosen = _largest_sufficient(chosen, self._sizes, need_bytes)
        return chosen

    def remove(self, key: Key) -> None:
        """``key`` left the cache. Raises ``KeyError`` when it was not resident."""
        del self._sizes[key]
        del self._penalties[key]
        self._on_remove(key)

    # -- introspection (logs, /v1/cache) ----------------------------------------------
    def priority(self, key: Key, now: float) -> float:
        """The value this policy ranks ``key`` by at ``now``: higher means keep longer."""
        return 0.0

    def request_rate(self, key: Key, now: float) -> float | None:
        """The policy's estimate of requests/s for ``key``, where it keeps one."""
        return None

    # -- what subclasses provide ------------------------------------------------------
    def _on_admit(self, key: Key, now: float) -> None:
        """Hook: ``key`` was just added to the resident set."""

    def _on_remove(self, key: Key) -> None:
        """Hook: ``key`` was just removed from the resident set."""

    @abstractmethod
    def _candidates(self, now: float) -> Iterator[Key]:
        """Resident keys, lowest priority (first to evict) first. May be lazy."""

    def _candidates_done(self) -> None:
        """Hook: the last ``_candidates`` iteration is over (restore popped state)."""


def _largest_sufficient(chosen: list[Key], sizes: dict[Key, int], need: int) -> list[Key]:
    """The shortest largest-first prefix of ``chosen`` freeing ``need`` bytes.

    The prefix is minimal: every member is at least as large as the last one, and the
    prefix without its last member frees less than ``need``.
    """
    by_size = sorted(chosen, key=lambda k: sizes[k], reverse=True)
    kept: list[Key] = []
    freed = 0
    for key in by_size:
        kept.append(key)
        freed += sizes[key]
        if freed >= need:
            break
    return kept


class HeapPolicy(Policy):
    """A policy whose per-key priority only changes when that key is touched.

    Keys are taken in ascending ``(priority, seq)`` order, ``seq`` counting
    ``_set_priority`` calls (so ties go to the key touched longest ago). Subclasses call
    ``_set_priority`` whenever a resident key's priority changes.

    The heap is updated lazily: a priority that rises (the common case: another
    request) is only noted, and a key's heap entry is refreshed when it reaches the top
    of the heap. As priorities never fall behind their heap entry, the first entry that
    is up to date is the true minimum. A priority that falls is pushed at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[float, int, Key]] = []
        self._current: dict[Key, tuple[float, int]] = {}  # key -> (priority, seq)
        self._in_heap: dict[Key, int] = {}  # key -> seq of its entry in the heap
        self._seq = itertools.count()
        self._popped: list[tuple[float, int, Key]] = []

    def _set_priority(self, key: Key, priority: float) -> None:
        seq = next(self._seq)
        current = self._current
        old = current.get(key)
        current[key] = (priority, seq)
        if old is not None and priority >= old[0]:
            return  # rose (or stayed): refreshed lazily when it reaches the top
        if self._popped:
            self._restore_popped()
        in_heap = self._in_heap
        in_heap[key] = seq
        heap = self._heap
        heapq.heappush(heap, (priority, seq, key))
        if len(heap) > 2 * len(in_heap) + 64:
            self._heap = [e for e in heap if in_heap.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def _on_remove(self, key: Key) -> None:
        del self._current[key]
        del self._in_heap[key]

    def _candidates(self, now: float) -> Iterator[Key]:
        if self._popped:
            self._restore_popped()
        heap = self._heap
        popped = self._popped
        current = self._current
        in_heap = self._in_heap
        pop = heapq.heappop
        while heap:
            entry = pop(heap)
            key = entry[2]
            if in_heap.get(key) != entry[1]:
                continue  # superseded, or the key left the cache
            priority, seq = current[key]
            if seq != entry[1]:
                # The priority rose since this entry was pushed: refresh it.
                in_heap[key] = seq
                heapq.heappush(heap, (priority, seq, key))
                continue
            popped.append(entry)
            yield key

    def _candidates_done(self) -> None:
        # The popped entries stay out of the heap until it is next used: by then the
        # caller has removed some of them (the victims), which need not go back.
        pass

    def _restore_popped(self) -> None:
        """Put back the popped entries whose keys are still resident."""
        heap = self._heap
        in_heap = self._in_heap
        for entry in self._popped:
            if in_heap.get(entry[2]) == entry[1]:
                heapq.heappush(heap, entry)
        self._popped.clear()
