"""The model cache: which models are loaded, under a byte budget per device.

The cache drives the simulator's miss path, ``cachepolicies.pool.MemoryPool``: every
request calls ``record_access``; a miss *reserves* the model's estimated bytes, all or
nothing, taking victims among idle unpinned models when the budget is short; a finished
load *commits* the measured size with ``miss_penalty`` (load + cold-run surplus); every
unload removes the model. So a decision the simulator shows is the one the agent makes.
Models are keyed ``(name, version)`` in the pools and policies.

Waiting for room: a load first takes one of ``load_concurrency`` load slots (so only
loads that run hold room), then reserves its peak (``Backend.load_room``: the runtime's
scratch while it builds the model) and commits the measured size after. A load that
finds no room now (everything resident in use, or room held by other loads) joins its
pool's *room queue*, ordered by deadline then arrival, and is granted as soon as leases
end, loads finish or pins change, strictly in that order (a later load never overtakes
the head, so none starves). A waiting load holds no
reservation and no lease on another model, so waiting cannot deadlock. It gives up
with ``CacheBusy`` (503 + Retry-After) after the model's ``load_wait_max_s`` or, for a
request, its client's hard timeout.

Guarantees:
- single flight: requests for a loading model wait on that one load;
- reference counts: a model with requests in flight (``in_flight``) is never unloaded;
  a request holds its reference while it waits in its model's batching queue too;
- pinned models are never chosen as victims;
- a model whose lower bound (its weights' bytes) exceeds what could ever be freed (the
  budget less the pool's overhead and the pinned models) is ``ModelTooLarge`` (507);
  one that must wait longer than its bound is ``CacheBusy`` (503 + Retry-After);
- nothing loads into memory still being freed: a load first waits for the pool's
  pending unloads.

All state changes happen on the event loop; only backend load/infer/unload run in
thread pools.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import heapq
import itertools
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from cachepolicies.base import Policy
from cachepolicies.pool import MemoryPool, miss_penalty
from cachepolicies.registry import make_policy, prime_policy

from agent.backends import load_measured, make_backend
from agent.backends.base import Backend, BackendCrashed, BackendError, TensorSpec
from agent.errors import AgentError
from agent.memory import FootprintModel, MemoryMeter, malloc_trim
from agent.node.repository import ModelSpec, read_warmup_sample
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")

MEASUREMENTS_KEPT = 3  # a model's recent clean size measurements that price its next load


class State(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class CacheError(AgentError):
    """A request the cache cannot serve; ``status`` is the HTTP status to answer with."""


class UnknownModel(CacheError):
    status = 404


class ModelInvalid(CacheError):
    """The repository entry is broken (bad config.yaml, missing file)."""

    status = 400


class ModelTooLarge(CacheError):
    """The model can never fit in its device budget."""

    status = 507


class CacheBusy(CacheError):
    """No room now: what could be evicted is in use or pinned."""

    status = 503
    retry_after = 1.0


class ModelInUse(CacheError):
    status = 409


class Reloading(CacheError):
    """The model's runtime failed while running (``BackendCrashed``): it is unloaded
    once its requests in flight are done and loaded again by the next request; 503."""

    status = 503
    retry_after = 1.0


class LoadFailed(CacheError):
    """A load failed (a corrupt model file, a runtime that refuses it): 503, with
    ``Retry-After`` while the failure is remembered (``load_retry_s``)."""

    status = 503

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(order=True)
class RoomRequest:
    """A load waiting in its pool's room queue for ``need`` bytes."""

    deadline: float
    seq: int
    key: tuple[str, int] = field(compare=False)
    need: int = field(compare=False)
    future: asyncio.Future = field(compare=False)


@dataclass
class Pool:
    """One device's memory: the shared miss path's books (``memory``: budget, resident
    models, reservations, policy), the loads waiting for room and the unloads under way."""

    name: str
    memory: MemoryPool
    unloading: set[asyncio.Task] = field(default_factory=set)
    waiting: list[RoomRequest] = field(default_factory=list)  # a heap
    waits: int = 0               # loads that had to wait (for a load slot or room)
    wait_seconds: float = 0.0    # their total wait

    @property
    def policy(self) -> Policy:
        return self.memory.policy

    @property
    def budget(self) -> int:
        return self.memory.budget

    @budget.setter
    def budget(self, value: int) -> None:
        self.memory.budget = int(value)

    @property
    def used(self) -> int:
        return self.memory.used

    @property
    def reserved(self) -> int:
        return self.memory.reserved


