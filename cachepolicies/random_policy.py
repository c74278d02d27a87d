"""Random: evict uniformly random resident keys (seeded, so runs repeat).

Victims are drawn by a lazy Fisher-Yates shuffle of the resident ids (``res.ids``). The
draws are ``random.Random(seed).randrange``'s own: CPython's Mersenne Twister (``mt``,
seeded by Python itself) and its rejection sampling, run in the kernel, so a seed picks
the same victims whoever drives the policy.
"""

from __future__ import annotations

import random

import numpy as np

from cachepolicies.base import Policy
from cachepolicies.jit import structref, types
from cachepolicies.kernels import implements, kernel


@structref.register
class RandomStateType(types.StructRef):
    pass


class RandomState(structref.StructRefProxy):
    pass


structref.define_proxy(RandomState, RandomStateType, ["res", "mt", "mti"])


@kernel
def new_state(res, mt, mti):
    """A state drawing from its own copy of the generator words ``mt`` at index ``mti``."""
    return RandomState(res, mt.copy(), mti)


@kernel
def _first_candidate(s, now):
    return _shuffle_step(s, 0)


@kernel
def _next_candidate(s, now, previous):
    return _shuffle_step(s, s.res.slot[previous] + 1)


@kernel
def _shuffle_step(s, k):
    """Swap a random one of ``res.ids[k:]`` into place ``k`` and return it (-1: no more)."""
    ids, slot, n = s.res.ids, s.res.slot, s.res.count
    if k >= n:
        return -1
    j = k + _randbelow(s, n - k)
    a, b = ids[k], ids[j]
    ids[k], ids[j] = b, a
    slot[b], slot[a] = k, j
    return b


implements(RandomStateType, first_candidate=_first_candidate, next_candidate=_next_candidate)


@kernel
def _randbelow(s, n):
    """A uniform int in [0, n), 0 < n < 2**32, as ``random.Random._randbelow``."""
    bits = 0
    while n >> bits:
        bits += 1
    r = _genrand_uint32(s) >> (32 - bits)
    while r >= n:
        r = _genrand_uint32(s) >> (32 - bits)
    return r


@kernel
def _genrand_uint32(s):
    """The next 32-bit word of MT19937 (Matsumoto & Nishimura, 1998)."""
    mt = s.mt
    if s.mti >= 624:  # regenerate the 624 words
        for k in range(624):
            y = (np.int64(mt[k]) & 0x80000000) | (np.int64(mt[(k + 1) % 624]) & 0x7FFFFFFF)
            word = np.int64(mt[(k + 397) % 624]) ^ (y >> 1)
            if y & 1:
                word ^= 0x9908B0DF
            mt[k] = word
        s.mti = 0
    y = np.int64(mt[s.mti])
    s.mti += 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        words = random.Random(seed).getstate()[1]  # 624 state words, then the index
        self.state_parameters = (np.array(words[:624], dtype=np.uint32), np.int64(words[624]))
        self._state = new_state(self._res, *self.state_parameters)
