"""Compiled building blocks shared by every policy (numba; interpreted in the node agent,
see ``cachepolicies.jit``).

A policy keeps its state in a numba structref whose arrays are indexed by dense integer
ids (``Policy`` maps keys to ids). Its decisions are ``@kernel`` functions over that
state, registered with ``implements`` as the policy's *verbs*; the generic kernels here
(``access``, ``admit``, ``remove``, ``choose``) call the verbs of whatever state they
are given. The Python methods the agent calls and the simulator's compiled loop both go
through these generic kernels, so they run the very same code.

The verbs a policy provides (``s`` its state, ``i`` an id; ``s.res`` is a ``Resident``):

- ``on_access(s, i, now) -> bool``: a request for ``i``, resident or not; False when
  the policy refuses it (an oracle out of step with its future).
- ``on_admit(s, i, now)``: ``i`` joined the resident set (``s.res`` lists it already).
- ``on_remove(s, i)``: ``i`` is leaving the resident set (``s.res`` still lists it).
- ``first_candidate(s, now)`` and ``next_candidate(s, now, previous)``: the resident ids,
  first to evict first, one at a time (-1 after the last), so a walk stops as soon as it
  has enough. A walk may keep scratch state in ``s`` and may be abandoned at any point;
  it must not change what later calls decide, except for drawing random numbers.
- ``grow(s, capacity)``: make the policy's own per-id arrays hold ``capacity`` ids.

A policy that has nothing to do on access, admission, removal or growth leaves that
verb out.
"""

from __future__ import annotations

import numpy as np

from cachepolicies.jit import COMPILED, njit, overload, structref, types
from cachepolicies.sourcestamp import package_stamp

# -- the kernel decorator ---------------------------------------------------------------
_STAMP = ("cachepolicies", package_stamp()) if COMPILED else None


def kernel(fn=None, **options):
    """``numba.njit(cache=True)``, its on-disk cache tied to the whole package's source.

    numba checks a cached function against its own file only, but a kernel has the code
    of the kernels it calls (other modules' verbs) compiled in; stamping every kernel
    with the package's source hash makes any edit here recompile them all.
    """

    def decorate(fn):
        dispatcher = njit(cache=True, **options)(fn)
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is not None and hasattr(cache_file, "_source_stamp"):
            cache_file._source_stamp = _STAMP
        return dispatcher

    return decorate(fn) if fn is not None else decorate


# -- verbs: declared here, implemented by each policy --------------------------------------
# Compiled, ``implements`` overloads these per state type and their bodies never run;
# interpreted, the bodies dispatch to the implementation on the state's class.
def on_access(s, i, now):
    """A request for id ``i`` at ``now``; False when the policy refuses it."""
    return s.on_access(s, i, now)


def on_admit(s, i, now):
    """Id ``i`` just became resident."""
    s.on_admit(s, i, now)


def on_remove(s, i):
    """Id ``i`` is leaving the resident set."""
    s.on_remove(s, i)


def first_candidate(s, now):
    """The resident id to evict first, starting a walk (-1: none is resident)."""
    return s.first_candidate(s, now)


def next_candidate(s, now, previous):
    """The resident id to evict after ``previous`` in the current walk (-1: no more)."""
    return s.next_candidate(s, now, previous)


def grow(s, capacity):
    """Make the policy's own per-id arrays hold ``capacity`` ids."""
    s.grow(s, capacity)


_VERBS = {verb.__name__: verb for verb in (on_access, on_admit, on_remove, first_candidate,
                                           next_candidate, grow)}


def implements(state_type: type[types.StructRef], *, first_candidate, next_candidate,
               on_access=None, on_admit=None, on_remove=None, grow=None) -> None:
    """Register kernels as the verbs of states of ``state_type`` (a structref type)."""
    kernels = {"first_candidate": first_candidate, "next_candidate": next_candidate,
               "on_access": on_access or _accept, "on_admit": on_admit or _ignore_admit,
               "on_remove": on_remove or _ignore_remove, "grow": grow or _ignore_growth}
    for name, impl in kernels.items():
        if COMPILED:
            _register(_VERBS[name], state_type, impl)
        else:
            setattr(state_type.proxy, name, staticmethod(impl))


def _register(verb, state_type, impl) -> None:
    @overload(verb)
    def typer(s, *args):
        if isinstance(s, state_type):
            def call(s, *args):
                return impl(s, *args)

            return call


@kernel
def _accept(s, i, now):
    return True


@kernel
def _ignore_admit(s, i, now):
    pass


@kernel
def _ignore_remove(s, i):
    pass


@kernel
def _ignore_growth(s, capacity):
    pass


