"""The simulator's hot loop, compiled: ``simulator._replay``'s request handling (the
``MemoryPool`` books with every model evictable), calling the policy's kernels
(``cachepolicies.kernels``) directly instead of its Python methods.

It works on the policy's ids (the caller maps model ids to them) and returns a status
besides its counts: ``DONE``, ``TOO_LITTLE`` (the victims freed too little), or the
index of the request the policy refused (an oracle out of step with its future).
"""

from __future__ import annotations

import math

import numpy as np

from cachepolicies.kernels import access, admit, choose, kernel, remove

DONE = -1
TOO_LITTLE = -2


@kernel
def replay(s, trims, ids, times, size, penalty, capacity):
    """Count the loads per id: a miss costs its penalty, a hit nothing."""
    resident = np.zeros(len(size), np.bool_)
    loads = np.zeros(len(size), np.int64)
    idle = np.full(len(size), -math.inf)  # nothing is ever in use
    used = 0
    for r in range(len(ids)):
        i, now = ids[r], times[r]
        if not access(s, i, now):
            return loads, r
        if resident[i]:
            continue
        used += size[i]
        if used > capacity:
            victims, _ = choose(s, used - capacity, now, idle, trims)
            for v in victims:
                if not resident[v]:
                    return loads, TOO_LITTLE
                remove(s, v)
                resident[v] = False
                used -= size[v]
            if used > capacity:
                return loads, TOO_LITTLE
        admit(s, i, size[i], penalty[i], now)
        resident[i] = True
        loads[i] += 1
    return loads, DONE
