"""The future request sequence given to oracle policies (BeladyMIN, CremeBrulee-oracle).

An oracle interns the future's keys and keeps a ``Clock`` in its state: the future as
ids, each request's next-use position, and the position of the current request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cachepolicies.base import Ids, Key, Policy
from cachepolicies.jit import structref, types
from cachepolicies.kernels import kernel

NEVER = math.inf


def next_use_positions(keys: Sequence[Key] | np.ndarray) -> np.ndarray:
    """For each position i, the position of the next request for ``keys[i]`` (or inf)."""
    ids = Ids().intern_many(keys)
    return next_uses(ids, int(ids.max()) + 1 if len(ids) else 0)


@kernel
def next_uses(ids, n_ids):
    """Per position of ``ids`` (dense, below ``n_ids``), the next position of its id."""
    nxt = np.full(len(ids), NEVER)
    last = np.full(n_ids, -1, np.int64)  # per id, its latest position seen (scanning back)
    for p in range(len(ids) - 1, -1, -1):
        if last[ids[p]] >= 0:
            nxt[p] = last[ids[p]]
        last[ids[p]] = p
    return nxt


@structref.register
class ClockType(types.StructRef):
    pass


class Clock(structref.StructRefProxy):
    """``future`` (ids), ``next`` (per position, the next position of the same id) and
    ``position``, the current request's (-1 before the first)."""


structref.define_proxy(Clock, ClockType, ["future", "next", "position"])


@kernel
def new_clock(future, nxt):
    return Clock(future, nxt, np.int64(-1))


@kernel
def advance(c, i):
    """Step to the next request, which must be for id ``i``: return that request's next
    use, or NaN when the future says otherwise (out of step)."""
    c.position += 1
    p = c.position
    if p >= len(c.future) or c.future[p] != i:
        return np.nan
    return c.next[p]


@kernel
def clock_position(c):
    return c.position


class Oracle(Policy):
    """Base of the oracles: interns the future and builds its ``Clock`` (``_clock``)."""

    needs_future = True

    def __init__(self, future: Sequence[Key] | np.ndarray) -> None:
        ids = Ids()
        self._future = ids.intern_many(future)
        super().__init__(ids)
        self._clock = new_clock(self._future, next_uses(self._future, len(ids)))

    def _out_of_step(self, key: Key) -> Exception:
        i = clock_position(self._clock)
        expected = (self._ids.keys[self._future[i]] if i < len(self._future)
                    else "end of the future")
        return ValueError(
            f"oracle out of step at request {i}: got {key!r}, future says {expected!r}"
        )
