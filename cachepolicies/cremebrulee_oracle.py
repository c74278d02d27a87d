"""CremeBrulee-oracle: utility = penalty / (size · B), B = requests until the next use.

B counts requests from the current one to the model's next request (inf if none, so
utility 0). The paper (§V-A) argues the utility order of two cached models cannot change
between their uses; that is false in general: with B shrinking by one per request,
p1/(s1·(n1−t)) < p2/(s2·(n2−t)) can flip as t grows when p1/s1 > p2/s2 and n1 > n2.
So utilities are computed afresh at every eviction rather than kept in a stale order.
Ties go to the model whose next use is farther, then to the one admitted first; an
undefined utility (an infinite penalty never needed again) ranks as infinite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cachepolicies.base import Key
from cachepolicies.future import Oracle, advance
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class CremeBruleeOracleStateType(types.StructRef):
    pass


class CremeBruleeOracleState(structref.StructRefProxy):
    pass


# next_use: per id, the position of its next request (inf: never, or not seen yet).
# Per slot of res.ids, so that an eviction's pass over them runs down contiguous arrays:
# the penalty, max(size, 1), next use and admission number of the id there; utility and
# taken are an eviction's scratch.
structref.define_proxy(CremeBruleeOracleState, CremeBruleeOracleStateType,
                       ["res", "clock", "next_use", "penalty", "size", "next", "admitted",
                        "utility", "taken"])


@kernel
def new_state(res, clock):
    n = len(res.size)
    return CremeBruleeOracleState(res, clock, np.full(n, np.inf), np.zeros(n), np.zeros(n),
                                  np.zeros(n), np.zeros(n, np.int64), np.zeros(n),
                                  np.zeros(n, np.bool_))


@kernel
def _on_access(s, i, now):
    nxt = advance(s.clock, i)
    if math.isnan(nxt):
        return False
    s.next_use[i] = nxt
    if s.res.slot[i] >= 0:
        s.next[s.res.slot[i]] = nxt
    return True


@kernel
def _on_admit(s, i, now):
    k = s.res.slot[i]
    s.penalty[k] = s.res.penalty[i]
    s.size[k] = max(s.res.size[i], 1)
    s.next[k] = s.next_use[i]
    s.admitted[k] = s.res.admitted[i]


@kernel
def _on_remove(s, i):
    """Mirror ``res.ids``: the last slot's id moves into the one leaving."""
    k, last = s.res.slot[i], s.res.count - 1
    s.penalty[k], s.size[k] = s.penalty[last], s.size[last]
    s.next[k], s.admitted[k] = s.next[last], s.admitted[last]


@kernel(error_model="numpy")  # IEEE division: p/0 is inf, 0/0 and inf/inf are NaN
def _first_candidate(s, now):
    """Utilities as of now, then the lowest. An eviction costs O(n) per candidate taken,
    and usually a few suffice."""
    penalty, size, nxt, utility, taken = s.penalty, s.size, s.next, s.utility, s.taken
    position = s.clock.position
    for k in range(s.res.count):
        u = penalty[k] / (size[k] * (nxt[k] - position))
        utility[k] = u if u == u else math.inf
        taken[k] = False
    return _next_candidate(s, now, -1)


@kernel
def _next_candidate(s, now, previous):
    """The lowest utility not taken yet (ties and infinities: ``_ranks_before``)."""
    utility, taken = s.utility, s.taken
    best = -1
    lowest = math.inf
    for k in range(s.res.count):
        if not taken[k] and (best < 0 or utility[k] < lowest or (
                utility[k] == lowest and _ranks_before(s, k, best))):
            best, lowest = k, utility[k]
    if best < 0:
        return -1
    taken[best] = True
    return s.res.ids[best]


@kernel(inline="always")
def _ranks_before(s, k1, k2):
    """Between equal utilities: the farther next use, then the earlier admission."""
    if s.next[k1] != s.next[k2]:
        return s.next[k1] > s.next[k2]
    return s.admitted[k1] < s.admitted[k2]


@kernel
def _grow(s, capacity):
    s.next_use = grown(s.next_use, capacity, np.inf)
    s.penalty = grown(s.penalty, capacity, 0.0)
    s.size = grown(s.size, capacity, 0.0)
    s.next = grown(s.next, capacity, 0.0)
    s.admitted = grown(s.admitted, capacity, 0)
    s.utility = grown(s.utility, capacity, 0.0)
    s.taken = grown(s.taken, capacity, False)


implements(CremeBruleeOracleStateType, on_access=_on_access, on_admit=_on_admit,
           on_remove=_on_remove, first_candidate=_first_candidate,
           next_candidate=_next_candidate, grow=_grow)


@kernel
def _utility(s, i):
    if s.res.slot[i] < 0:
        return 0.0
    distance = s.next_use[i] - s.clock.position
    return s.res.penalty[i] / (max(s.res.size[i], 1) * distance)


class CremeBruleeOracle(Oracle):
    name = "cremebrulee-oracle"
    trims_eviction_set = True

    def __init__(self, future: Sequence[Key]) -> None:
        super().__init__(future)
        self._state = new_state(self._res, self._clock)

    def priority(self, key: Key, now: float) -> float:
        i = self._ids.get(key)
        return 0.0 if i is None else _utility(self._state, i)
