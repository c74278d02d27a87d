"""The miss path shared by the simulator and the node agent's cache: one byte budget,
the models resident in it, the reservations of loads in progress, and the policy that
chooses victims.

A miss goes ``reserve`` → (the caller unloads the victims and loads the model) →
``commit`` with the measured size, or ``cancel`` when the load failed. ``reserve`` is
all or nothing: either the room (free bytes plus what the victims free) covers the whole
request and the victims are taken out at once, or nothing changes and the caller waits
for room (a lease ending, a load finishing) and tries again. So two loads never each
hold half of the room, and a load that waits holds nothing.

What a miss costs (``miss_penalty``) is defined here once: the load plus the surplus of
a cold first run over a warm one (CremeBrulee §VI-A measures both), plus the download
where the model's files are not on the node's disk (the three-tier miss: remote → disk
→ memory).

The pool never reads a clock (``now`` is passed in) and never unloads anything itself:
it only keeps the books and asks the policy.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Callable, Protocol

import numpy as np

Key = Hashable


class EvictionPolicy(Protocol):
    """What the pool asks of an eviction policy (``cachepolicies.base.Policy`` is one;
    this module does not import it: the policies import numba, the pool and traces do
    not)."""

    name: str

    def resident(self) -> list[Key]: ...

    def admit(self, key: Key, size: int, penalty: float, now: float) -> None: ...

    def choose_victims(self, need_bytes: int, now: float,
                       evictable: Callable[[Key], bool] | None = None) -> list[Key]: ...

    def remove(self, key: Key) -> None: ...


class InsufficientSpace(Exception):
    """The evictable resident entries cannot free the bytes asked for."""

    def __init__(self, need_bytes: int, freeable_bytes: int):
        super().__init__(
            f"cannot free {need_bytes} bytes: only {freeable_bytes} bytes are evictable"
        )
        self.need_bytes = need_bytes
        self.freeable_bytes = freeable_bytes


class PolicyContractError(RuntimeError):
    """A policy broke its contract (e.g. victims that free too little)."""


def miss_penalty(load_seconds, first_exec_seconds=None, exec_seconds=None,
                 download_seconds=0.0):
    """Seconds a miss adds to a request:
    ``download + load + max(first_exec − exec, 0)``.

    Works on floats and numpy arrays alike; the surplus counts only where both run
    times are known (None or NaN: no surplus), and a cold run faster than a warm one
    is never a discount. ``download_seconds``: the pull of the model's files, where
    they are not on disk (0: they are; NaN counts as 0)."""
    download = np.asarray(download_seconds, dtype=np.float64)
    download = np.where(np.isnan(download), 0.0, np.maximum(download, 0.0))
    load = np.asarray(load_seconds, dtype=np.float64) + download
    if first_exec_seconds is None or exec_seconds is None:
        return load + 0.0
    surplus = np.subtract(np.asarray(first_exec_seconds, dtype=np.float64), exec_seconds)
    surplus = np.where(np.isnan(surplus), 0.0, np.maximum(surplus, 0.0))
    return load + surplus


class MemoryPool:
    """One device's byte budget: resident models (accounted sizes), reservations of
    loads in progress, a fixed ``overhead`` (e.g. a CUDA context) and the policy."""

    def __init__(self, budget: int, policy: EvictionPolicy, *, overhead: int = 0) -> None:
        self.budget = int(budget)
        self.policy = policy
        self.overhead = int(overhead)
        self.used = 0       # bytes of resident models
        self.reserved = 0   # bytes held for loads in progress
        self.sizes: dict[Key, int] = {}

    @property
    def free(self) -> int:
        """Bytes neither resident, reserved nor overhead (negative when over budget)."""
        return self.budget - self.overhead - self.used - self.reserved

    @property
    def capacity(self) -> int:
        """Bytes models may ever take: the budget less the overhead."""
        return self.budget - self.overhead

    def __contains__(self, key: Key) -> bool:
        return key in self.sizes

    def resident(self) -> Iterable[Key]:
        return self.sizes.keys()

    def reserve(self, need: int, now: float,
                evictable: Callable[[Key], bool] = lambda key: True) -> list[Key] | None:
        """Hold ``need`` bytes for a load, all or nothing.

        Returns the victims taken out to make room (already removed from the books and
        the policy: the caller unloads them), ``[]`` when the room was free, or None
        when even every ``evictable`` model together would not make room: then nothing
        changed."""
        over = need - self.free
        victims: list[Key] = []
        if over > 0:
            try:
                victims = self.policy.choose_victims(over, now, evictable)
            except InsufficientSpace:
                return None
            freed = sum(self.sizes[k] for k in victims)
            if freed < over:
                raise PolicyContractError(f"{self.policy.name}'s victims freed too little "
                                          f"({freed} of {over} bytes)")
            for key in victims:
                self.remove(key)
        self.reserved += need
        return victims

    def commit(self, key: Key, reserved: int, size: int, penalty: float, now: float) -> None:
        """A load that held ``reserved`` bytes finished: ``key`` is resident at ``size``
        bytes (its measurement) and costs ``penalty`` seconds to load again."""
        self.reserved -= reserved
        self.used += size
        self.sizes[key] = size
        self.policy.admit(key, size, float(penalty), now)

    def cancel(self, reserved: int) -> None:
        """A load that held ``reserved`` bytes failed or gave up: free them."""
        self.reserved -= reserved

    def remove(self, key: Key) -> int:
        """``key`` leaves the pool (evicted or unloaded); returns the bytes it held."""
        size = self.sizes.pop(key)
        self.used -= size
        self.policy.remove(key)
        return size

    def shed_overdraft(self, now: float,
                       evictable: Callable[[Key], bool] = lambda key: True) -> list[Key]:
        """After a measurement came out larger than its reservation: victims (taken out)
        that bring the pool back within budget, as many as the evictable models allow."""
        over = -self.free
        if over <= 0:
            return []
        try:
            victims = self.policy.choose_victims(over, now, evictable)
        except InsufficientSpace:
            victims = [k for k in list(self.policy.resident()) if evictable(k)]
        for key in victims:
            self.remove(key)
        return victims