# -- the resident set, common to all policies -----------------------------------------
@structref.register
class ResidentType(types.StructRef):
    pass


class Resident(structref.StructRefProxy):
    """Per id: ``size``, ``penalty``, ``admitted`` (admission number) and ``slot``
    (position in ``ids``, -1 when not resident); ``ids[:count]`` lists the resident ids
    (in no particular order: removal moves the last one into the gap; policies may
    reorder them). ``victims`` is ``choose``'s scratch."""


structref.define_proxy(Resident, ResidentType,
                       ["size", "penalty", "admitted", "slot", "ids", "count", "admissions",
                        "victims"])


@kernel
def new_resident(capacity):
    return Resident(np.zeros(capacity, np.int64), np.zeros(capacity), np.zeros(capacity, np.int64),
                    np.full(capacity, -1, np.int64), np.zeros(capacity, np.int64),
                    np.int64(0), np.int64(0), np.zeros(capacity, np.int64))


@kernel
def grown(a, capacity, fill):
    """``a`` extended to ``capacity`` entries, the new ones set to ``fill``."""
    b = np.empty(capacity, a.dtype)
    b[: len(a)] = a
    b[len(a):] = fill
    return b


@kernel
def grow_state(s, capacity):
    r = s.res
    r.size = grown(r.size, capacity, 0)
    r.penalty = grown(r.penalty, capacity, 0.0)
    r.admitted = grown(r.admitted, capacity, 0)
    r.slot = grown(r.slot, capacity, -1)
    r.ids = grown(r.ids, capacity, 0)
    r.victims = grown(r.victims, capacity, 0)
    grow(s, capacity)


@kernel
def is_resident(r, i):
    return r.slot[i] >= 0


@kernel
def resident_count(r):
    return r.count


@kernel
def resident_ids(r):
    """The resident ids in admission order."""
    ids = r.ids[: r.count].copy()
    return ids[np.argsort(r.admitted[ids], kind="mergesort")]


@kernel
def size_of(r, i):
    return r.size[i]


@kernel
def penalty_of(r, i):
    return r.penalty[i]


# -- the four verbs, for any policy -------------------------------------------------------
@kernel
def access(s, i, now):
    return on_access(s, i, now)


@kernel
def admit(s, i, size, penalty, now):
    r = s.res
    r.size[i] = size
    r.penalty[i] = penalty
    r.admitted[i] = r.admissions
    r.admissions += 1
    r.slot[i] = r.count
    r.ids[r.count] = i
    r.count += 1
    on_admit(s, i, now)


@kernel
def remove(s, i):
    on_remove(s, i)
    r = s.res
    slots, ids = r.slot, r.ids
    slot = slots[i]
    slots[i] = -1
    r.count -= 1
    if slot < r.count:
        last = ids[r.count]
        ids[slot] = last
        slots[last] = slot


@kernel
def choose(s, need, now, busy_until, trims):
    """(victims, freed): candidates in order, skipping ids with ``busy_until > now``,
    until they free ``need`` bytes (freed < need: all of them are too little). With
    ``trims``, keep only the largest of them that suffice (CremeBrulee §V-B). The
    victims may be a view of scratch space: use them before the next ``choose``."""
    r = s.res
    victims, size = r.victims, r.size
    n = 0
    freed = 0
    i = first_candidate(s, now)
    while i >= 0:
        if busy_until[i] <= now:
            victims[n] = i
            n += 1
            freed += size[i]
            if freed >= need:
                break
        i = next_candidate(s, now, i)
    if trims and freed >= need and n > 1:
        return largest_sufficient(victims[:n], size, need), freed
    return victims[:n], freed


@kernel
def largest_sufficient(victims, size, need):
    """The shortest largest-first prefix of ``victims`` freeing ``need`` bytes (ties
    keep their order): each one kept is at least as large as the last, and without the
    last they free less than ``need``. Reorders ``victims`` in place; O(k · kept), and
    the largest alone usually suffices."""
    freed = 0
    for n in range(len(victims)):
        largest = n
        for k in range(n + 1, len(victims)):
            if size[victims[k]] > size[victims[largest]]:
                largest = k
        chosen = victims[largest]
        for k in range(largest, n, -1):  # keep the others in their order
            victims[k] = victims[k - 1]
        victims[n] = chosen
        freed += size[chosen]
        if freed >= need:
            return victims[: n + 1]
    return victims


@kernel
def eviction_order(s, now):
    """All resident ids, first to evict first (introspection and tests)."""
    order = np.empty(s.res.count, np.int64)
    n = 0
    i = first_candidate(s, now)
    while i >= 0:
        order[n] = i
        n += 1
        i = next_candidate(s, now, i)
    return order[:n]
