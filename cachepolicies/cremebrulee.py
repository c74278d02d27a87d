"""CremeBrulee (online): evict the lowest utility = penalty / (size · B), B ≈ 1/λ.

The Belady boundary B (time to the model's next request) is estimated from its request
rate λ (paper §V-A), so utility = penalty · λ / size. λ comes from a rate estimator
(``rate``): ``decayed`` (default, half-life ``half_life`` seconds) follows popularity as
it shifts; ``cumulative`` counts the whole history as the paper's artifact does. With
either, the order of two models only changes when one is requested, so a heap holds it,
keyed by log utility = log(penalty / size) + log score (up to a term shared by all).

The eviction set follows §V-B: take lowest utility first until enough bytes are freed,
then keep only the largest of those that suffice.
"""

from __future__ import annotations

import math

import numpy as np

from cachepolicies import rates
from cachepolicies.base import Key, Policy
from cachepolicies.heap import (
    grow_heap, heap_first_candidate, heap_next_candidate, heap_remove, heap_set, new_heap)
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class CremeBruleeStateType(types.StructRef):
    pass


class CremeBruleeState(structref.StructRefProxy):
    pass


# log_worth: log(penalty / size) of each resident id (-inf: no penalty), fixed while resident.
structref.define_proxy(CremeBruleeState, CremeBruleeStateType,
                       ["res", "heap", "rates", "log_worth"])


@kernel
def new_state(res, cumulative, k):
    n = len(res.size)
    return CremeBruleeState(res, new_heap(n), rates.new_rates(cumulative, k, n), np.zeros(n))


@kernel
def _on_access(s, i, now):
    log_rate = rates.record(s.rates, i, now)
    if s.res.slot[i] >= 0:
        heap_set(s.heap, i, s.log_worth[i] + log_rate)
    return True


@kernel
def _on_admit(s, i, now):
    worth = log_worth(s.res, i)
    s.log_worth[i] = worth
    heap_set(s.heap, i, worth + rates.log_score(s.rates, i))


@kernel(inline="always")
def log_worth(res, i):
    """log(penalty / size) of resident ``i`` (-inf: no penalty), the part of its log
    utility that stays while it is resident."""
    penalty = res.penalty[i]
    if penalty <= 0:
        return -math.inf
    return math.log(penalty) - math.log(max(res.size[i], 1))


@kernel
def _on_remove(s, i):
    heap_remove(s.heap, i)


@kernel
def _grow(s, capacity):
    grow_heap(s.heap, capacity)
    rates.grow_rates(s.rates, capacity)
    s.log_worth = grown(s.log_worth, capacity, 0.0)


implements(CremeBruleeStateType, on_access=_on_access, on_admit=_on_admit,
           on_remove=_on_remove, first_candidate=heap_first_candidate,
           next_candidate=heap_next_candidate, grow=_grow)


@kernel
def _utility(s, i, now):
    if s.res.slot[i] < 0:
        return 0.0
    return s.res.penalty[i] * rates.rate(s.rates, i, now) / max(s.res.size[i], 1)


@kernel
def _rate(s, i, now):
    return rates.rate(s.rates, i, now)


class CremeBrulee(Policy):
    name = "cremebrulee"
    trims_eviction_set = True

    def __init__(self, rate: str = "decayed", half_life: float = 600.0) -> None:
        cumulative, k = rates.rate_parameters(rate, half_life)
        super().__init__()
        self.rate, self.half_life = rate, float(half_life)
        self.state_parameters = (cumulative, k)
        self._state = new_state(self._res, *self.state_parameters)

    def priority(self, key: Key, now: float) -> float:
        """Utility in seconds of load time saved per byte per second."""
        i = self._ids.get(key)
        return 0.0 if i is None else _utility(self._state, i, float(now))

    def request_rate(self, key: Key, now: float) -> float:
        i = self._ids.get(key)
        return 0.0 if i is None else _rate(self._state, i, float(now))
