"""A miss's load task, one per entry at a time (single flight), in six steps:

*fetch* (a sourced model's files not on disk are pulled into the disk tier: the phase
``downloading``) -> *price* (make the backend, estimate it, refuse it with 507 if it can
never fit, size the reservation) -> *reserve* (a load slot, then room: the phases
``waiting_for_slot`` and ``waiting_for_room``) -> *load* (``room_granted``: wait for the
pool's unloads, load in a thread) -> *measure* (its size and load times) -> *commit*
(resident at the measured size with its miss penalty, the listener told).

A load first takes one of ``load_concurrency`` load slots (so only loads that run hold
room), then reserves its peak (``Backend.load_room``) in its pool's room queue, by the
model's ``load_wait_max_s`` (``CacheBusy`` after it). A waiting load holds no
reservation and no lease on another model, so waiting cannot deadlock. A load that
fails leaves the entry FAILED (``LoadFailed`` for a backend's error, remembered for
``load_retry_s``; ``PullError`` for a pull's); one that gave up waiting for room, or was
cancelled, leaves it UNLOADED.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

from cachepolicies.roomqueue import RoomTimeout, Waiter

from agent import tracing
from agent.backends import load_measured
from agent.backends.base import Backend, BackendError, LoadResult
from agent.memory import FootprintModel, MemoryMeter
from agent.node.cache.entry import Entry
from agent.node.cache.errors import (CacheBusy, CacheError, DiskBusy, LoadFailed,
                                     ModelTooLarge, PullError)
from agent.node.cache.lifecycle import Phase, State
from agent.node.cache.pools import DevicePool
from agent.node.cache.settings import CacheSettings
from agent.node.cache.tiers import Tiers
from agent.node.repository import read_warmup_sample
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")


class LoadListener(Protocol):
    def model_loaded(self, entry: Entry) -> None: ...


@dataclass
class LoadPlan:
    """A priced load: where it goes, its backend, its estimate and the bytes it reserves."""

    pool: DevicePool
    backend: Backend
    estimate: int
    reserve: int
    granted: float = 0.0  # when it got its slot and room (cache clock)


class Loads:
    """Runs load tasks; ``executor`` is the load thread pool (``load_concurrency``)."""

    def __init__(self, tiers: Tiers, settings: CacheSettings, *,
                 backend_factory: Callable[..., Backend], footprints: FootprintModel,
                 meter: MemoryMeter, load_concurrency: int, clock: Callable[[], float],
                 listener: LoadListener) -> None:
        self.tiers, self.settings, self.clock = tiers, settings, clock
        self.backend_factory, self.footprints, self.meter = backend_factory, footprints, meter
        self.listener = listener
        self.executor = ThreadPoolExecutor(load_concurrency, "edgeagent-load")
        self._slots = asyncio.Semaphore(load_concurrency)

    def start(self, entry: Entry) -> asyncio.Task:
        """``entry``'s load task (its outcome is always retrieved: every waiter may go)."""
        task = entry.life.task = asyncio.get_running_loop().create_task(self._load(entry))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def check_failure(self, entry: Entry) -> None:
        """``LoadFailed`` (503 + Retry-After, the reason) while ``entry``'s last load
        failed less than ``load_retry_s`` ago (ModelMesh's failure expiry): a broken
        model file is not loaded again by every request."""
        life = entry.life
        if entry.state is not State.FAILED or life.failed_at is None:
            return
        left = life.failed_at + self.settings.retry_bound(entry) - self.clock()
        if left > 0:
            raise LoadFailed(f"{life.error}; the next try is in {left:.0f}s", left,
                             life.failed_status)

    async def _load(self, entry: Entry) -> None:
        life = entry.life
        life.begin_load(self.clock())
        trace = tracing.load_began(entry.key)  # tracing: for the request that started it
        try:
            await self._fetch(entry, trace)
            plan = await self._price(entry)
            result = await self._reserve_and_load(entry, plan)
            first_run = self._measure(entry, plan, result)
        except BaseException as exc:
            if trace is not None:  # tracing
                trace.failed(exc)
            self._failed(entry, exc)
            raise
        else:
            if trace is not None:  # tracing
                trace.loaded(result.first_run_seconds, {
                    "edgeagent.device": plan.pool.name,
                    "edgeagent.load.bytes": entry.account.size_bytes})
            self._commit(entry, plan, first_run)
        finally:
            life.task = None

    def _failed(self, entry: Entry, exc: BaseException) -> None:
        """Move a load that failed: gave up (no room, or cancelled), or FAILED with its
        reason; a backend's error becomes ``LoadFailed`` (raised from here)."""
        life = entry.life
        if isinstance(exc, (CacheBusy, DiskBusy)):
            life.gave_up(str(exc))
        elif isinstance(exc, asyncio.CancelledError):
            life.gave_up(None)
        elif isinstance(exc, CacheError):
            life.load_failed(str(exc))
            log.warning("load %s failed: %s", entry.key, exc)
        elif isinstance(exc, PullError):  # a full disk is checked again by the next
            # request; a source's failure is remembered as a broken file is
            life.load_failed(str(exc), status=exc.status,
                             at=None if exc.status == 507 else self.clock())
            log.warning("%s", exc)
        elif isinstance(exc, BackendError):
            bound = self.settings.retry_bound(entry)
            life.load_failed(self._failure_message(entry, exc), at=self.clock(),
                             status=LoadFailed.status)
            log.warning("%s (retried after %.0fs)", life.error, bound)
            raise LoadFailed(life.error or "", bound) from None
        else:
            life.load_failed("load interrupted")

    def _failure_message(self, entry: Entry, exc: BaseException) -> str:
        """The reason a load failed, naming the model and version, with the repository's
        host path cut from it (a file is named relative to the repository)."""
        text = str(exc)
        for root, name in ((entry.spec.version_root.parent, "<models>"),
                           (entry.spec.path.parent, "<repository>")):
            for where in {str(root.resolve()), str(root)}:
                text = text.replace(where + "/", "").replace(where, name)
        return f"model {entry.key} failed to load: {text}"

    async def _fetch(self, entry: Entry, trace: tracing.LoadTrace | None) -> None:
        """Step 0: a sourced model's files onto disk (the disk tier's one pull per
        version)."""
        disk = self.tiers.disk
        if not entry.spec.sourced or disk is None or disk.has(entry.id):
            return
        entry.life.phase = Phase.DOWNLOADING
        if trace is not None:  # tracing
            trace.download_began()
        try:
            await disk.ensure(entry.name, entry.version, loading=True)
        finally:
            entry.life.phase = None
        if trace is not None:  # tracing
            trace.download_ended(disk.pulled_profile(entry.id)[1])

    async def _make_backend(self, entry: Entry, pool: DevicePool) -> Backend:
        """A backend for ``entry``, with its explicit warm-up sample read and its device
        set up (the CUDA context: the pool's overhead, once); nothing loaded yet."""
        kind = entry.spec.backend or "onnx"
        backend = self.backend_factory(kind, entry.name, entry.version,
                                       entry.spec.version_root, entry.spec.config,
                                       self.footprints)
        loop = asyncio.get_running_loop()
        if entry.spec.config.warmup is not None and entry.spec.config.warmup.explicit:
            backend.warmup_sample, backend.warmup_source = await loop.run_in_executor(
                None, read_warmup_sample, entry.spec)
        if backend.pool != "cpu":
            pool.memory.overhead = await loop.run_in_executor(self.executor,
                                                              backend.set_up_device)
        return backend

    async def _price(self, entry: Entry) -> LoadPlan:
        """Step 1: make the backend and price the load: its estimate, ``ModelTooLarge``
        (507) when it can never fit, and the bytes it reserves while it loads."""
        pool = self.tiers.pool_of(entry)
        if pool is None:
            raise LoadFailed(f"model {entry.name!r} wants device {entry.device}, which this "
                             f"host has no budget for (devices: {', '.join(self.tiers.pools)})")
        backend = await self._make_backend(entry, pool)
        # The first estimate of a model parses its file: never on the event loop.
        estimate, lower = await asyncio.get_running_loop().run_in_executor(
            None, lambda: (backend.estimate(), backend.lower_bound()))
        # A clean measurement from an earlier load beats the estimate. What refuses the
        # model (507) is what it provably holds (its weights) or what every one of its
        # recent loads measured, never one measurement, which may have caught other
        # allocations in its window.
        reserve = entry.account.measured_bytes or estimate
        lower = max(lower, entry.account.steady_bytes)
        room = pool.memory.capacity - self._pinned_bytes(pool, entry)
        if lower > room:
            raise ModelTooLarge(
                f"model {entry.key} needs at least {format_size(lower)} ({lower} bytes) but the "
                f"whole {pool.name} budget is {format_size(pool.budget)} ({pool.budget} bytes), "
                f"of which {format_size(room)} can ever be freed for it (less overhead and "
                "pinned models)")
        # While it runs a load takes its peak (the runtime's scratch), not only the
        # model's steady size; an estimate above what could be freed is capped: evict
        # what is idle, load and measure.
        return LoadPlan(pool, backend, estimate, min(backend.load_room(reserve), room))

    def _pinned_bytes(self, pool: DevicePool, but: Entry) -> int:
        return sum(e.account.size_bytes for e in self.tiers.entries.values()
                   if e.account.pinned and e is not but and e.state is State.READY
                   and e.device == pool.name)

    async def _reserve_and_load(self, entry: Entry, plan: LoadPlan) -> LoadResult:
        """Steps 2 and 3: hold a load slot and ``plan.reserve`` bytes, then load; the
        slot is given back after, the room too if the load failed."""
        await self._reserve(entry, plan)
        try:
            return await self._run_load(entry, plan)
        finally:
            self._slots.release()

    async def _reserve(self, entry: Entry, plan: LoadPlan) -> None:
        """Step 2: take a load slot, then the room, both by the model's wait bound; on
        failure nothing is held. Room is reserved only by loads about to run: a load
        queued behind others must not hold room, or evict for it, meanwhile."""
        asked = self.clock()
        give_up = asked + self.settings.wait_bound(entry)
        try:
            await self._take_slot(entry, give_up)
        except BaseException:
            self._count_wait(plan.pool, entry, asked)
            raise
        try:
            await self._wait_for_room(entry, plan, give_up)
        except BaseException:
            self._slots.release()
            raise
        finally:
            self._count_wait(plan.pool, entry, asked)
        plan.granted = self.clock()

    async def _take_slot(self, entry: Entry, give_up: float) -> None:
        """One of the ``load_concurrency`` load slots, or ``CacheBusy`` at ``give_up``."""
        if not self._slots.locked():
            await self._slots.acquire()
            return
        entry.life.phase, entry.life.had_to_wait = Phase.WAITING_FOR_SLOT, True
        try:
            await asyncio.wait_for(self._slots.acquire(), max(give_up - self.clock(), 0.0))
        except asyncio.TimeoutError:
            raise CacheBusy(f"model {entry.key} waited {self.settings.wait_bound(entry):.1f}s "
                            "(load_wait_max_s) behind other loads") from None
        finally:
            entry.life.phase = None

    async def _wait_for_room(self, entry: Entry, plan: LoadPlan, give_up: float) -> None:
        """Reserve ``plan.reserve`` bytes, waiting in the pool's room queue until
        ``give_up`` at most (the pool starts the victims' unloads)."""
        pool = plan.pool

        def queued(waiter: Waiter) -> None:
            entry.life.phase, entry.life.had_to_wait = Phase.WAITING_FOR_ROOM, True
            log.info("%s", pool.queued_message(entry.key, plan.reserve))

        try:
            await pool.rooms.wait(entry.id, plan.reserve, give_up, self.clock, queued)
        except RoomTimeout:
            raise CacheBusy(pool.busy_message(entry.key, plan.reserve,
                                              self.settings.wait_bound(entry))) from None
        finally:
            entry.life.phase = None

    def _count_wait(self, pool: DevicePool, entry: Entry, asked: float) -> None:
        """Count a load that had to wait (for a load slot or for room) once."""
        if entry.life.had_to_wait:
            entry.life.had_to_wait = False
            waited = self.clock() - asked
            entry.stats.room_waits += 1
            entry.stats.room_wait_seconds += waited
            pool.count_wait(waited)

    async def _run_load(self, entry: Entry, plan: LoadPlan) -> LoadResult:
        """Step 3: room granted; wait for the pool's unloads (never load into memory
        still being freed), then load and measure in the load executor; on failure the
        reserved room goes back to the waiting loads."""
        pool = plan.pool
        entry.life.phase = Phase.ROOM_GRANTED
        try:
            while pool.unloading:
                await asyncio.wait(set(pool.unloading))
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, load_measured, plan.backend, self.meter)
        except BaseException:
            pool.cancel(plan.reserve)
            raise
        finally:
            entry.life.phase = None

    def _measure(self, entry: Entry, plan: LoadPlan, result: LoadResult) -> float:
        """Step 4: book what the load measured (its size, else the estimate; its load
        and first-run seconds; its inputs and outputs). Returns the first run's seconds
        that price a miss."""
        account, backend, measured = entry.account, plan.backend, result.size_bytes
        account.size_estimated = measured is None
        account.size_bytes = measured if measured is not None else plan.estimate
        if measured is not None:
            account.measurements.append(measured)
        first_run = result.first_run_seconds
        account.load_seconds = max(result.seconds - first_run, 0.0)
        if backend.warm_up_failed and account.first_run_seconds:
            first_run = account.first_run_seconds  # the last cold first request's, measured
        else:
            account.first_run_seconds = first_run
        entry.metadata, entry.signature = backend.metadata(), list(backend.inputs)
        return first_run

    def _commit(self, entry: Entry, plan: LoadPlan, first_run: float) -> None:
        """Step 5: READY, resident in the pool at its measured size with its miss penalty
        (the pool sheds any overdraft and grants waiting loads), the listener told."""
        pool, account = plan.pool, entry.account
        entry.backend = plan.backend
        entry.stats.loads += 1
        entry.stats.slot_seconds += self.clock() - plan.granted  # the twin's profile
        account.idle_since = self.clock()
        entry.life.loaded()
        pool.commit(entry.id, plan.reserve, account.size_bytes,
                    self.tiers.penalty(entry, first_run))
        log.info("loaded %s on %s in %.3fs (+ first run %.4fs): size %s (%s; estimate %s), "
                 "pool %s/%s", entry.key, pool.name, account.load_seconds, first_run,
                 format_size(account.size_bytes), "estimated" if account.size_estimated
                 else "measured", format_size(plan.estimate), format_size(pool.used),
                 format_size(pool.budget))
        self.listener.model_loaded(entry)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
