"""Popularity: keep the most requested models, evict the lowest estimated rate.

The CremeBrulee paper's non-penalty-aware baseline: it ignores load penalty and size.
"""

from __future__ import annotations

from cachepolicies import rates
from cachepolicies.base import Key, Policy
from cachepolicies.heap import (
    grow_heap, heap_first_candidate, heap_next_candidate, heap_remove, heap_set, new_heap)
from cachepolicies.jit import structref, types
from cachepolicies.kernels import implements, kernel


@structref.register
class PopularityStateType(types.StructRef):
    pass


class PopularityState(structref.StructRefProxy):
    pass


structref.define_proxy(PopularityState, PopularityStateType, ["res", "heap", "rates"])


@kernel
def new_state(res, cumulative, k):
    n = len(res.size)
    return PopularityState(res, new_heap(n), rates.new_rates(cumulative, k, n))


@kernel
def _on_access(s, i, now):
    log_rate = rates.record(s.rates, i, now)
    if s.res.slot[i] >= 0:
        heap_set(s.heap, i, log_rate)
    return True


@kernel
def _on_admit(s, i, now):
    heap_set(s.heap, i, rates.log_score(s.rates, i))


@kernel
def _on_remove(s, i):
    heap_remove(s.heap, i)


@kernel
def _grow(s, capacity):
    grow_heap(s.heap, capacity)
    rates.grow_rates(s.rates, capacity)


implements(PopularityStateType, on_access=_on_access, on_admit=_on_admit,
           on_remove=_on_remove, first_candidate=heap_first_candidate,
           next_candidate=heap_next_candidate, grow=_grow)


@kernel
def _rate(s, i, now):
    return rates.rate(s.rates, i, now)


class Popularity(Policy):
    name = "popularity"
    trims_eviction_set = True

    def __init__(self, rate: str = "decayed", half_life: float = 600.0) -> None:
        cumulative, k = rates.rate_parameters(rate, half_life)
        super().__init__()
        self.rate, self.half_life = rate, float(half_life)
        self.state_parameters = (cumulative, k)
        self._state = new_state(self._res, *self.state_parameters)

    def priority(self, key: Key, now: float) -> float:
        return self.request_rate(key, now)

    def request_rate(self, key: Key, now: float) -> float:
        i = self._ids.get(key)
        return 0.0 if i is None else _rate(self._state, i, float(now))
