"""Leases: a request holds a reference on the model that serves it, from before its load
(a cold model: it waits for that one load, single flight) until its answer; a model with
requests in flight is never unloaded. The last lease to go unloads a model whose runtime
crashed or that left the repository, and cancels a load nobody waits for any more."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from agent import tracing
from agent.backends.base import BackendCrashed
from agent.node.cache.catalog import Catalog
from agent.node.cache.entry import Entry
from agent.node.cache.errors import (CacheBusy, CacheError, LoadFailed, ModelInvalid,
                                     PullError, Reloading)
from agent.node.cache.lifecycle import State
from agent.node.cache.loads import Loads
from agent.node.cache.tiers import Tiers
from agent.node.cache.unloads import Unloads

log = logging.getLogger("edgeagent.cache")


class Leases:
    """``acquire`` / ``release`` of entries, loading what is not READY."""

    def __init__(self, catalog: Catalog, tiers: Tiers, loads: Loads, unloads: Unloads, *,
                 clock: Callable[[], float], wall_clock: Callable[[], float]) -> None:
        self.catalog, self.tiers, self.loads, self.unloads = catalog, tiers, loads, unloads
        self.clock, self.wall_clock = clock, wall_clock

    async def acquire(self, name: str, version: int | None = None, *,
                      record: bool = True, timeout: float | None = None) -> Entry:
        """The entry, loaded, with one reference held: ``release`` it when done.
        ``record``: a request (counted, its failure remembered); ``timeout``: seconds
        this caller waits at most for a load (``CacheBusy`` after it, while the load
        itself goes on for others)."""
        entry = self.catalog.entry(name, version)
        if entry.spec.error:
            raise ModelInvalid(entry.spec.error)
        if record:
            self.tiers.record_access(entry)
        if entry.life.crashed is not None and entry.state is State.READY:
            raise Reloading(f"{entry.life.crashed}; model {entry.key} is being reloaded")
        entry.lease()
        try:
            if entry.state is State.READY:
                if record:
                    entry.stats.hits += 1
                return entry
            if record:
                entry.stats.misses += 1
            await self._until_ready(entry, record, timeout)
            return entry
        except BaseException:
            self.release(entry, served=False)
            raise

    async def ensure_loaded(self, name: str, version: int | None = None) -> Entry:
        """Load without counting a request (repository load, warm restart, pins)."""
        entry = await self.acquire(name, version, record=False)
        self.release(entry, served=False)
        return entry

    async def _until_ready(self, entry: Entry, record: bool, timeout: float | None) -> None:
        """Wait until ``entry`` is READY, starting its load task when none runs (every
        waiter waits on that one task); raise what the load raised, or ``CacheBusy``
        once ``timeout`` has passed."""
        give_up = None if timeout is None else self.clock() + timeout
        with tracing.span("edgeagent.cold_start", entry.key):  # tracing: the load below it
            while entry.state is not State.READY:
                await self._wait_for_load(entry, record, timeout, give_up)

    async def _wait_for_load(self, entry: Entry, record: bool, timeout: float | None,
                             give_up: float | None) -> None:
        """Wait for ``entry``'s load task (started here when none runs) to end."""
        life = entry.life
        if life.task is None and record:
            self.loads.check_failure(entry)  # a request never re-loads a failed model
        task = life.task or self.loads.start(entry)
        waiting_for_load = entry.state in (State.LOADING, State.UNLOADED, State.FAILED)
        left = None if give_up is None else max(give_up - self.clock(), 0.0)
        done, _ = await asyncio.wait({task}, timeout=left)
        if not done:
            raise CacheBusy(f"model {entry.key} is not loaded yet and the request's "
                            f"timeout ({timeout:.3f}s) has passed")
        if task.cancelled():
            raise LoadFailed(f"the load of model {entry.key} was cancelled")
        exc = task.exception()
        if isinstance(exc, (CacheError, PullError)):
            raise exc
        if exc is not None and waiting_for_load:  # (a failed unload: go on)
            raise LoadFailed(str(exc)) from exc

    def release(self, entry: Entry, *, served: bool = True) -> None:
        """Let go of ``entry`` (``served``: a request was answered, ``last_used``)."""
        if not entry.unlease(self.clock(), self.wall_clock() if served else None):
            return
        life = entry.life
        if life.crashed is not None and entry.state is State.READY:
            log.warning("reloading %s: %s", entry.key, life.crashed)
            self.unloads.start(entry, "its runtime failed")
        elif entry.name not in self.catalog.specs and entry.state is State.READY:
            self.unloads.start(entry, "removed from the repository")
        elif life.waiting_for_room and life.task is not None:
            life.task.cancel()  # nobody wants it any more: leave the room queue


class Lease:
    """``async with``: one request's lease on its model, acquired on entry and released
    on exit; a runtime that crashed under it (``BackendCrashed``) is unloaded when its
    last request is done."""

    __slots__ = ("leases", "name", "version", "timeout", "entry")

    def __init__(self, leases: Leases, name: str, version: int | None,
                 timeout: float | None) -> None:
        self.leases, self.name, self.version, self.timeout = leases, name, version, timeout
        self.entry: Entry | None = None

    async def __aenter__(self) -> Entry:
        self.entry = await self.leases.acquire(self.name, self.version,
                                               timeout=self.timeout)
        return self.entry

    async def __aexit__(self, kind: Any, exc: BaseException | None, trace: Any) -> None:
        entry = self.entry
        assert entry is not None
        if isinstance(exc, BackendCrashed):
            entry.life.crashed = entry.life.crashed or str(exc)
        self.leases.release(entry)
