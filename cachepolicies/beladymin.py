"""BeladyMIN: evict the resident key whose next request is farthest in the future.

An oracle: it must be given the whole future request sequence. Optimal for unit sizes
and equal penalties; blind to both otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cachepolicies.base import Key
from cachepolicies.future import Oracle, advance
from cachepolicies.heap import (
    grow_heap, heap_first_candidate, heap_next_candidate, heap_remove, heap_set, new_heap)
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class BeladyMinStateType(types.StructRef):
    pass


class BeladyMinState(structref.StructRefProxy):
    pass


# next_use: per id, the position of its next request (inf: never, or not seen yet).
structref.define_proxy(BeladyMinState, BeladyMinStateType, ["res", "heap", "clock", "next_use"])


@kernel
def new_state(res, clock):
    n = len(res.size)
    return BeladyMinState(res, new_heap(n), clock, np.full(n, np.inf))


@kernel
def _on_access(s, i, now):
    nxt = advance(s.clock, i)
    if math.isnan(nxt):
        return False
    s.next_use[i] = nxt
    if s.res.slot[i] >= 0:
        heap_set(s.heap, i, -nxt)
    return True


@kernel
def _on_admit(s, i, now):
    heap_set(s.heap, i, -s.next_use[i])


@kernel
def _on_remove(s, i):
    heap_remove(s.heap, i)


@kernel
def _grow(s, capacity):
    grow_heap(s.heap, capacity)
    s.next_use = grown(s.next_use, capacity, np.inf)


implements(BeladyMinStateType, on_access=_on_access, on_admit=_on_admit,
           on_remove=_on_remove, first_candidate=heap_first_candidate,
           next_candidate=heap_next_candidate, grow=_grow)


@kernel
def _next_use(s, i):
    return s.next_use[i]


class BeladyMin(Oracle):
    name = "beladymin"

    def __init__(self, future: Sequence[Key]) -> None:
        super().__init__(future)
        self._state = new_state(self._res, self._clock)

    def priority(self, key: Key, now: float) -> float:
        """Minus the position of the key's next request (farther = lower)."""
        i = self._ids.get(key)
        return -(math.inf if i is None else _next_use(self._state, i))
