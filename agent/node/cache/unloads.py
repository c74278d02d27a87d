"""Unloading: a victim the pool chose, an idle model past its ``idle_unload_s``, an
admin's evict, and ``when_idle``, the one way to unload a model once its requests in
flight are done (a rollout's old version, a selection app's lighter member, a model the
coordinator moved away). It is also what the pools ask of their residents
(``agent.node.cache.pools.Residents``): what may be evicted, and evicting it.

Only a READY model with no request in flight may go (anything else is
``IllegalTransition``); its backend unloads in a thread, then ``malloc_trim``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol

from agent.backends.base import Backend
from agent.memory import MemoryMeter, malloc_trim
from agent.node.cache.entry import Entry
from agent.node.cache.errors import ModelInUse
from agent.node.cache.lifecycle import IllegalTransition, State
from agent.node.cache.pools import DevicePool
from agent.node.cache.settings import CacheSettings
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")

Key = tuple[str, int]


class UnloadListener(Protocol):
    def model_unloaded(self, entry: Entry, reason: str) -> None: ...


class Unloads:
    """Starts and runs unloads; tells ``listener`` after each."""

    def __init__(self, entries: dict[Key, Entry], pools: dict[str, DevicePool],
                 settings: CacheSettings, meter: MemoryMeter, clock: Callable[[], float],
                 listener: UnloadListener) -> None:
        self.entries, self.pools, self.settings = entries, pools, settings
        self.meter, self.clock, self.listener = meter, clock, listener
        self.executor = ThreadPoolExecutor(1, "edgeagent-unload")
        self._idle: dict[Key, list[asyncio.Future]] = {}  # ``when_idle`` waiters

    # -- what the pools ask (Residents) ------------------------------------------------
    def evictable(self, key: Key) -> bool:
        entry = self.entries.get(key)
        return (entry is not None and entry.state is State.READY
                and entry.account.in_flight == 0 and not entry.account.pinned)

    def evict(self, key: Key, admitting: Key) -> None:
        victim = self.entries[key]
        log.info("evict %s (size=%s, penalty=%.3fs) to admit %s:%s on %s", victim.key,
                 format_size(victim.account.size_bytes),
                 victim.account.load_seconds + victim.account.first_run_seconds,
                 *admitting, victim.device)
        self.start(victim, "evicted", accounted=True)

    def _of(self, pool: str) -> list[Entry]:
        return [e for e in self.entries.values()
                if e.device == pool and e.state is not State.UNLOADED]

    def in_use(self, pool: str) -> list[str]:
        return [e.key for e in self._of(pool) if e.account.in_flight or e.account.pinned]

    def will_free(self, pool: str, but: Key) -> bool:
        return any(e.id != but and (
            e.state is State.UNLOADING
            or (e.state is State.LOADING and not e.life.waiting_for_room)
            or (e.state is State.READY and e.account.in_flight and not e.account.pinned))
            for e in self._of(pool))

    # -- unloading ---------------------------------------------------------------------
    def start(self, entry: Entry, reason: str, *, accounted: bool = False) -> asyncio.Task:
        """Take ``entry`` out of its pool (unless ``accounted``: the pool took it out as
        a victim) and unload it in a thread."""
        if entry.account.in_flight:
            raise IllegalTransition(entry.key, entry.state, State.UNLOADING,
                                    f"{entry.account.in_flight} request(s) in flight")
        entry.life.begin_unload()
        pool = self.pools.get(entry.device)
        if pool is not None and not accounted:
            pool.take_out(entry.id)
        task = asyncio.get_running_loop().create_task(self._unload(entry, reason))
        entry.life.task = task
        if pool is not None:
            pool.unload_started(task)
        return task

    async def _unload(self, entry: Entry, reason: str) -> None:
        backend, entry.backend = entry.backend, None
        loop = asyncio.get_running_loop()
        try:
            freed, _ = await loop.run_in_executor(self.executor, self._unload_blocking,
                                                  backend)
        finally:
            entry.life.unloaded()
        if reason == "evicted":
            entry.stats.evictions += 1
        size, estimated = entry.account.size_bytes, entry.account.size_estimated
        level = logging.WARNING if size > 4 * 2**20 and -freed < size // 2 \
            and not estimated \
            and entry.spec.backend not in ("synthetic", "tfserving") else logging.INFO
        log.log(level, "unloaded %s (%s): accounted %s, RSS went down by %s", entry.key,
                reason, format_size(size), format_size(-freed))
        self.listener.model_unloaded(entry, reason)

    def _unload_blocking(self, backend: Backend | None) -> tuple[int, bool]:
        window = self.meter.begin()
        try:
            if backend is not None:
                backend.unload()
            del backend
            malloc_trim()
        finally:
            result = self.meter.end(window)
        return result

    def idle(self) -> list[Entry]:
        """Unload the ready, unpinned models unused for their ``idle_unload_after``;
        returns them."""
        now, unloaded = self.clock(), []
        for entry in list(self.entries.values()):
            after, account = self.settings.idle_unload_after(entry), entry.account
            if (after is not None and self.evictable(entry.id)
                    and account.idle_since is not None and now - account.idle_since >= after):
                log.info("unload %s: unused for %.0fs (idle_unload_s %g)", entry.key,
                         now - account.idle_since, after)
                self.start(entry, "idle")
                unloaded.append(entry)
        return unloaded

    async def unload_now(self, entry: Entry) -> Entry:
        """Unload now (admin, repository unload). ``ModelInUse`` while requests run, it is loading, or it is
        pinned; a no-op when it is not loaded."""
        if entry.state is State.UNLOADING and entry.life.task is not None:
            await asyncio.shield(entry.life.task)
            return entry
        if entry.state is State.LOADING:
            raise ModelInUse(f"model {entry.key} is loading")
        if entry.state is not State.READY:
            return entry
        if entry.account.in_flight:
            raise ModelInUse(f"model {entry.key} has {entry.account.in_flight} "
                             "request(s) in flight")
        if entry.account.pinned:
            raise ModelInUse(f"model {entry.key} is pinned; unpin it first")
        log.info("evict %s on request", entry.key)
        await asyncio.shield(self.start(entry, "evicted"))
        return entry

    async def when_idle(self, entry: Entry, keep: Callable[[Entry], bool]) -> bool:
        """Unload ``entry`` once no request holds it: True once it is unloaded; False as
        soon as it is no longer READY, is pinned, or ``keep(entry)`` says to keep it.
        Waits for its last lease to end, never polling."""
        while entry.state is State.READY and not entry.account.pinned and not keep(entry):
            if not entry.account.in_flight:
                await asyncio.shield(self.start(entry, "evicted"))
                return True
            waiter = asyncio.get_running_loop().create_future()
            self._idle.setdefault(entry.id, []).append(waiter)
            await waiter
        return entry.state is State.UNLOADED

    def moved(self, entry: Entry) -> None:
        """``entry``'s leases, pin or state changed: its ``when_idle`` waiters look
        again."""
        for waiter in self._idle.pop(entry.id, ()) if self._idle else ():
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
