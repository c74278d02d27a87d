"""The model cache: which models are loaded, under a byte budget per device; the façade
of the package ``agent.node.cache``, whose parts each do one job:

- ``catalog``: the specs, an ``Entry`` per version (``entry``), the serving version;
- ``lifecycle``: the states, the one table of legal moves, the named moves (TF Serving's
  harness: an illegal move raises ``IllegalTransition``, also under ``python -O``);
- ``leases``: a request's reference on its model (never unloaded under it), single
  flight for a cold one;
- ``loads``: a miss's load task (fetch -> price -> reserve -> load -> measure ->
  commit);
- ``pools``: one device's books (``cachepolicies.pool.MemoryPool``) and its room queue
  (``cachepolicies.roomqueue``), woken only by the pool's bookkeeping;
- ``unloads``: victims, idle models, admin evicts and ``unload_when_idle``;
- ``tiers``: the memory and disk tiers and what each tells the other (the penalty);
- ``disktier`` and ``sourcelistings``: the sourced models' files on disk;
- ``rollout``: a new version loaded beside the old one (``next_action``);
- ``versionpins``: the coordinator's pins of the version each model serves (rollouts);
- ``views``: ``/v1/cache`` and the pools' figures.

The cache drives the simulator's miss path, ``MemoryPool``: every request records its
access; a miss reserves the model's estimated bytes (its load peak), all or nothing,
taking victims among idle unpinned models; a finished load commits the measured size
with ``miss_penalty`` (load + cold-run surplus over a warm run + download); every unload
removes the model. So a decision the simulator shows is the one the agent makes. Models
are keyed ``(name, version)`` in the pools and policies.

Guarantees: single flight; a model with requests in flight is never unloaded; pinned
models are never victims; a model whose lower bound exceeds what could ever be freed is
``ModelTooLarge`` (507); one that must wait longer than its bound is ``CacheBusy`` (503
+ Retry-After); nothing loads into memory still being freed. All state changes happen on
the event loop; only backend load/infer/unload run in thread pools.

Its collaborators come at construction: the disk tier is made by ``disk`` (given its
view of memory), and ``listener`` hears each load and unload (the node passes itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import Any, Callable, Protocol

from cachepolicies.pool import MemoryPool
from cachepolicies.registry import make_policy, prime_policy

from agent.backends import make_backend
from agent.backends.base import Backend
from agent.memory import FootprintModel, MemoryMeter
from agent.node.cache.catalog import Catalog
from agent.node.cache.disktier import DiskTier
from agent.node.cache.entry import Entry
from agent.node.cache.leases import Lease, Leases
from agent.node.cache.lifecycle import State
from agent.node.cache.loads import Loads
from agent.node.cache.pools import DevicePool
from agent.node.cache.rollout import Rollouts
from agent.node.cache.settings import CacheSettings
from agent.node.cache.tiers import DiskFactory, Tiers
from agent.node.cache.unloads import Unloads
from agent.node.cache.versionpins import VersionPin, VersionPins
from agent.node.cache import views
from agent.node.repository import ModelSpec

log = logging.getLogger("edgeagent.cache")


class CacheListener(Protocol):
    """What the cache tells whoever listens (the node: serving, metrics, state file)."""

    def model_loaded(self, entry: Entry) -> None:
        """``entry`` is READY: its backend is ``entry.backend``."""

    def model_unloaded(self, entry: Entry, reason: str) -> None:
        """``entry`` was unloaded (evicted, idle, crashed, removed)."""


class _Nobody:
    def model_loaded(self, entry: Entry) -> None:
        pass

    def model_unloaded(self, entry: Entry, reason: str) -> None:
        pass


class ModelCache:
    """Loads, serves and evicts models of a repository under per-device budgets."""

    def __init__(
        self,
        specs: dict[str, ModelSpec],
        budgets: dict[str, int],
        *,
        policy: str = "cremebrulee-forecast",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        backend_factory: Callable[..., Backend] = make_backend,
        footprints: FootprintModel | None = None,
        meter: MemoryMeter | None = None,
        load_concurrency: int = 1,
        load_wait_max_s: float = 30.0,
        idle_unload_s: float | None = None,
        load_retry_s: float = 30.0,
        disk: DiskFactory | None = None,
        listener: CacheListener | None = None,
    ) -> None:
        self.policy_spec = policy
        prime_policy(policy)  # the first request must not pay for loading the kernels
        self.clock, self.wall_clock = clock, wall_clock
        self.footprints = footprints or FootprintModel()
        self.meter = meter or MemoryMeter()
        self.backend_factory = backend_factory
        self.settings = CacheSettings(load_wait_max_s, load_retry_s, idle_unload_s)
        listener = listener or _Nobody()
        self.entries: dict[tuple[str, int], Entry] = {}
        self.pools: dict[str, DevicePool] = {}
        self.unloads = Unloads(self.entries, self.pools, self.settings, self.meter, clock,
                               listener)
        for name, budget in budgets.items():
            self.pools[name] = DevicePool(name, MemoryPool(budget, make_policy(policy)),
                                          self.unloads, clock)
        #: the coordinator's: the version each model serves by default (rollouts)
        self.version_pins = VersionPins()
        self.tiers = Tiers(self.entries, self.pools, self.unloads, self.settings, clock,
                           self.meter, disk, self.version_pins)
        self.catalog = Catalog(self.entries, self.tiers, self.version_pins)
        self.loads = Loads(self.tiers, self.settings, backend_factory=backend_factory,
                           footprints=self.footprints, meter=self.meter,
                           load_concurrency=load_concurrency, clock=clock, listener=listener)
        self.leases = Leases(self.catalog, self.tiers, self.loads, self.unloads,
                             clock=clock, wall_clock=wall_clock)
        self.rollouts = Rollouts(self.catalog, self.leases, self.unloads)
        self.update_specs(specs)

    @property
    def disk(self) -> DiskTier | None:
        """The disk tier sourced models' files are pulled into (None: none)."""
        return self.tiers.disk

    @property
    def specs(self) -> dict[str, ModelSpec]:
        return self.catalog.specs

    @property
    def load_executor(self) -> Executor:
        return self.loads.executor

    # -- repository ------------------------------------------------------------------
    def update_specs(self, specs: dict[str, ModelSpec]) -> None:
        """Adopt a rescan: new models appear, removed idle ones are unloaded and dropped,
        resident ones keep serving their loaded version until evicted; a new default
        version rolls out (``rollout``); a failed load whose config changed is
        forgotten."""
        serving = {name: self.catalog.serving(name) for name in self.catalog.specs}
        for entry in self.catalog.adopt(specs):
            self.unloads.start(entry, "removed from the repository")
        self.rollouts.rescanned(serving)

    def set_version_pins(self, pins: dict[str, VersionPin]) -> None:
        """Adopt the coordinator's version pins (model -> ``VersionPin``; the models left
        out are unpinned): a model whose default version changes rolls to it as to a new
        version found by a rescan (``rollout``); versions no longer kept are unloaded
        once idle, unless they serve."""
        serving = {name: self.catalog.serving(name) for name in self.catalog.specs}
        before = self.version_pins.pins
        self.version_pins.pins = dict(pins)
        self.catalog.add_defaults()
        self.rollouts.rescanned(serving)
        for name, pin in before.items():
            released = set(pin.keep) - set(pins[name].keep if name in pins else ())
            if released:
                self.rollouts.release(name, released)
        if self.tiers.disk is not None:
            self.tiers.disk.usage_changed()

    def default_version(self, name: str) -> int | None:
        """The version ``name`` serves once any rollout to it is done (None: unknown)."""
        spec = self.catalog.specs.get(name)
        return self.catalog.default(spec) if spec is not None else None

    def entry(self, name: str, version: int | None = None) -> Entry:
        """The entry for ``name`` (default: the highest version, or the one still serving
        while a newer one rolls out); ``UnknownModel`` if none."""
        return self.catalog.entry(name, version)

    def serving_version(self, name: str) -> int | None:
        """The version requests for ``name`` without one go to."""
        return self.catalog.serving(name)

    def listing(self) -> list[Entry]:
        """Default-version entries of every model, plus other versions that were used."""
        return self.catalog.listing()

    def pool_of(self, entry: Entry) -> DevicePool | None:
        return self.tiers.pool_of(entry)

    # -- serving ---------------------------------------------------------------------
    async def acquire(self, name: str, version: int | None = None, *,
                      record: bool = True, timeout: float | None = None) -> Entry:
        """The entry, loaded, with one reference held: call ``release`` when done.
        ``timeout``: seconds this caller waits at most for a load (``CacheBusy``)."""
        return await self.leases.acquire(name, version, record=record, timeout=timeout)

    def release(self, entry: Entry) -> None:
        self.leases.release(entry)

    def lease(self, name: str, version: int | None = None, *,
              timeout: float | None = None) -> Lease:
        """``async with``: hold ``name`` loaded while the block runs; a runtime that
        crashes under it (``BackendCrashed``) is unloaded when its last request is
        done."""
        return Lease(self.leases, name, version, timeout)

    async def ensure_loaded(self, name: str, version: int | None = None) -> Entry:
        """Load without counting a request (repository load, warm restart, pins)."""
        return await self.leases.ensure_loaded(name, version)

    def measured_runs(self, entry: Entry, *, warm: float | None = None,
                      first: float | None = None) -> None:
        """The serving layer measured ``entry``'s runs: a ``warm`` one's seconds (its
        next load's penalty counts the first run's surplus over it), or the ``first``
        run of a model whose warm-up failed (its first request was the cold run)."""
        self.tiers.measured_runs(entry, warm, first)

    # -- loads and their bounds ------------------------------------------------------
    def forget_failure(self, entry: Entry) -> None:
        """Forget ``entry``'s failed load (a config override that was rolled back): the
        next request loads it at once."""
        if entry.state is State.FAILED:
            entry.life.forget_failure()

    def wait_bound(self, entry: Entry) -> float:
        return self.settings.wait_bound(entry)

    def retry_bound(self, entry: Entry) -> float:
        return self.settings.retry_bound(entry)

    def penalty(self, entry: Entry) -> float:
        """Seconds a miss of ``entry`` costs now (``miss_penalty``)."""
        return self.tiers.penalty(entry)

    def download_seconds(self, entry: Entry) -> float:
        return self.tiers.download_seconds(entry)

    # -- unloads ---------------------------------------------------------------------
    def idle_unload_after(self, entry: Entry) -> float | None:
        return self.settings.idle_unload_after(entry)

    def unload_idle(self) -> list[Entry]:
        """Unload the ready, unpinned models unused for their ``idle_unload_after``
        (the node calls this periodically); returns them."""
        return self.unloads.idle()

    async def unload_when_idle(self, entry: Entry, *,
                               keep: Callable[[Entry], bool] = lambda entry: False) -> bool:
        """Unload ``entry`` once its requests in flight are done: True once unloaded,
        False when it stopped being READY, was pinned, or ``keep`` says to keep it."""
        return await self.unloads.when_idle(entry, keep)

    async def evict(self, name: str, version: int | None = None) -> Entry:
        """Unload now (admin / repository unload). ``ModelInUse`` while requests run,
        it is loading, or it is pinned; a no-op when it is not loaded."""
        return await self.unloads.unload_now(self.entry(name, version))

    # -- admin -----------------------------------------------------------------------
    def set_pinned(self, name: str, pinned: bool, version: int | None = None) -> Entry:
        entry = self.entry(name, version)
        entry.pin(pinned)
        log.info("%s %s", "pin" if pinned else "unpin", entry.key)
        return entry

    def set_budget(self, device: str, budget: int) -> None:
        """Change a pool's budget (SIGHUP); waiting loads get the room it adds."""
        self.pools[device].budget = budget

    def has_room_for(self, entry: Entry) -> bool:
        """Whether ``entry``'s pool has room for it now without evicting anything."""
        pool = self.pool_of(entry)
        need = entry.account.measured_bytes or entry.account.size_bytes
        return pool is None or pool.memory.free >= need

    # -- reporting -------------------------------------------------------------------
    def describe(self, entry: Entry) -> dict[str, Any]:
        """The ``/v1/cache`` object for one entry."""
        return views.describe(self.tiers, entry, self.clock())

    def memory(self) -> dict[str, dict[str, Any]]:
        return views.memory(self.tiers)

    async def close(self) -> None:
        """Stop the rollouts, wait for loads/unloads in progress and stop the thread
        pools (no unloading)."""
        await self.rollouts.close()
        tasks = [e.life.task for e in self.entries.values() if e.life.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.loads.close()
        self.unloads.close()
