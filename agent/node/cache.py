"""The model cache: which models are loaded, under a byte budget per device.

The cache drives a ``cachepolicies`` policy with the simulator's verbs: every request
calls ``record_access``; a miss reserves the model's estimated bytes, asking the policy
for victims (``choose_victims`` with an ``evictable`` predicate) when the budget is
short; a finished load calls ``admit`` with the *measured* size and penalty = load time
+ first run; every unload calls ``remove``. So a decision the simulator shows is the
one the agent makes.

Guarantees:
- single flight: requests for a loading model wait on that one load;
- reference counts: a model with requests in flight (``in_flight``) is never unloaded;
  a request holds its reference while it waits in its model's batching queue too;
- pinned models are never chosen as victims;
- a model larger than its device budget is ``ModelTooLarge``; one that does not fit now
  because everything resident is in use or pinned is ``CacheBusy`` (503 + Retry-After);
- nothing loads into memory still being freed: a load first waits for the pool's
  pending unloads.

All state changes happen on the event loop; only backend load/infer/unload run in
thread pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from cachepolicies.base import InsufficientSpace, Policy
from cachepolicies.registry import make_policy

from agent.backends import make_backend
from agent.backends.base import Backend, BackendError, TensorSpec
from agent.memory import FootprintModel, MemoryMeter, malloc_trim
from agent.node.repository import ModelSpec
from agent.units import format_size

log = logging.getLogger("edgeagent.cache")


class State(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class CacheError(Exception):
    """A request the cache cannot serve; ``status`` is the HTTP status to answer with."""

    status = 500
    retry_after: float | None = None


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


class LoadFailed(CacheError):
    status = 500


@dataclass
class Pool:
    """One device's memory: budget, bytes held by resident models, bytes reserved by
    loads in progress, and the policy ranking its resident models."""

    name: str
    budget: int
    policy: Policy
    used: int = 0
    reserved: int = 0
    unloading: set[asyncio.Task] = field(default_factory=set)


@dataclass
class Entry:
    """One version of one model and its counters."""

    spec: ModelSpec
    version: int
    state: State = State.UNLOADED
    backend: Backend | None = None
    size_bytes: int = 0
    size_estimated: bool = True
    measured_bytes: int | None = None  # last clean measurement, survives unloads
    load_seconds: float = 0.0
    load_started: float | None = None  # cache clock at the start of the last load
    first_run_seconds: float = 0.0
    loads: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    last_used: float | None = None
    pinned: bool = False
    in_flight: int = 0
    error: str | None = None
    task: asyncio.Task | None = None
    metadata: dict[str, Any] | None = None  # inputs/outputs, kept after unload
    signature: list[TensorSpec] | None = None  # input specs, kept after unload

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def key(self) -> str:
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
        load_concurrency: int = 2,
        infer_executor: Executor | None = None,
    ) -> None:
        self.policy_spec = policy
        self.pools = {name: Pool(name, budget, make_policy(policy))
                      for name, budget in budgets.items()}
        self.clock, self.wall_clock = clock, wall_clock
        self.backend_factory = backend_factory
        self.footprints = footprints or FootprintModel()
        self.meter = meter or MemoryMeter()
        self.load_executor = ThreadPoolExecutor(load_concurrency, "edgeagent-load")
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
            raise UnknownModel(f"unknown model {name!r}")
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
                      record: bool = True) -> Entry:
        """The entry, loaded, with one reference held: call ``release`` when done."""
        entry = self.entry(name, version)
        if entry.spec.error:
            raise ModelInvalid(entry.spec.error)
        pool = self.pool_of(entry)
        if record and pool is not None:
            pool.policy.record_access(entry.key, self.clock())
        entry.in_flight += 1
        try:
            if entry.state is State.READY:
                if record:
                    entry.hits += 1
                return entry
            if record:
                entry.misses += 1
            while entry.state is not State.READY:
                if entry.task is None:
                    entry.task = asyncio.get_running_loop().create_task(self._load(entry))
                    # Waiters may all be cancelled; never leave the outcome unretrieved.
                    entry.task.add_done_callback(
                        lambda t: t.cancelled() or t.exception())
                waiting_for_load = entry.state in (State.LOADING, State.UNLOADED,
                                                   State.FAILED)
                task = entry.task
                try:
                    await asyncio.shield(task)
                except CacheError:
                    raise
                except Exception as exc:  # noqa: BLE001 - an unload that failed
                    if waiting_for_load:
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
        if entry.in_flight == 0 and entry.name not in self.specs and entry.state is State.READY:
            self._start_unload(entry, "removed from the repository")

    @contextlib.asynccontextmanager
    async def lease(self, name: str, version: int | None = None) -> AsyncIterator[Entry]:
        entry = await self.acquire(name, version)
        try:
            yield entry
        finally:
            self.release(entry)

    async def ensure_loaded(self, name: str, version: int | None = None) -> Entry:
        """Load without counting a request (repository load, warm restart, pins)."""
        entry = await self.acquire(name, version, record=False)
        self._release(entry, touch=False)
        return entry

    # -- loading ---------------------------------------------------------------------
    async def _load(self, entry: Entry) -> None:
        entry.state, entry.error = State.LOADING, None
        entry.load_started = self.clock()
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
            entry.state, entry.error = State.FAILED, str(exc)
            log.warning("load %s failed: %s", entry.key, exc)
            raise LoadFailed(str(exc)) from None
        except BaseException:
            entry.state = State.FAILED
            entry.error = "load interrupted"
            raise
        finally:
            entry.task = None

    async def _do_load(self, entry: Entry) -> None:
        pool = self.pool_of(entry)
        if pool is None:
            raise LoadFailed(f"model {entry.name!r} wants device {entry.device}, which this "
                             f"host has no budget for (devices: {', '.join(self.pools)})")
        kind = entry.spec.backend or "onnx"
        backend = self.backend_factory(kind, entry.name, entry.version, entry.spec.path,
                                       entry.spec.config, self.footprints)
        estimate = backend.estimate()
        # A clean measurement from an earlier load beats the file-size estimate.
        reserve = entry.measured_bytes or estimate
        if reserve > pool.budget:
            raise ModelTooLarge(
                f"model {entry.key} needs {format_size(reserve)} ({reserve} bytes) but the "
                f"whole {pool.name} budget is {format_size(pool.budget)} ({pool.budget} bytes)")
        self._make_room(pool, reserve, entry, "admit")
        pool.reserved += reserve
        try:
            while pool.unloading:  # never load into memory that is still being freed
                await asyncio.wait(set(pool.unloading))
            loop = asyncio.get_running_loop()
            delta, clean, seconds = await loop.run_in_executor(
                self.load_executor, self._load_blocking, backend)
        finally:
            pool.reserved -= reserve
        measured = backend.measured_bytes()
        if measured is None and clean and delta > 0:
            measured = delta
            if hasattr(backend, "file_bytes"):
                self.footprints.observe(kind, backend.file_bytes(), delta)
        entry.size_estimated = measured is None
        entry.size_bytes = measured if measured is not None else estimate
        if measured is not None:  # the largest clean measurement: reservations stay safe
            entry.measured_bytes = max(measured, entry.measured_bytes or 0)
        entry.backend, entry.state = backend, State.READY
        entry.load_seconds, entry.first_run_seconds = seconds, backend.first_run_seconds
        entry.metadata, entry.signature = backend.metadata(), list(backend.inputs)
        entry.loads += 1
        pool.used += entry.size_bytes
        penalty = seconds  # load_blocking includes the warm-up (first) run
        pool.policy.admit(entry.key, entry.size_bytes, penalty, self.clock())
        log.info("loaded %s on %s in %.3fs (first run %.4fs): size %s (%s; estimate %s), "
                 "pool %s/%s", entry.key, pool.name, seconds, backend.first_run_seconds,
                 format_size(entry.size_bytes), "estimated" if entry.size_estimated
                 else "measured", format_size(estimate), format_size(pool.used),
                 format_size(pool.budget))
        if pool.used + pool.reserved > pool.budget:
            # The measurement exceeded the reservation: shed others if we can.
            try:
                self._make_room(pool, 0, entry, "correct an under-estimate")
            except CacheBusy:
                log.warning("pool %s is over budget (%s > %s) and nothing is evictable",
                            pool.name, format_size(pool.used), format_size(pool.budget))
        for hook in self.on_load:
            hook(entry)

    def _load_blocking(self, backend: Backend) -> tuple[int, bool, float]:
        """Load in a worker thread: (RSS delta, delta is clean, seconds incl. first run)."""
        window = self.meter.begin()
        started = time.perf_counter()
        try:
            backend.load()
        except BaseException:
            self.meter.end(window)
            with contextlib.suppress(Exception):
                backend.unload()
            malloc_trim()
            raise
        seconds = time.perf_counter() - started
        return (*self.meter.end(window), seconds)

    def _evictable(self, key: str) -> bool:
        name, _, version = key.rpartition(":")
        entry = self.entries.get((name, int(version)))
        return (entry is not None and entry.state is State.READY and entry.in_flight == 0
                and not entry.pinned)

    def _make_room(self, pool: Pool, need: int, entry: Entry, why: str) -> None:
        """Choose and start unloading victims so ``need`` more bytes fit in ``pool``."""
        over = pool.used + pool.reserved + need - pool.budget
        if over <= 0:
            return
        now = self.clock()
        try:
            victims = pool.policy.choose_victims(
                over, now, evictable=lambda k: k != entry.key and self._evictable(k))
        except InsufficientSpace as exc:
            busy = [e.key for e in self.entries.values()
                    if e.state is State.READY and self.pool_of(e) is pool
                    and (e.in_flight or e.pinned)]
            log.info("cannot %s %s: need %d more bytes in %s, only %d evictable "
                     "(in use or pinned: %s)", why, entry.key, over, pool.name,
                     exc.freeable_bytes, ", ".join(busy) or "none")
            raise CacheBusy(
                f"no room for model {entry.key} on {pool.name} right now: needs {over} more "
                f"bytes, only {exc.freeable_bytes} are held by idle unpinned models") from None
        for key in victims:
            name, _, version = key.rpartition(":")
            victim = self.entries[(name, int(version))]
            log.info("evict %s (utility=%.4g, rate=%.4g/s, size=%s, penalty=%.3fs) to %s %s "
                     "(need %d bytes on %s)", key, pool.policy.priority(key, now),
                     pool.policy.request_rate(key, now) or 0.0,
                     format_size(victim.size_bytes), pool.policy.penalty_of(key), why,
                     entry.key, over, pool.name)
            self._start_unload(victim, "evicted")

    # -- unloading -------------------------------------------------------------------
    def _start_unload(self, entry: Entry, reason: str) -> asyncio.Task:
        """Take ``entry`` out of the policy and the budget and unload it in a thread."""
        assert entry.state is State.READY and entry.in_flight == 0
        pool = self.pool_of(entry)
        entry.state = State.UNLOADING
        if pool is not None:
            pool.policy.remove(entry.key)
            pool.used -= entry.size_bytes
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
        return entry

    # -- reporting -------------------------------------------------------------------
    def describe(self, entry: Entry) -> dict[str, Any]:
        """The ``/v1/cache`` object for one entry."""
        pool = self.pool_of(entry)
        now = self.clock()
        rate = utility = None
        if pool is not None:
            rate = pool.policy.request_rate(entry.key, now)
            utility = pool.policy.priority(entry.key, now) if entry.key in pool.policy else None
        size = entry.size_bytes if entry.state is State.READY else (entry.measured_bytes or 0)
        return {
            "name": entry.name, "version": entry.version,
            "backend": entry.spec.backend, "device": entry.device,
            "state": entry.state.value, "size_bytes": size,
            "size_estimated": entry.size_estimated if entry.state is State.READY
            else entry.measured_bytes is None,
            "load_seconds": round(entry.load_seconds, 6),
            "first_run_seconds": round(entry.first_run_seconds, 6),
            "loads": entry.loads, "hits": entry.hits, "misses": entry.misses,
            "evictions": entry.evictions, "last_used": entry.last_used,
            "request_rate": rate, "utility": utility, "pinned": entry.pinned,
            "in_flight": entry.in_flight, "error": entry.error or entry.spec.error,
        }

    def memory(self) -> dict[str, dict[str, int]]:
        return {p.name: {"used_bytes": p.used, "reserved_bytes": p.reserved,
                         "budget_bytes": p.budget} for p in self.pools.values()}

    async def close(self) -> None:
        """Wait for loads/unloads in progress and stop the thread pools (no unloading)."""
        tasks = [e.task for e in self.entries.values() if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.load_executor.shutdown(wait=False, cancel_futures=True)
        self.unload_executor.shutdown(wait=False, cancel_futures=True)