@dataclass
class Entry:
    """One version of one model and its counters."""

    spec: ModelSpec
    version: int
    state: State = State.UNLOADED
    backend: Backend | None = None
    size_bytes: int = 0
    size_estimated: bool = True
    #: The last ``MEASUREMENTS_KEPT`` clean measurements of its size (survive unloads).
    measurements: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=MEASUREMENTS_KEPT))
    load_seconds: float = 0.0
    load_started: float | None = None  # cache clock at the start of the last load
    first_run_seconds: float = 0.0
    waiting_for_room: bool = False  # for a load slot or for room, now
    had_to_wait: bool = False       # the load under way waited (counted once, after)
    idle_since: float | None = None  # cache clock when its last request ended
    room_waits: int = 0          # loads of this model that waited (slot or room)
    room_wait_seconds: float = 0.0
    loads: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    last_used: float | None = None
    pinned: bool = False
    in_flight: int = 0
    error: str | None = None
    failed_at: float | None = None  # cache clock of the last failed load (None: none)
    crashed: str | None = None      # why its runtime failed while running: reload it
    load_attempts: int = 0          # loads started, failed ones included
    task: asyncio.Task | None = None
    metadata: dict[str, Any] | None = None  # inputs/outputs, kept after unload
    signature: list[TensorSpec] | None = None  # input specs, kept after unload

    @property
    def measured_bytes(self) -> int | None:
        """The largest of its recent clean measurements (None before any): what a load
        reserves. Recent, not all-time: one noisy window among hundreds of loads would
        otherwise price the model above its size for good."""
        return max(self.measurements) if self.measurements else None

    @property
    def steady_bytes(self) -> int:
        """The least of its last ``MEASUREMENTS_KEPT`` clean measurements once it has
        that many, else 0: a size every recent load showed, not one window's noise."""
        full = len(self.measurements) == MEASUREMENTS_KEPT
        return min(self.measurements) if full else 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def id(self) -> tuple[str, int]:
        """The key in pools and policies."""
        return (self.spec.name, self.version)

    @property
    def key(self) -> str:
        """``name:version``, for people (logs, messages)."""
        return f"{self.spec.name}:{self.version}"

    @property
    def device(self) -> str:
        return self.spec.config.device


