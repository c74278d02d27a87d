"""An indexed binary min-heap of ids by ``(priority, seq)``, for heap-ordered policies.

``seq`` counts ``heap_set`` calls, so of equal priorities the id set longest ago comes
first. Keys are kept by heap position and each id's position is tracked, so a new
priority (up or down) or a removal is O(log n) in place, and ``heap_first`` /
``heap_next`` walk the ids in order without changing the heap. A policy using it keeps
it as ``s.heap``, holding its resident ids.
"""

from __future__ import annotations

import numpy as np

from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, kernel


@structref.register
class HeapType(types.StructRef):
    pass


class Heap(structref.StructRefProxy):
    """``pos`` per id (-1: absent); ``ids``, ``prio`` and ``seq`` per heap position;
    ``frontier[:reach]``: a walk's next positions, itself a min-heap."""


structref.define_proxy(Heap, HeapType,
                       ["pos", "ids", "prio", "seq", "size", "sets", "frontier", "reach"])


@kernel
def new_heap(capacity):
    return Heap(np.full(capacity, -1, np.int64), np.zeros(capacity, np.int64), np.zeros(capacity),
                np.zeros(capacity, np.int64), np.int64(0), np.int64(0),
                np.zeros(capacity, np.int64), np.int64(0))


@kernel
def grow_heap(h, capacity):
    h.pos = grown(h.pos, capacity, -1)
    h.ids = grown(h.ids, capacity, 0)
    h.prio = grown(h.prio, capacity, 0.0)
    h.seq = grown(h.seq, capacity, 0)
    h.frontier = grown(h.frontier, capacity, 0)


@kernel
def heap_set(h, i, priority):
    """Give id ``i`` (added if absent) ``priority`` and the next seq."""
    p = h.pos[i]
    if p < 0:
        p = h.size
        h.size += 1
        h.ids[p] = i
        h.pos[i] = p
    h.prio[p] = priority
    h.seq[p] = h.sets
    h.sets += 1
    _sift_down(h, _sift_up(h, p))


@kernel
def heap_remove(h, i):
    p = h.pos[i]
    h.pos[i] = -1
    h.size -= 1
    if p < h.size:
        _move(h.ids, h.pos, h.prio, h.seq, h.size, p)
        _sift_down(h, _sift_up(h, p))


@kernel
def heap_priority(h, i):
    return h.prio[h.pos[i]]


@kernel
def heap_first(h):
    """The first id by (priority, seq), starting a walk (-1: the heap is empty).

    The walk goes best-first down the tree: the frontier holds the positions whose
    parents were taken, so the k-th id costs O(log k).
    """
    h.reach = 0
    if h.size == 0:
        return -1
    _frontier_push(h, 0)
    return h.ids[_frontier_pop(h)]


@kernel
def heap_next(h, previous):
    """The id after ``previous`` in the walk ``heap_first`` started (-1: no more)."""
    p = h.pos[previous]
    for child in (2 * p + 1, 2 * p + 2):
        if child < h.size:
            _frontier_push(h, child)
    if h.reach == 0:
        return -1
    return h.ids[_frontier_pop(h)]


@kernel
def heap_order(h):
    """All ids by (priority, seq)."""
    order = np.empty(h.size, np.int64)
    n = 0
    i = heap_first(h)
    while i >= 0:
        order[n] = i
        n += 1
        i = heap_next(h, i)
    return order


@kernel
def heap_first_candidate(s, now):
    """The ``first_candidate`` verb of a heap-ordered policy."""
    return heap_first(s.heap)


@kernel
def heap_next_candidate(s, now, previous):
    """The ``next_candidate`` verb of a heap-ordered policy."""
    return heap_next(s.heap, previous)


# The loops below take the arrays out of ``h`` once: reading a structref's field costs
# a reference count increment and decrement each time.
@kernel
def _sift_up(h, p):
    """Move the entry at ``p`` up to its place; return where it ends."""
    ids, pos, prio, seq = h.ids, h.pos, h.prio, h.seq
    i, priority, order = ids[p], prio[p], seq[p]
    while p > 0:
        parent = (p - 1) >> 1
        if not _less(priority, order, prio[parent], seq[parent]):
            break
        _move(ids, pos, prio, seq, parent, p)
        p = parent
    ids[p], pos[i], prio[p], seq[p] = i, p, priority, order
    return p


@kernel
def _sift_down(h, p):
    ids, pos, prio, seq = h.ids, h.pos, h.prio, h.seq
    n = h.size
    i, priority, order = ids[p], prio[p], seq[p]
    while True:
        child = 2 * p + 1
        if child >= n:
            break
        if child + 1 < n and _less(prio[child + 1], seq[child + 1], prio[child], seq[child]):
            child += 1
        if not _less(prio[child], seq[child], priority, order):
            break
        _move(ids, pos, prio, seq, child, p)
        p = child
    ids[p], pos[i], prio[p], seq[p] = i, p, priority, order


@kernel
def _frontier_push(h, p):
    """Add heap position ``p`` to the frontier."""
    frontier, prio, seq = h.frontier, h.prio, h.seq
    k = h.reach
    h.reach += 1
    while k > 0:
        parent = (k - 1) >> 1
        q = frontier[parent]
        if not _less(prio[p], seq[p], prio[q], seq[q]):
            break
        frontier[k] = q
        k = parent
    frontier[k] = p


@kernel
def _frontier_pop(h):
    """Take the frontier's best position out and return it."""
    frontier, prio, seq = h.frontier, h.prio, h.seq
    top = frontier[0]
    h.reach -= 1
    n = h.reach
    if n > 0:
        p = frontier[n]
        k = 0
        while True:
            child = 2 * k + 1
            if child >= n:
                break
            a = frontier[child]
            if child + 1 < n:
                b = frontier[child + 1]
                if _less(prio[b], seq[b], prio[a], seq[a]):
                    child, a = child + 1, b
            if not _less(prio[a], seq[a], prio[p], seq[p]):
                break
            frontier[k] = a
            k = child
        frontier[k] = p
    return top


@kernel(inline="always")
def _less(priority1, seq1, priority2, seq2):
    """(priority1, seq1) < (priority2, seq2)."""
    return priority1 < priority2 or (priority1 == priority2 and seq1 < seq2)


@kernel(inline="always")
def _move(ids, pos, prio, seq, source, target):
    """Move the entry at heap position ``source`` to ``target``."""
    i = ids[source]
    ids[target], pos[i], prio[target], seq[target] = i, target, prio[source], seq[source]
