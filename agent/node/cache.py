"""The model cache: which models are loaded, under a byte budget per device.

Each model version is an ``Entry`` (``agent.node.entry``) whose state moves only through
``agent.node.lifecycle.transition``, along the one table of legal moves there
(``TRANSITIONS``): an illegal move raises ``IllegalTransition``, also under ``python -O``.
The parts are TF Serving's: the backend is the loader (estimate, load, unload),
``cachepolicies.pool.MemoryPool`` the resource tracker, the lifecycle the harness, and
this cache the manager that drives them.

The cache drives the simulator's miss path, ``MemoryPool``: every request calls
``record_access``; a miss *reserves* the model's estimated bytes, all or nothing, taking
victims among idle unpinned models when the budget is short; a finished load *commits*
the measured size with ``miss_penalty`` (load + cold-run surplus); every unload removes
the model. So a decision the simulator shows is the one the agent makes. Models are
keyed ``(name, version)`` in the pools and policies.

A miss runs one load task in six steps (``_load``): *fetch* (a sourced model's files
not on disk are pulled into the disk tier, ``agent.node.disktier``: remote -> disk; the
LOADING phase ``downloading``) -> *price* (make the backend, estimate
it, refuse it with 507 if it can never fit, size the reservation) -> *reserve* (a load
slot, then room) -> *load* (wait for the pool's unloads, load in a thread) -> *measure*
(its size and load times) -> *commit* (resident at the measured size with its miss
penalty, shed any overdraft, wake waiting loads, run the hooks). A sourced model's
penalty adds its download seconds while its files are not on disk (``_reprice`` when
the disk tier evicts or pulls them again).

Waiting for room: a load first takes one of ``load_concurrency`` load slots (so only
loads that run hold room), then reserves its peak (``Backend.load_room``: the runtime's
scratch while it builds the model) and commits the measured size after. A load that
finds no room now (everything resident in use, or room held by other loads) joins its
pool's *room queue*, ordered by deadline then arrival, and is granted as soon as leases
end, loads finish or pins change, strictly in that order (a later load never overtakes
the head, so none starves). A waiting load holds no reservation and no lease on another
model, so waiting cannot deadlock. It gives up with ``CacheBusy`` (503 + Retry-After)
after the model's ``load_wait_max_s`` or, for a request, its client's hard timeout.

Guarantees:
- single flight: requests for a loading model wait on that one load;
- reference counts: a model with requests in flight (``account.in_flight``) is never
  unloaded; a request holds its reference while it waits in its model's batching queue
  too;
- a state moves only along ``TRANSITIONS``; anything else is ``IllegalTransition``;
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
import contextlib
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
from agent.backends.base import Backend, BackendCrashed, BackendError, LoadResult
from agent.errors import AgentError
from agent.memory import FootprintModel, MemoryMeter, malloc_trim
from agent.node.disktier import DiskBusy, DiskTier, PullError
from agent.node.entry import Entry
from agent.node.lifecycle import (AT_REST, DOWNLOADING, IllegalTransition, Lifecycle, State,
                                  transition)
from agent.node.repository import ModelSpec, read_warmup_sample
from agent.node.roomqueue import RoomRequest
from agent.node.versionpins import VersionPins
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")


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


class NotListed(CacheError):
    """A sourced model whose versions are not known yet (its source not listed yet,
    or unreachable with no listing kept): 503 + Retry-After."""

    status = 503
    retry_after = 5.0


class Reloading(CacheError):
    """The model's runtime failed while running (``BackendCrashed``): it is unloaded
    once its requests in flight are done and loaded again by the next request; 503."""

    status = 503
    retry_after = 1.0


class LoadFailed(CacheError):
    """A load failed (a corrupt model file, a runtime that refuses it): 503, with
    ``Retry-After`` while the failure is remembered (``load_retry_s``)."""

    status = 503

    def __init__(self, message: str, retry_after: float | None = None,
                 status: int = 503):
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


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
class LoadPlan:
    """A priced load: where it goes, its backend, its estimate and the bytes it reserves."""

    pool: Pool
    backend: Backend
    estimate: int
    reserve: int
    granted: float = 0.0  # when it got its slot and room (cache clock)


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
        disk: DiskTier | None = None,
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
        self.serving_version: dict[str, int] = {}  # rollouts (``_hold_serving``)
        self.version_pins = VersionPins()  # the coordinator's: the default version
        self.on_new_version: list[Callable[[str, int, int], None]] = []
        #: The disk tier sourced models' files are pulled into (None: none).
        self.disk = disk
        if disk is not None:
            self._attach(disk)
        self.update_specs(specs)

    def _attach(self, disk: DiskTier) -> None:
        """Let the disk tier ask what memory does with a version, how long a pull may
        wait, and measure with the same meter; hear when files come and go."""
        disk.usage, disk.wait_bound = self._disk_usage, self._pull_wait_bound
        disk.meter = self.meter
        disk.on_change.append(self._files_changed)

    # -- repository ------------------------------------------------------------------
    def update_specs(self, specs: dict[str, ModelSpec]) -> None:
        """Adopt a rescan: new models appear, removed idle ones are unloaded and dropped,
        resident ones keep serving their loaded version until evicted; a new default
        version rolls out (``_hold_serving``); a failed load whose config changed is
        forgotten."""
        serving = self._serving_now()
        self.specs = dict(specs)
        self._hold_serving(serving)
        for (name, version), entry in list(self.entries.items()):
            spec = specs.get(name)
            if spec is not None and version in spec.versions:
                if entry.state is State.FAILED and spec.config != entry.spec.config:
                    self.forget_failure(entry)  # its config changed: try it again at once
                entry.spec = spec
                if entry.state is State.UNLOADED:
                    entry.account.pinned = entry.account.pinned or spec.config.pin
            elif entry.state in AT_REST:
                del self.entries[(name, version)]
            elif entry.state is State.READY and entry.account.in_flight == 0:
                self._start_unload(entry, "removed from the repository")
        for spec in specs.values():
            version = self.default_version(spec)
            if version is not None:
                self._entry_for(spec, version)

    def default_version(self, spec: ModelSpec) -> int | None:
        """The version of ``spec`` served when a request names none, once any rollout
        to it is done: the newest, or the one the coordinator pins (``versionpins``)."""
        return self.version_pins.served(spec.name, spec.versions)

    def _serving_now(self) -> dict[str, int | None]:
        return {n: self.serving_version.get(n, self.default_version(s))
                for n, s in self.specs.items()}

    def set_version_pins(self, pins: dict[str, Any]) -> None:
        """Adopt the coordinator's version pins (model -> ``VersionPin``; the models
        left out are unpinned): a model whose default version changes rolls to it as
        to a new version found by a rescan (``_hold_serving``)."""
        serving = self._serving_now()
        self.version_pins.pins = dict(pins)
        self._hold_serving(serving)
        for spec in self.specs.values():
            version = self.default_version(spec)
            if version is not None:
                self._entry_for(spec, version)

    def _hold_serving(self, serving: dict[str, int | None]) -> None:
        """A new default version of a model whose ``serving`` one is READY is not served
        until it is READY too: the old one keeps serving (``serving_version``) and
        ``on_new_version`` is called (the node rolls it out)."""
        for name, spec in self.specs.items():
            old, new = serving.get(name), self.default_version(spec)
            entry = self.entries.get((name, old)) if old is not None else None
            if old == new or new is None or old not in spec.versions or entry is None \
                    or entry.state is not State.READY or not self.on_new_version:
                self.serving_version.pop(name, None)
                continue
            self.serving_version[name] = old
            for hook in self.on_new_version:
                hook(name, old, new)
        for name in set(self.serving_version) - set(self.specs):
            del self.serving_version[name]

    def _entry_for(self, spec: ModelSpec, version: int) -> Entry:
        entry = self.entries.get((spec.name, version))
        if entry is None:
            entry = Entry(spec, version)
            self.entries[(spec.name, version)] = entry
        return entry

    def entry(self, name: str, version: int | None = None) -> Entry:
        """The entry for ``name`` (default: the highest version, or the one still serving
        while a newer one rolls out); ``UnknownModel`` if none."""
        spec = self.specs.get(name)
        if spec is None:
            raise UnknownModel(f"Request for unknown model {name!r}")
        if version is None:
            version = self.serving_version.get(name, self.default_version(spec))
            if version is None and spec.pending and not spec.error:
                raise NotListed(spec.pending)
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
            elif (version == self.default_version(spec) or entry.stats.loads
                  or entry.state is not State.UNLOADED):
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
        if record and self.disk is not None and entry.spec.sourced:
            self.disk.record_access(entry.id)
        if entry.life.crashed is not None and entry.state is State.READY:
            raise Reloading(f"{entry.life.crashed}; model {entry.key} is being reloaded")
        entry.account.in_flight += 1
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
            self._release(entry, touch=False)
            raise

    async def _until_ready(self, entry: Entry, record: bool, timeout: float | None) -> None:
        """Wait until ``entry`` is READY, starting its load task when none runs (single
        flight: every waiter waits on that one task); raise what the load raised, or
        ``CacheBusy`` once ``timeout`` has passed."""
        give_up = None if timeout is None else self.clock() + timeout
        life = entry.life
        while entry.state is not State.READY:
            if life.task is None and record:
                self._check_failure(entry)  # a request never re-loads a failed model
            if life.task is None:
                life.task = asyncio.get_running_loop().create_task(self._load(entry))
                # Waiters may all be cancelled; never leave the outcome unretrieved.
                life.task.add_done_callback(lambda t: t.cancelled() or t.exception())
            waiting_for_load = entry.state in (State.LOADING, State.UNLOADED, State.FAILED)
            task = life.task
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

    def release(self, entry: Entry) -> None:
        self._release(entry, touch=True)

    def _release(self, entry: Entry, touch: bool) -> None:
        account, life = entry.account, entry.life
        account.in_flight -= 1
        if touch:
            entry.stats.last_used = self.wall_clock()
        if account.in_flight:
            return
        account.idle_since = self.clock()
        if life.crashed is not None and entry.state is State.READY:
            log.warning("reloading %s: %s", entry.key, life.crashed)
            life.crashed = None
            self._start_unload(entry, "its runtime failed")
        elif entry.name not in self.specs and entry.state is State.READY:
            self._start_unload(entry, "removed from the repository")
        elif life.waiting_for_room and life.task is not None:
            life.task.cancel()  # nobody wants it any more: leave the room queue
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
            # unloaded when the last request is done
            entry.life.crashed = entry.life.crashed or str(exc)
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
        life = entry.life
        if entry.state is not State.FAILED or life.failed_at is None:
            return
        left = life.failed_at + self.retry_bound(entry) - self.clock()
        if left > 0:
            raise LoadFailed(f"{life.error}; the next try is in {left:.0f}s", left,
                             life.failed_status)

    def _failure_message(self, entry: Entry, exc: BaseException) -> str:
        """The reason a load failed, naming the model and version, with the repository's
        host path cut from it (a file is named relative to the repository)."""
        text = str(exc)
        for root, name in ((entry.spec.version_root.parent, "<models>"),
                           (entry.spec.path.parent, "<repository>")):
            for where in {str(root.resolve()), str(root)}:
                text = text.replace(where + "/", "").replace(where, name)
        return f"model {entry.key} failed to load: {text}"

    async def _load(self, entry: Entry) -> None:
        """``entry``'s load task: fetch -> price -> reserve -> load -> measure, then
        commit. A load that fails leaves it FAILED (``LoadFailed`` for a backend's error,
        ``PullError`` for a pull's); one that gave up waiting for room, or was
        cancelled, leaves it UNLOADED."""
        life = entry.life
        transition(life, State.LOADING, expected_from=(State.UNLOADED, State.FAILED))
        life.error, life.load_started = None, self.clock()
        life.load_attempts += 1
        try:
            await self._fetch(entry)
            plan = await self._price(entry)
            result = await self._reserve_and_load(entry, plan)
            first_run = self._measure(entry, plan, result)
        except (CacheBusy, DiskBusy) as exc:
            transition(life, State.UNLOADED, expected_from=State.LOADING)
            life.error = str(exc)
            raise
        except CacheError as exc:
            transition(life, State.FAILED, expected_from=State.LOADING)
            life.error = str(exc)
            log.warning("load %s failed: %s", entry.key, exc)
            raise
        except PullError as exc:
            self._pull_failed(life, exc)
            raise
        except BackendError as exc:
            transition(life, State.FAILED, expected_from=State.LOADING)
            life.error, life.failed_at = self._failure_message(entry, exc), self.clock()
            life.failed_status = LoadFailed.status
            log.warning("%s (retried after %.0fs)", life.error, self.retry_bound(entry))
            raise LoadFailed(life.error, self.retry_bound(entry)) from None
        except asyncio.CancelledError:
            transition(life, State.UNLOADED, expected_from=State.LOADING)
            life.error = None  # given up while waiting
            raise
        except BaseException:
            transition(life, State.FAILED, expected_from=State.LOADING)
            life.error = "load interrupted"
            raise
        else:
            self._commit(entry, plan, first_run)
        finally:
            life.task = None
            if self.disk is not None:
                self.disk.wake()  # its files, if any, are no longer being read

    def _pull_failed(self, life: Lifecycle, exc: PullError) -> None:
        """A pull failed: FAILED with the pull's status. A full disk is checked again by
        the next request (no I/O); a source's failure is remembered for load_retry_s,
        as a broken file is."""
        transition(life, State.FAILED, expected_from=State.LOADING)
        life.error, life.failed_status = str(exc), exc.status
        life.failed_at = None if exc.status == 507 else self.clock()
        log.warning("%s", life.error)

    def forget_failure(self, entry: Entry) -> None:
        """Forget ``entry``'s failed load (a config override that was rolled back): the
        next request loads it at once."""
        if entry.state is State.FAILED:
            transition(entry.life, State.UNLOADED, expected_from=State.FAILED)
            entry.life.error, entry.life.failed_at = None, None

    def wait_bound(self, entry: Entry) -> float:
        """Seconds a load of ``entry`` may wait for room: its config, else the agent's."""
        own = entry.spec.config.load_wait_max_s
        return self.load_wait_max_s if own is None else own

    def _pull_wait_bound(self, key: tuple[str, int]) -> float:
        """Seconds a pull of ``key`` may wait for disk room: its model's ``wait_bound``."""
        entry = self.entries.get(key)
        return self.load_wait_max_s if entry is None else self.wait_bound(entry)

    def _pinned_bytes(self, pool: Pool, but: Entry) -> int:
        return sum(e.account.size_bytes for e in self.entries.values()
                   if e.account.pinned and e is not but and e.state is State.READY
                   and self.pool_of(e) is pool)

    async def _fetch(self, entry: Entry) -> None:
        """Step 0: a sourced model's files onto disk (the disk tier's one pull per
        version), shown as the LOADING phase ``downloading``."""
        if not entry.spec.sourced or self.disk is None or self.disk.has(entry.id):
            return
        entry.life.phase = DOWNLOADING
        try:
            await self.disk.ensure(entry.name, entry.version, loading=True)
        finally:
            entry.life.phase = None

    async def _make_backend(self, entry: Entry, pool: Pool) -> Backend:
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
            pool.memory.overhead = await loop.run_in_executor(self.load_executor,
                                                              backend.set_up_device)
        return backend

    async def _price(self, entry: Entry) -> LoadPlan:
        """Step 1: make the backend and price the load: its estimate, ``ModelTooLarge``
        (507) when it can never fit, and the bytes it reserves while it loads."""
        pool = self.pool_of(entry)
        if pool is None:
            raise LoadFailed(f"model {entry.name!r} wants device {entry.device}, which this "
                             f"host has no budget for (devices: {', '.join(self.pools)})")
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

    async def _reserve_and_load(self, entry: Entry, plan: LoadPlan) -> LoadResult:
        """Steps 2 and 3: hold a load slot and ``plan.reserve`` bytes, then load; the
        slot is given back after, the room too if the load failed."""
        await self._reserve(entry, plan)
        try:
            return await self._run_load(plan)
        finally:
            self._load_slots.release()

    async def _reserve(self, entry: Entry, plan: LoadPlan) -> None:
        """Step 2: take a load slot, then the room (waiting in the room queue), both by
        the model's ``wait_bound``; on failure nothing is held. Room is reserved only by
        loads about to run: a load queued behind others must not hold room, or evict for
        it, meanwhile."""
        asked = self.clock()
        give_up = asked + self.wait_bound(entry)
        try:
            await self._take_load_slot(entry, give_up)
        except BaseException:
            self._count_wait(plan.pool, entry, asked)
            raise
        try:
            await self._wait_for_room(plan.pool, entry, plan.reserve, give_up)
        except BaseException:
            self._load_slots.release()
            raise
        finally:
            self._count_wait(plan.pool, entry, asked)
        plan.granted = self.clock()

    async def _run_load(self, plan: LoadPlan) -> LoadResult:
        """Step 3: wait for the pool's unloads (never load into memory still being
        freed), then load and measure in the load executor; on failure the reserved room
        goes back to the waiting loads."""
        pool = plan.pool
        try:
            while pool.unloading:
                await asyncio.wait(set(pool.unloading))
            return await asyncio.get_running_loop().run_in_executor(
                self.load_executor, load_measured, plan.backend, self.meter)
        except BaseException:
            pool.memory.cancel(plan.reserve)
            self._grant(pool)
            raise

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
        """Step 5: READY, resident in the pool at its measured size with its miss
        penalty; shed any overdraft, wake the waiting loads, run the ``on_load`` hooks."""
        pool, account = plan.pool, entry.account
        transition(entry.life, State.READY, expected_from=State.LOADING)
        entry.backend = plan.backend
        entry.stats.loads += 1
        entry.stats.slot_seconds += self.clock() - plan.granted  # the twin's profile
        pool.memory.commit(entry.id, plan.reserve, account.size_bytes,
                           self.penalty(entry, first_run), self.clock())
        account.idle_since = self.clock()
        log.info("loaded %s on %s in %.3fs (+ first run %.4fs): size %s (%s; estimate %s), "
                 "pool %s/%s", entry.key, pool.name, account.load_seconds, first_run,
                 format_size(account.size_bytes), "estimated" if account.size_estimated
                 else "measured", format_size(plan.estimate), format_size(pool.used),
                 format_size(pool.budget))
        if pool.memory.free < 0:
            self._shed_overdraft(pool, entry)
        self._grant(pool)
        for hook in self.on_load:
            hook(entry)

    def penalty(self, entry: Entry, first_run: float | None = None) -> float:
        """Seconds a miss of ``entry`` costs (``miss_penalty``): load + the cold first
        run's surplus + its download while its files are not on disk."""
        account = entry.account
        warm = self.warm_exec(entry)
        return float(miss_penalty(
            account.load_seconds,
            account.first_run_seconds if first_run is None else first_run,
            0.0 if warm is None else warm, self.download_seconds(entry)))

    def download_seconds(self, entry: Entry) -> float:
        """Seconds ``entry``'s files take to pull before it can load: its last measured
        download while they are not on disk, else 0."""
        if entry.spec.sourced and self.disk is not None and not self.disk.has(entry.id):
            return self.disk.download_seconds(entry.id)
        return 0.0

    def _files_changed(self, key: tuple[str, int], on_disk: bool) -> None:
        """The disk tier pulled or evicted ``key``'s files: a resident model's penalty
        changes (its download counts while they are off disk)."""
        entry = self.entries.get(key)
        pool = self.pool_of(entry) if entry is not None else None
        if pool is None or key not in pool.memory:
            return
        penalty = self.penalty(entry)
        pool.policy.remove(key)
        pool.policy.admit(key, pool.memory.sizes[key], penalty, self.clock())
        log.info("%s: files %s disk; miss penalty now %.3fs", entry.key,
                 "back on" if on_disk else "evicted from", penalty)

    def _disk_usage(self, key: tuple[str, int]) -> str:
        """What memory does with ``key``'s files, for the disk tier's eviction: pinned,
        reading (loading, or a TF Serving model, whose server reads its directory),
        resident (in memory, files not needed), or idle. A version a rollout keeps at
        hand (``version_pins``) counts as pinned."""
        if self.version_pins.kept(*key):
            return "pinned"
        entry = self.entries.get(key)
        if entry is None:
            return "idle"
        if entry.account.pinned:
            return "pinned"
        if entry.state is State.LOADING or (entry.state is not State.UNLOADED
                                            and entry.spec.backend == "tfserving"):
            return "reading"
        if entry.state in (State.READY, State.UNLOADING):
            return "resident"
        return "idle"

    def _shed_overdraft(self, pool: Pool, entry: Entry) -> None:
        """``entry``'s measurement exceeded its reservation: evict others (idle, unpinned)
        until the pool is within budget, as far as they allow."""
        for victim in pool.memory.shed_overdraft(
                self.clock(), lambda k: k != entry.id and self._evictable(k)):
            self._start_unload(self.entries[victim], "evicted", accounted=True)
        if pool.memory.free < 0:
            log.warning("pool %s is over budget (%s > %s) and nothing is evictable",
                        pool.name, format_size(pool.used + pool.reserved
                                               + pool.memory.overhead),
                        format_size(pool.budget))

    # -- waiting for room --------------------------------------------------------------
    async def _take_load_slot(self, entry: Entry, give_up: float) -> None:
        """One of the ``load_concurrency`` load slots, or ``CacheBusy`` at ``give_up``."""
        if not self._load_slots.locked():
            await self._load_slots.acquire()
            return
        entry.life.waiting_for_room = entry.life.had_to_wait = True
        try:
            await asyncio.wait_for(self._load_slots.acquire(),
                                   max(give_up - self.clock(), 0.0))
        except asyncio.TimeoutError:
            raise CacheBusy(f"model {entry.key} waited {self.wait_bound(entry):.1f}s "
                            "(load_wait_max_s) behind other loads") from None
        finally:
            entry.life.waiting_for_room = False

    def _count_wait(self, pool: Pool, entry: Entry, asked: float) -> None:
        """Count a load that had to wait (for a load slot or for room) once, with the
        time from asking to now."""
        if entry.life.had_to_wait:
            entry.life.had_to_wait = False
            waited = self.clock() - asked
            entry.stats.room_waits += 1
            entry.stats.room_wait_seconds += waited
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
        entry.life.waiting_for_room = True
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
            entry.life.waiting_for_room = False
            entry.life.had_to_wait = True
        if not request.future.done():
            self._withdraw(pool, request)
            busy = [e.key for e in self.entries.values()
                    if self.pool_of(e) is pool and e.state is not State.UNLOADED
                    and (e.account.in_flight or e.account.pinned)]
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
                         victim.key, format_size(victim.account.size_bytes),
                         victim.account.load_seconds + victim.account.first_run_seconds,
                         head.key[0], head.key[1], pool.name)
                self._start_unload(victim, "evicted", accounted=True)
            head.future.set_result(victims)

    def _nothing_to_wait_for(self, pool: Pool) -> bool:
        """No lease, load or unload in ``pool`` could ever free room: waiting is futile."""
        if pool.reserved or pool.unloading:
            return False
        return not any(e.account.in_flight and e.state is State.READY
                       and not e.account.pinned
                       for e in self.entries.values() if self.pool_of(e) is pool)

    def _evictable(self, key: tuple[str, int]) -> bool:
        entry = self.entries.get(key)
        return (entry is not None and entry.state is State.READY
                and entry.account.in_flight == 0 and not entry.account.pinned)

    # -- unloading -------------------------------------------------------------------
    def _start_unload(self, entry: Entry, reason: str, *,
                      accounted: bool = False) -> asyncio.Task:
        """Take ``entry`` out of the pool (unless ``accounted``: the pool chose it as a
        victim and took it out already) and unload it in a thread. Only a READY model
        with no request in flight may go: anything else is ``IllegalTransition``."""
        if entry.account.in_flight:
            raise IllegalTransition(entry.key, entry.state, State.UNLOADING,
                                    f"{entry.account.in_flight} request(s) in flight")
        transition(entry.life, State.UNLOADING, expected_from=State.READY)
        pool = self.pool_of(entry)
        if pool is not None and not accounted:
            pool.memory.remove(entry.id)
        task = asyncio.get_running_loop().create_task(self._unload(entry, reason))
        entry.life.task = task
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
            entry.life.task = None
            transition(entry.life, State.UNLOADED, expected_from=State.UNLOADING)
        if reason == "evicted":
            entry.stats.evictions += 1
        size, estimated = entry.account.size_bytes, entry.account.size_estimated
        level = logging.WARNING if size > 4 * 2**20 and -freed < size // 2 \
            and not estimated \
            and entry.spec.backend not in ("synthetic", "tfserving") else logging.INFO
        log.log(level, "unloaded %s (%s): accounted %s, RSS went down by %s", entry.key,
                reason, format_size(size), format_size(-freed))
        if self.disk is not None:
            self.disk.wake()  # a TF Serving model's files are no longer read
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
            after, account = self.idle_unload_after(entry), entry.account
            if (after is not None and entry.state is State.READY and not account.in_flight
                    and not account.pinned and account.idle_since is not None
                    and now - account.idle_since >= after):
                log.info("unload %s: unused for %.0fs (idle_unload_s %g)", entry.key,
                         now - account.idle_since, after)
                self._start_unload(entry, "idle")
                unloaded.append(entry)
        return unloaded

    # -- admin -----------------------------------------------------------------------
    async def evict(self, name: str, version: int | None = None) -> Entry:
        """Unload now (admin / repository unload). ``ModelInUse`` while requests run,
        it is loading, or it is pinned; a no-op when it is not loaded."""
        entry = self.entry(name, version)
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
        await asyncio.shield(self._start_unload(entry, "evicted"))
        return entry

    def set_pinned(self, name: str, pinned: bool, version: int | None = None) -> Entry:
        entry = self.entry(name, version)
        entry.account.pinned = pinned
        log.info("%s %s", "pin" if pinned else "unpin", entry.key)
        pool = self.pool_of(entry)
        if pool is not None and pool.waiting:
            self._grant(pool)
        if self.disk is not None and not pinned:
            self.disk.wake()
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
        account, stats, life = entry.account, entry.stats, entry.life
        ready = entry.state is State.READY
        return {
            "name": entry.name, "version": entry.version,
            "backend": entry.spec.backend, "device": entry.device,
            "state": entry.state.value,
            "size_bytes": account.size_bytes if ready else (account.measured_bytes or 0),
            "size_estimated": account.size_estimated if ready
            else account.measured_bytes is None,
            "load_seconds": round(account.load_seconds, 6),
            "first_run_seconds": round(account.first_run_seconds, 6),
            "loads": stats.loads, "load_attempts": life.load_attempts,
            "hits": stats.hits, "misses": stats.misses,
            "evictions": stats.evictions, "last_used": stats.last_used,
            "request_rate": rate, "utility": utility, "pinned": account.pinned,
            "in_flight": account.in_flight, "error": life.error or entry.spec.error,
            "waiting_for_room": life.waiting_for_room,
            "waiting_requests": account.in_flight if not ready else 0,
            "room_waits": stats.room_waits,
            "room_wait_seconds": round(stats.room_wait_seconds, 6),
            **self._describe_disk(entry),
        }

    def _describe_disk(self, entry: Entry) -> dict[str, Any]:
        """A sourced model's disk tier fields (``/v1/cache``): its source (display URL
        only), files on disk, download progress and seconds."""
        disk = self.disk
        if not entry.spec.sourced or disk is None:
            return {"phase": entry.life.phase}
        ref = disk.sources.get(entry.name)
        return {"phase": entry.life.phase,
                "source": ref.display_url if ref is not None else None,
                "listing_error": disk.listing_error(entry.name),
                "on_disk": disk.has(entry.id),
                "disk_bytes": disk.held.get(entry.id, 0),
                "download_seconds": round(disk.download_seconds(entry.id), 6),
                "download": disk.progress(entry.id)}

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
        tasks = [e.life.task for e in self.entries.values() if e.life.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.load_executor.shutdown(wait=False, cancel_futures=True)
        self.unload_executor.shutdown(wait=False, cancel_futures=True)
