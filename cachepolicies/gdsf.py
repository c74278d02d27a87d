"""GreedyDual-Size-Frequency with the reload penalty as the cost.

priority(k) = L + freq(k) · penalty(k) / size(k), set when k is admitted or requested;
L (the inflation value) rises to the priority of each key that leaves, so keys not used
for a while fall behind newly used ones. freq counts requests since the key was last
admitted (it restarts at 1 after an eviction), as in FaaSCache's keep-alive policy.
"""

from __future__ import annotations

import numpy as np

from cachepolicies.base import Key, Policy
from cachepolicies.heap import (
    grow_heap, heap_first_candidate, heap_next_candidate, heap_priority, heap_remove, heap_set,
    new_heap)
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class GDSFStateType(types.StructRef):
    pass


class GDSFState(structref.StructRefProxy):
    pass


structref.define_proxy(GDSFState, GDSFStateType, ["res", "heap", "freq", "inflation"])


@kernel
def new_state(res):
    n = len(res.size)
    return GDSFState(res, new_heap(n), np.zeros(n, np.int64), 0.0)


@kernel
def _on_access(s, i, now):
    if s.res.slot[i] >= 0:
        s.freq[i] += 1
        _update(s, i)
    return True


@kernel
def _on_admit(s, i, now):
    s.freq[i] = 1
    _update(s, i)


@kernel
def _update(s, i):
    size = max(s.res.size[i], 1)
    heap_set(s.heap, i, s.inflation + s.freq[i] * s.res.penalty[i] / size)


@kernel
def _on_remove(s, i):
    priority = heap_priority(s.heap, i)
    heap_remove(s.heap, i)
    if priority > s.inflation:
        s.inflation = priority


@kernel
def _grow(s, capacity):
    grow_heap(s.heap, capacity)
    s.freq = grown(s.freq, capacity, 0)


implements(GDSFStateType, on_access=_on_access, on_admit=_on_admit, on_remove=_on_remove,
           first_candidate=heap_first_candidate,
           next_candidate=heap_next_candidate, grow=_grow)


@kernel
def _priority(s, i):
    return heap_priority(s.heap, i) if s.res.slot[i] >= 0 else 0.0


class GDSF(Policy):
    name = "gdsf"

    def __init__(self) -> None:
        super().__init__()
        self._state = new_state(self._res)

    def priority(self, key: Key, now: float) -> float:
        i = self._ids.get(key)
        return 0.0 if i is None else _priority(self._state, i)
