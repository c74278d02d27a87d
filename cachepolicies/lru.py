"""Least recently used: evict the resident key requested longest ago.

The resident ids form a doubly linked list, least recent first: ``prev`` / ``nxt``
hold each id's neighbours (-1 past the ends), ``last`` the time of its last request.
"""

from __future__ import annotations

import math

import numpy as np

from cachepolicies.base import Key, Policy
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class LRUStateType(types.StructRef):
    pass


class LRUState(structref.StructRefProxy):
    pass


structref.define_proxy(LRUState, LRUStateType, ["res", "prev", "nxt", "last", "head", "tail"])


@kernel
def new_state(res):
    n = len(res.size)
    return LRUState(res, np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.zeros(n),
                    np.int64(-1), np.int64(-1))


@kernel
def _on_access(s, i, now):
    if s.res.slot[i] >= 0:
        _unlink(s, i)
        _append(s, i, now)
    return True


@kernel
def _on_admit(s, i, now):
    _append(s, i, now)


@kernel
def _on_remove(s, i):
    _unlink(s, i)


@kernel
def _first_candidate(s, now):
    return s.head


@kernel
def _next_candidate(s, now, previous):
    return s.nxt[previous]


@kernel
def _grow(s, capacity):
    s.prev = grown(s.prev, capacity, -1)
    s.nxt = grown(s.nxt, capacity, -1)
    s.last = grown(s.last, capacity, 0.0)


implements(LRUStateType, on_access=_on_access, on_admit=_on_admit, on_remove=_on_remove,
           first_candidate=_first_candidate, next_candidate=_next_candidate, grow=_grow)


@kernel
def _append(s, i, now):
    """Put ``i`` at the most recent end, requested at ``now``."""
    s.prev[i] = s.tail
    s.nxt[i] = -1
    if s.tail >= 0:
        s.nxt[s.tail] = i
    else:
        s.head = i
    s.tail = i
    s.last[i] = now


@kernel
def _unlink(s, i):
    before, after = s.prev[i], s.nxt[i]
    if before >= 0:
        s.nxt[before] = after
    else:
        s.head = after
    if after >= 0:
        s.prev[after] = before
    else:
        s.tail = before


@kernel
def _last_access(s, i):
    return s.last[i] if s.res.slot[i] >= 0 else -math.inf


class LRU(Policy):
    name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self._state = new_state(self._res)

    def priority(self, key: Key, now: float) -> float:
        """The time of the key's last request (-inf when not resident)."""
        i = self._ids.get(key)
        return -math.inf if i is None else _last_access(self._state, i)
