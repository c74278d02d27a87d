"""The simulator's hot loops, compiled: ``simulator``'s request handling, calling the
policy's kernels (``cachepolicies.kernels``) directly instead of its Python methods.

They work on the policy's ids (the caller maps model ids to them) and return a status
besides their counts: ``DONE``, ``TOO_LITTLE`` (the victims freed too little), or the
index of the request the policy refused (an oracle out of step with its future).
"""

from __future__ import annotations

import heapq
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


@kernel
def replay_queued(s, trims, ids, times, size, penalty, exec_seconds, capacity, workers):
    """The FIFO N-worker replay (``simulator``'s docstring); also the response times."""
    n = len(size)
    resident = np.zeros(n, np.bool_)
    loads = np.zeros(n, np.int64)
    ready_at = np.zeros(n)  # when the id's load completes
    busy_until = np.full(n, -math.inf)  # when its last in-flight request finishes
    free_at = [0.0] * workers  # min-heap of worker free times
    response = np.empty(len(ids))
    used = 0
    start = -math.inf
    for r in range(len(ids)):
        i, arrival = ids[r], times[r]
        start = _max(_max(arrival, heapq.heappop(free_at)), start)
        if not access(s, i, start):
            return loads, response, r
        if resident[i]:
            finish = _max(start, ready_at[i]) + exec_seconds[i]
        else:
            while used + size[i] > capacity:
                need = used + size[i] - capacity
                victims, freed = choose(s, need, start, busy_until, trims)
                if freed < need:
                    # Everything evictable is too little: wait for in-flight requests.
                    start = _next_finish(resident, busy_until, start)
                    if start == math.inf:
                        return loads, response, TOO_LITTLE
                    continue
                for v in victims:
                    remove(s, v)
                    resident[v] = False
                    used -= size[v]
            admit(s, i, size[i], penalty[i], start)
            resident[i] = True
            used += size[i]
            loads[i] += 1
            ready_at[i] = start + penalty[i]
            finish = ready_at[i] + exec_seconds[i]
        busy_until[i] = _max(busy_until[i], finish)
        heapq.heappush(free_at, finish)
        response[r] = finish - arrival
    return loads, response, DONE


@kernel
def _max(a, b):
    """Python's ``max(a, b)``: ``a`` unless ``b`` is larger."""
    return b if b > a else a


@kernel
def _next_finish(resident, busy_until, after):
    """The earliest time after ``after`` that a resident id's requests finish (inf: none)."""
    soonest = math.inf
    for i in range(len(resident)):
        if resident[i] and after < busy_until[i] < soonest:
            soonest = busy_until[i]
    return soonest
