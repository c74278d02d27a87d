"""One device's memory tier: the shared miss path's books (``cachepolicies.pool.MemoryPool``:
budget, resident models, reservations, policy), the loads waiting for room (the room
queue, ``cachepolicies.roomqueue``) and the unloads under way.

Every change to the books goes through a verb here (``commit``, ``cancel``, ``take_out``,
the budget, an unload ending) and ends in ``changed``, which grants waiting loads as far
as room allows; so does every change to what may be evicted (a model's last lease
ending, a pin, a move of its lifecycle: ``agent.node.cache.entry.EntryWatcher``). Nothing
else wakes the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Callable, Protocol

from cachepolicies.base import Policy
from cachepolicies.pool import MemoryPool
from cachepolicies.roomqueue import RoomQueue, Waiter

from agent.node.cache.errors import CacheBusy
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")

Key = tuple[str, int]


class Residents(Protocol):
    """What a pool asks of the models resident in it (the cache answers)."""

    def evictable(self, key: Hashable) -> bool:
        """READY, idle and unpinned: the pool may take it out for room."""

    def evict(self, key: Hashable, admitting: Hashable) -> None:
        """Unload a model the pool took out of its books (a victim) for ``admitting``."""

    def in_use(self, pool: str) -> list[str]:
        """``name:version`` of the models of ``pool`` that are in use or pinned."""

    def will_free(self, pool: str, but: Hashable) -> bool:
        """Something under way in ``pool`` may yet free room (other than ``but``'s own
        load): a model in use now, evictable once idle; a load or an unload running."""


class DevicePool:
    """One device's memory: its books, its room queue (this pool is the queue's
    ``Room``) and the unloads under way."""

    def __init__(self, name: str, memory: MemoryPool, residents: Residents,
                 clock: Callable[[], float]) -> None:
        self.name, self.memory, self.residents, self.clock = name, memory, residents, clock
        self.rooms = RoomQueue(self)
        self.unloading: set[asyncio.Task] = set()
        self.waits = 0             # loads that had to wait (for a load slot or room)
        self.wait_seconds = 0.0    # their total wait

    @property
    def policy(self) -> Policy:
        return self.memory.policy

    @property
    def budget(self) -> int:
        return self.memory.budget

    @budget.setter
    def budget(self, value: int) -> None:
        self.memory.budget = int(value)
        self.changed()

    @property
    def used(self) -> int:
        return self.memory.used

    @property
    def reserved(self) -> int:
        return self.memory.reserved

    # -- the books ---------------------------------------------------------------------
    def changed(self) -> None:
        """What is free or evictable may have changed: grant the waiting loads."""
        self.rooms.changed(self.clock())

    def commit(self, key: Key, reserved: int, size: int, penalty: float) -> None:
        """A load that held ``reserved`` bytes is resident at ``size``; an overdraft (its
        measurement above its reservation) evicts others as far as they allow."""
        self.memory.commit(key, reserved, size, penalty, self.clock())
        if self.memory.free < 0:
            self._shed_overdraft(key)
        self.changed()

    def cancel(self, reserved: int) -> None:
        """A load that held ``reserved`` bytes failed or gave up."""
        self.memory.cancel(reserved)
        self.changed()

    def take_out(self, key: Key) -> None:
        """``key`` leaves the books (its unload begins)."""
        self.memory.remove(key)
        self.changed()

    def unload_started(self, task: asyncio.Task) -> None:
        """An unload under way: loads wait for it (never load into memory being freed)."""
        self.unloading.add(task)
        task.add_done_callback(self._unload_done)

    def _unload_done(self, task: asyncio.Task) -> None:
        self.unloading.discard(task)
        self.changed()

    def count_wait(self, seconds: float) -> None:
        self.waits += 1
        self.wait_seconds += seconds

    def _shed_overdraft(self, key: Key) -> None:
        for victim in self.memory.shed_overdraft(
                self.clock(), lambda k: k != key and self.residents.evictable(k)):
            self.residents.evict(victim, key)
        if self.memory.free < 0:
            log.warning("pool %s is over budget (%s > %s) and nothing is evictable",
                        self.name, format_size(self.used + self.reserved
                                               + self.memory.overhead),
                        format_size(self.budget))

    # -- the room queue's Room ---------------------------------------------------------
    def take(self, waiter: Waiter, now: float) -> list | None:
        """Reserve room for a waiting load, its victims among the idle unpinned models
        (taken out of the books at once: no request may lease one from now on)."""
        victims = self.memory.reserve(
            waiter.need, now, lambda k: k != waiter.key and self.residents.evictable(k))
        for key in victims or ():
            self.residents.evict(key, waiter.key)
        return victims

    def futile(self, waiter: Waiter) -> CacheBusy | None:
        """Refuse a load only the pinned models stand in the way of: no lease, load or
        unload under way could ever free its room."""
        if self.reserved or self.unloading or self.residents.will_free(self.name, waiter.key):
            return None
        return CacheBusy(f"no room for model {waiter.key[0]}:{waiter.key[1]} on "
                         f"{self.name}: the pinned models hold what it needs; unpin one")

    def give_back(self, waiter: Waiter) -> None:
        self.memory.cancel(waiter.need)

    def busy_message(self, key: str, need: int, waited: float) -> str:
        """Why a load of ``key`` gave up waiting for ``need`` bytes here."""
        return (f"no room for model {key} on {self.name}: waited {waited:.1f}s "
                f"(load_wait_max_s) for {format_size(need)}; in use or pinned: "
                f"{', '.join(self.residents.in_use(self.name)) or 'none'}")

    def queued_message(self, key: str, need: int) -> str:
        return (f"load of {key} waits for room on {self.name}: needs {format_size(need)}, "
                f"{format_size(max(self.memory.free, 0))} free, "
                f"{format_size(self.reserved)} reserved by loads, "
                f"{len(self.rooms)} load(s) waiting")