class ModelCache:
    """Loads, serves and evicts models of a repository under per-device budgets."""

    def __init__(
        self,
        specs: dict[str, ModelSpec],
        budgets: dict[str, int],
        *,
        policy: str = "cremebrulee",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        backend_factory: Callable[..., Backend] = make_backend,
        footprints: FootprintModel | None = None,
        meter: MemoryMeter | None = None,
        load_concurrency: int = 1,
        infer_executor: Executor | None = None,
        load_wait_max_s: float = 30.0,
        idle_unload_s: float | None = None,
        load_retry_s: float = 30.0,
    ) -> None:
        self.policy_spec = policy
        prime_policy(policy)  # the first request must not pay for loading the kernels
        self.pools = {name: Pool(name, MemoryPool(budget, make_policy(policy)))
                      for name, budget in budgets.items()}
        self.load_wait_max_s = load_wait_max_s
        self.load_retry_s = load_retry_s
        self.idle_unload_s = idle_unload_s
        #: Warm seconds of one run of a model, where known (the serving layer's
        #: measurements): the cold first run's surplus over it is part of the penalty.
        self.warm_exec: Callable[[Entry], float | None] = lambda entry: None
        self._seq = itertools.count()
        self.clock, self.wall_clock = clock, wall_clock
        self.backend_factory = backend_factory
        self.footprints = footprints or FootprintModel()
        self.meter = meter or MemoryMeter()
        self.load_executor = ThreadPoolExecutor(load_concurrency, "edgeagent-load")
        self._load_slots = asyncio.Semaphore(load_concurrency)
        self.unload_executor = ThreadPoolExecutor(1, "edgeagent-unload")
        self.infer_executor = infer_executor
        self.entries: dict[tuple[str, int], Entry] = {}
        self.specs: dict[str, ModelSpec] = {}
        #: Called as ``f(entry)`` after each successful load / eviction (metrics, state).
        self.on_load: list[Callable[[Entry], None]] = []
        self.on_unload: list[Callable[[Entry, str], None]] = []
        self.update_specs(specs)

    # -- repository ------------------------------------------------------------------
    def update_specs(self, specs: dict[str, ModelSpec]) -> None:
        """Adopt a rescan: new models appear, removed idle ones are unloaded and dropped,
        resident ones keep serving their loaded version until evicted."""
        self.specs = dict(specs)
        for (name, version), entry in list(self.entries.items()):
            spec = specs.get(name)
            if spec is not None and version in spec.versions:
                entry.spec = spec
                if entry.state is State.UNLOADED:
                    entry.pinned = entry.pinned or spec.config.pin
            elif entry.state in (State.UNLOADED, State.FAILED):
                del self.entries[(name, version)]
            elif entry.state is State.READY and entry.in_flight == 0:
                self._start_unload(entry, "removed from the repository")
        for spec in specs.values():
            if spec.default_version is not None:
                self._entry_for(spec, spec.default_version)

    def _entry_for(self, spec: ModelSpec, version: int) -> Entry:
        entry = self.entries.get((spec.name, version))
        if entry is None:
            entry = Entry(spec, version, pinned=spec.config.pin)
            self.entries[(spec.name, version)] = entry
        return entry

    def entry(self, name: str, version: int | None = None) -> Entry:
        """The entry for ``name`` (default: highest version); ``UnknownModel`` if none."""
        spec = self.specs.get(name)
        if spec is None:
            raise UnknownModel(f"Request for unknown model {name!r}")
        if version is None:
            version = spec.default_version
            if version is None:
                raise ModelInvalid(spec.error or f"model {name!r} has no version")
        elif version not in spec.versions:
            raise UnknownModel(f"model {name!r} has no version {version} (versions: "
                               f"{', '.join(map(str, spec.versions)) or 'none'})")
        return self._entry_for(spec, version)

    def listing(self) -> list[Entry]:
        """Default-version entries of every model, plus other versions that were used."""
        out = []
        for (name, version), entry in sorted(self.entries.items()):
            spec = self.specs.get(name)
            if spec is None:
                if entry.state is not State.UNLOADED:
                    out.append(entry)
            elif version == spec.default_version or entry.loads or entry.state is not State.UNLOADED:
                out.append(entry)
        return out

    def pool_of(self, entry: Entry) -> Pool | None:
        return self.pools.get(entry.device)

    # -- serving ---------------------------------------------------------------------
    async def acquire(self, name: str, version: int | None = None, *,
                      record: bool = True, timeout: float | None = None) -> Entry:
        """The entry, loaded, with one reference held: call ``release`` when done.

        ``timeout``: seconds this caller waits at most for a load (its client's hard
        timeout); ``CacheBusy`` after it, while the load itself goes on for others."""
        entry = self.entry(name, version)
        if entry.spec.error:
            raise ModelInvalid(entry.spec.error)
        pool = self.pool_of(entry)
        if record and pool is not None:
            pool.policy.record_access(entry.id, self.clock())
        if entry.crashed is not None and entry.state is State.READY:
            raise Reloading(f"{entry.crashed}; model {entry.key} is being reloaded")
        entry.in_flight += 1
        try:
            if entry.state is State.READY:
                if record:
                    entry.hits += 1
                return entry
            if record:
                entry.misses += 1
            give_up = None if timeout is None else self.clock() + timeout
            while entry.state is not State.READY:
                if entry.task is None and record:
                    self._check_failure(entry)  # a request never re-loads a failed model
                if entry.task is None:
                    entry.task = asyncio.get_running_loop().create_task(self._load(entry))
                    # Waiters may all be cancelled; never leave the outcome unretrieved.
                    entry.task.add_done_callback(
                        lambda t: t.cancelled() or t.exception())
                waiting_for_load = entry.state in (State.LOADING, State.UNLOADED,
                                                   State.FAILED)
                task = entry.task
                left = None if give_up is None else max(give_up - self.clock(), 0.0)
                done, _ = await asyncio.wait({task}, timeout=left)
                if not done:
                    raise CacheBusy(f"model {entry.key} is not loaded yet and the request's "
                                    f"timeout ({timeout:.3f}s) has passed")
                if task.cancelled():
                    raise LoadFailed(f"the load of model {entry.key} was cancelled")
                exc = task.exception()
                if isinstance(exc, CacheError):
                    raise exc
                if exc is not None and waiting_for_load:  # (a failed unload: go on)
                    raise LoadFailed(str(exc)) from exc
            return entry
        except BaseException:
            self._release(entry, touch=False)
            raise

    def release(self, entry: Entry) -> None:
        self._release(entry, touch=True)

    def _release(self, entry: Entry, touch: bool) -> None:
        entry.in_flight -= 1
        if touch:
            entry.last_used = self.wall_clock()
        if entry.in_flight:
            return
        entry.idle_since = self.clock()
        if entry.crashed is not None and entry.state is State.READY:
            log.warning("reloading %s: %s", entry.key, entry.crashed)
            entry.crashed = None
            self._start_unload(entry, "its runtime failed")
        elif entry.name not in self.specs and entry.state is State.READY:
            self._start_unload(entry, "removed from the repository")
        elif entry.waiting_for_room and entry.task is not None:
            entry.task.cancel()  # nobody wants it any more: leave the room queue
        pool = self.pool_of(entry)
        if pool is not None and pool.waiting:
            self._grant(pool)

    @contextlib.asynccontextmanager
    async def lease(self, name: str, version: int | None = None, *,
                    timeout: float | None = None) -> AsyncIterator[Entry]:
        entry = await self.acquire(name, version, timeout=timeout)
        try:
            yield entry
        except BackendCrashed as exc:
            entry.crashed = entry.crashed or str(exc)  # unloaded when the last one is done
            raise
        finally:
            self.release(entry)

    async def ensure_loaded(self, name: str, version: int | None = None) -> Entry:
        """Load without counting a request (repository load, warm restart, pins)."""
        entry = await self.acquire(name, version, record=False)
        self._release(entry, touch=False)
        return entry

    # -- loading ---------------------------------------------------------------------
    def retry_bound(self, entry: Entry) -> float:
        """Seconds a failed load of ``entry`` is remembered: its config, else the agent's."""
        own = entry.spec.config.load_retry_s
        return self.load_retry_s if own is None else own

    def _check_failure(self, entry: Entry) -> None:
        """``LoadFailed`` (503 + Retry-After, the reason) while ``entry``'s last load
        failed less than ``load_retry_s`` ago (ModelMesh's failure expiry): a broken model
        file is not re-loaded by every request. An explicit load (the repository API,
        ``record=False``) tries again at once."""
        if entry.state is not State.FAILED or entry.failed_at is None:
            return
        left = entry.failed_at + self.retry_bound(entry) - self.clock()
        if left > 0:
            raise LoadFailed(f"{entry.error}; the next try is in {left:.0f}s", left)

    def _failure_message(self, entry: Entry, exc: BaseException) -> str:
        """The reason a load failed, naming the model and version, with the repository's
        host path cut from it (a file is named relative to the repository)."""
        text = str(exc)
        root = entry.spec.path.parent
        for where in {str(root.resolve()), str(root)}:
            text = text.replace(where + "/", "").replace(where, "<repository>")
        return f"model {entry.key} failed to load: {text}"

    async def _load(self, entry: Entry) -> None:
        entry.state, entry.error = State.LOADING, None
        entry.load_started = self.clock()
        entry.load_attempts += 1
        try:
            await self._do_load(entry)
        except CacheBusy as exc:
            entry.state, entry.error = State.UNLOADED, str(exc)
            raise
        except CacheError as exc:
            entry.state, entry.error = State.FAILED, str(exc)
            log.warning("load %s failed: %s", entry.key, exc)
            raise
        except BackendError as exc:
            message = self._failure_message(entry, exc)
            entry.state, entry.error, entry.failed_at = State.FAILED, message, self.clock()
            log.warning("%s (retried after %.0fs)", message, self.retry_bound(entry))
            raise LoadFailed(message, self.retry_bound(entry)) from None
        except asyncio.CancelledError:
            entry.state, entry.error = State.UNLOADED, None  # given up while waiting
            raise
        except BaseException:
            entry.state = State.FAILED
            entry.error = "load interrupted"
            raise
        finally:
            entry.task = None

    def forget_failure(self, entry: Entry) -> None:
        """Forget ``entry``'s failed load (a config override that was rolled back): the
        next request loads it at once."""
        if entry.state is State.FAILED:
            entry.state, entry.error, entry.failed_at = State.UNLOADED, None, None

    def wait_bound(self, entry: Entry) -> float:
        """Seconds a load of ``entry`` may wait for room: its config, else the agent's."""
        own = entry.spec.config.load_wait_max_s
        return self.load_wait_max_s if own is None else own

    def _pinned_bytes(self, pool: Pool, but: Entry) -> int:
        return sum(e.size_bytes for e in self.entries.values()
                   if e.pinned and e is not but and e.state is State.READY
                   and self.pool_of(e) is pool)

    async def _do_load(self, entry: Entry) -> None:
        pool = self.pool_of(entry)
        if pool is None:
            raise LoadFailed(f"model {entry.name!r} wants device {entry.device}, which this "
                             f"host has no budget for (devices: {', '.join(self.pools)})")
        kind = entry.spec.backend or "onnx"
        backend = self.backend_factory(kind, entry.name, entry.version, entry.spec.path,
                                       entry.spec.config, self.footprints)
        loop = asyncio.get_running_loop()
        if entry.spec.config.warmup is not None and entry.spec.config.warmup.explicit:
            backend.warmup_sample, backend.warmup_source = await loop.run_in_executor(
                None, read_warmup_sample, entry.spec)
        if backend.pool != "cpu":  # the CUDA context: the pool's overhead, set up once
            pool.memory.overhead = await loop.run_in_executor(self.load_executor,
                                                              backend.set_up_device)
        # The first estimate of a model parses its file: never on the event loop.
        estimate, lower = await loop.run_in_executor(
            None, lambda: (backend.estimate(), backend.lower_bound()))
        # A clean measurement from an earlier load beats the estimate. What refuses the
        # model (507) is what it provably holds (its weights) or what every one of its
        # recent loads measured, never one measurement, which may have caught other
        # allocations in its window.
        reserve = entry.measured_bytes or estimate
        lower = max(lower, entry.steady_bytes)
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
        reserve = min(backend.load_room(reserve), room)
        # Room is reserved only by loads about to run (``load_concurrency`` at once): a
        # load queued behind others must not hold room, or evict for it, meanwhile.
        asked = self.clock()
        give_up = asked + self.wait_bound(entry)
        try:
            await self._take_load_slot(entry, give_up)
        except BaseException:
            self._count_wait(pool, entry, asked)
            raise
        try:
            try:
                await self._wait_for_room(pool, entry, reserve, give_up)
            finally:
                self._count_wait(pool, entry, asked)
            try:
                while pool.unloading:  # never load into memory that is still being freed
                    await asyncio.wait(set(pool.unloading))
                result = await loop.run_in_executor(self.load_executor, load_measured,
                                                    backend, self.meter)
            except BaseException:
                pool.memory.cancel(reserve)
                self._grant(pool)
                raise
        finally:
            self._load_slots.release()
        measured = result.size_bytes
        entry.size_estimated = measured is None
        entry.size_bytes = measured if measured is not None else estimate
        if measured is not None:
            entry.measurements.append(measured)
        entry.backend, entry.state = backend, State.READY
        first_run = result.first_run_seconds
        entry.load_seconds = max(result.seconds - first_run, 0.0)
        if backend.warm_up_failed and entry.first_run_seconds:
            first_run = entry.first_run_seconds  # the last cold first request's, measured
        else:
            entry.first_run_seconds = first_run
        entry.metadata, entry.signature = backend.metadata(), list(backend.inputs)
        entry.loads += 1
        warm = self.warm_exec(entry)
        penalty = miss_penalty(entry.load_seconds, first_run, 0.0 if warm is None else warm)
        pool.memory.commit(entry.id, reserve, entry.size_bytes, float(penalty), self.clock())
        entry.idle_since = self.clock()
        log.info("loaded %s on %s in %.3fs (+ first run %.4fs): size %s (%s; estimate %s), "
                 "pool %s/%s", entry.key, pool.name, entry.load_seconds, first_run,
                 format_size(entry.size_bytes), "estimated" if entry.size_estimated
                 else "measured", format_size(estimate), format_size(pool.used),
                 format_size(pool.budget))
        if pool.memory.free < 0:
            # The measurement exceeded the reservation: shed others if we can.
            for victim in pool.memory.shed_overdraft(
                    self.clock(), lambda k: k != entry.id and self._evictable(k)):
                self._start_unload(self.entries[victim], "evicted", accounted=True)
            if pool.memory.free < 0:
                log.warning("pool %s is over budget (%s > %s) and nothing is evictable",
                            pool.name, format_size(pool.used + pool.reserved
                                                   + pool.memory.overhead),
                            format_size(pool.budget))
        self._grant(pool)
        for hook in self.on_load:
            hook(entry)

    # -- waiting for room --------------------------------------------------------------
    async def _take_load_slot(self, entry: Entry, give_up: float) -> None:
        """One of the ``load_concurrency`` load slots, or ``CacheBusy`` at ``give_up``."""
        if not self._load_slots.locked():
            await self._load_slots.acquire()
            return
        entry.waiting_for_room = entry.had_to_wait = True
        try:
            await asyncio.wait_for(self._load_slots.acquire(),
                                   max(give_up - self.clock(), 0.0))
        except asyncio.TimeoutError:
            raise CacheBusy(f"model {entry.key} waited {self.wait_bound(entry):.1f}s "
                            "(load_wait_max_s) behind other loads") from None
        finally:
            entry.waiting_for_room = False

    def _count_wait(self, pool: Pool, entry: Entry, asked: float) -> None:
        """Count a load that had to wait (for a load slot or for room) once, with the
        time from asking to now."""
        if entry.had_to_wait:
            entry.had_to_wait = False
            waited = self.clock() - asked
            entry.room_waits += 1
            entry.room_wait_seconds += waited
            pool.waits += 1
            pool.wait_seconds += waited

    async def _wait_for_room(self, pool: Pool, entry: Entry, need: int,
                             give_up: float) -> None:
        """Reserve ``need`` bytes in ``pool`` for ``entry``'s load, waiting in the room
        queue until ``give_up`` at most (``_grant`` starts the victims' unloads)."""
        bound = max(give_up - self.clock(), 0.0)
        request = RoomRequest(give_up, next(self._seq), entry.id, need,
                              asyncio.get_running_loop().create_future())
        heapq.heappush(pool.waiting, request)
        self._grant(pool)
        if request.future.done():
            request.future.result()  # raises what ``_grant`` refused it with
            return
        entry.waiting_for_room = True
        log.info("load of %s waits for room on %s: needs %s, %s free, %s reserved by "
                 "loads, %d load(s) waiting", entry.key, pool.name, format_size(need),
                 format_size(max(pool.memory.free, 0)), format_size(pool.reserved),
                 len(pool.waiting))
        try:
            await asyncio.wait({request.future}, timeout=bound)
        except BaseException:
            self._withdraw(pool, request)
            raise
        finally:
            entry.waiting_for_room = False
            entry.had_to_wait = True
        if not request.future.done():
            self._withdraw(pool, request)
            busy = [e.key for e in self.entries.values()
                    if self.pool_of(e) is pool and e.state is not State.UNLOADED
                    and (e.in_flight or e.pinned)]
            raise CacheBusy(
                f"no room for model {entry.key} on {pool.name}: waited "
                f"{self.wait_bound(entry):.1f}s (load_wait_max_s) for {format_size(need)}; "
                "in use or pinned: "
                f"{', '.join(busy) or 'none'}")
        request.future.result()

    def _withdraw(self, pool: Pool, request: RoomRequest) -> None:
        """Take a waiting load out of the room queue (it gave up or was cancelled)."""
        if request.future.done() and not request.future.cancelled():
            pool.memory.cancel(request.need)  # granted meanwhile: give the room back
        else:
            request.future.cancel()
            pool.waiting.remove(request)
            heapq.heapify(pool.waiting)
        self._grant(pool)

    def _grant(self, pool: Pool) -> None:
        """Give room to the waiting loads in queue order, as far as room allows now."""
        while pool.waiting:
            head = pool.waiting[0]
            now = self.clock()
            victims = pool.memory.reserve(
                head.need, now, lambda k: k != head.key and self._evictable(k))
            if victims is None:
                if self._nothing_to_wait_for(pool):
                    heapq.heappop(pool.waiting)
                    head.future.set_exception(CacheBusy(
                        f"no room for model {head.key[0]}:{head.key[1]} on {pool.name}: "
                        "the pinned models hold what it needs; unpin one"))
                    continue
                return
            heapq.heappop(pool.waiting)
            for key in victims:  # at once: no request may lease a victim from now on
                victim = self.entries[key]
                log.info("evict %s (size=%s, penalty=%.3fs) to admit %s:%s on %s",
                         victim.key, format_size(victim.size_bytes),
                         victim.load_seconds + victim.first_run_seconds,
                         head.key[0], head.key[1], pool.name)
                self._start_unload(victim, "evicted", accounted=True)
            head.future.set_result(victims)

    def _nothing_to_wait_for(self, pool: Pool) -> bool:
        """No lease, load or unload in ``pool`` could ever free room: waiting is futile."""
        if pool.reserved or pool.unloading:
            return False
        return not any(e.in_flight and e.state is State.READY and not e.pinned
                       for e in self.entries.values() if self.pool_of(e) is pool)

    def _evictable(self, key: tuple[str, int]) -> bool:
        entry = self.entries.get(key)
        return (entry is not None and entry.state is State.READY and entry.in_flight == 0
                and not entry.pinned)

    # -- unloading -------------------------------------------------------------------
    def _start_unload(self, entry: Entry, reason: str, *,
                      accounted: bool = False) -> asyncio.Task:
        """Take ``entry`` out of the pool (unless ``accounted``: the pool chose it as a
        victim and took it out already) and unload it in a thread."""
        assert entry.state is State.READY and entry.in_flight == 0
        pool = self.pool_of(entry)
        entry.state = State.UNLOADING
        if pool is not None and not accounted:
            pool.memory.remove(entry.id)
        task = asyncio.get_running_loop().create_task(self._unload(entry, reason))
        entry.task = task
        if pool is not None:
            pool.unloading.add(task)
            task.add_done_callback(pool.unloading.discard)
        return task

    async def _unload(self, entry: Entry, reason: str) -> None:
        backend, entry.backend = entry.backend, None
        loop = asyncio.get_running_loop()
        try:
            freed, _ = await loop.run_in_executor(self.unload_executor,
                                                  self._unload_blocking, backend)
        finally:
            entry.state, entry.task = State.UNLOADED, None
        if reason == "evicted":
            entry.evictions += 1
        level = logging.WARNING if entry.size_bytes > 4 * 2**20 and -freed < entry.size_bytes // 2 \
            and not entry.size_estimated \
            and entry.spec.backend not in ("synthetic", "tfserving") else logging.INFO
        log.log(level, "unloaded %s (%s): accounted %s, RSS went down by %s", entry.key,
                reason, format_size(entry.size_bytes), format_size(-freed))
        for hook in self.on_unload:
            hook(entry, reason)

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

    def idle_unload_after(self, entry: Entry) -> float | None:
        """Seconds unused after which ``entry`` is unloaded (its config, else the
        agent's); None: never."""
        own = entry.spec.config.idle_unload_s
        return self.idle_unload_s if own is None else own

    def unload_idle(self) -> list[Entry]:
        """Unload the ready, unpinned models unused for their ``idle_unload_after``
        (the node calls this periodically); returns them."""
        now, unloaded = self.clock(), []
        for entry in list(self.entries.values()):
            after = self.idle_unload_after(entry)
            if (after is not None and entry.state is State.READY and not entry.in_flight
                    and not entry.pinned and entry.idle_since is not None
                    and now - entry.idle_since >= after):
                log.info("unload %s: unused for %.0fs (idle_unload_s %g)", entry.key,
                         now - entry.idle_since, after)
                self._start_unload(entry, "idle")
                unloaded.append(entry)
        return unloaded

    # -- admin -----------------------------------------------------------------------
    async def evict(self, name: str, version: int | None = None) -> Entry:
        """Unload now (admin / repository unload). ``ModelInUse`` while requests run,
        it is loading, or it is pinned; a no-op when it is not loaded."""
        entry = self.entry(name, version)
        if entry.state is State.UNLOADING and entry.task is not None:
            await asyncio.shield(entry.task)
            return entry
        if entry.state is State.LOADING:
            raise ModelInUse(f"model {entry.key} is loading")
        if entry.state is not State.READY:
            return entry
        if entry.in_flight:
            raise ModelInUse(f"model {entry.key} has {entry.in_flight} request(s) in flight")
        if entry.pinned:
            raise ModelInUse(f"model {entry.key} is pinned; unpin it first")
        log.info("evict %s on request", entry.key)
        await asyncio.shield(self._start_unload(entry, "evicted"))
        return entry

    def set_pinned(self, name: str, pinned: bool, version: int | None = None) -> Entry:
        entry = self.entry(name, version)
        entry.pinned = pinned
        log.info("%s %s", "pin" if pinned else "unpin", entry.key)
        pool = self.pool_of(entry)
        if pool is not None and pool.waiting:
            self._grant(pool)
        return entry

    # -- reporting -------------------------------------------------------------------
    def describe(self, entry: Entry) -> dict[str, Any]:
        """The ``/v1/cache`` object for one entry."""
        pool = self.pool_of(entry)
        now = self.clock()
        rate = utility = None
        if pool is not None:
            rate = pool.policy.request_rate(entry.id, now)
            utility = pool.policy.priority(entry.id, now) if entry.id in pool.policy else None
        size = entry.size_bytes if entry.state is State.READY else (entry.measured_bytes or 0)
        return {
            "name": entry.name, "version": entry.version,
            "backend": entry.spec.backend, "device": entry.device,
            "state": entry.state.value, "size_bytes": size,
            "size_estimated": entry.size_estimated if entry.state is State.READY
            else entry.measured_bytes is None,
            "load_seconds": round(entry.load_seconds, 6),
            "first_run_seconds": round(entry.first_run_seconds, 6),
            "loads": entry.loads, "load_attempts": entry.load_attempts,
            "hits": entry.hits, "misses": entry.misses,
            "evictions": entry.evictions, "last_used": entry.last_used,
            "request_rate": rate, "utility": utility, "pinned": entry.pinned,
            "in_flight": entry.in_flight, "error": entry.error or entry.spec.error,
            "waiting_for_room": entry.waiting_for_room,
            "waiting_requests": entry.in_flight if entry.state is not State.READY else 0,
            "room_waits": entry.room_waits,
            "room_wait_seconds": round(entry.room_wait_seconds, 6),
        }

    def memory(self) -> dict[str, dict[str, Any]]:
        return {p.name: {"used_bytes": p.used, "reserved_bytes": p.reserved,
                         "budget_bytes": p.budget, "overhead_bytes": p.memory.overhead,
                         "waiting_loads": len(p.waiting), "room_waits": p.waits,
                         "room_wait_seconds": round(p.wait_seconds, 6)}
                for p in self.pools.values()}

    def set_budget(self, device: str, budget: int) -> None:
        """Change a pool's budget (SIGHUP); waiting loads get the room it adds."""
        pool = self.pools[device]
        pool.budget = budget
        self._grant(pool)

    async def close(self) -> None:
        """Wait for loads/unloads in progress and stop the thread pools (no unloading)."""
        tasks = [e.task for e in self.entries.values() if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.load_executor.shutdown(wait=False, cancel_futures=True)
        self.unload_executor.shutdown(wait=False, cancel_futures=True)
