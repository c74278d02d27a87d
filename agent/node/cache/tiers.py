"""The two tiers of the cache and what each tells the other: the memory tier's pools (one
per device) and the disk tier of sourced models' files (remote -> disk -> memory).

``Tiers`` is every entry's watcher (``agent.node.cache.entry.EntryWatcher``): when an
entry's state, pin or leases change, its pool's room queue, its ``when_idle`` waiters and
the disk tier's room queue look again. It is also the memory view the disk tier gets at
construction (``agent.node.cache.disktier.MemoryView``): what memory does with a
version's files and how long a pull may wait; and it hears when files come or go, which
changes a resident model's penalty: a miss costs ``cachepolicies.pool.miss_penalty`` of
its load, its cold first run's surplus over a warm run, and its download while its files
are off disk.
"""

from __future__ import annotations

import logging
from typing import Callable

from cachepolicies.pool import miss_penalty

from agent.memory import MemoryMeter
from agent.node.cache.disktier import DiskTier, MemoryView
from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import State
from agent.node.cache.pools import DevicePool
from agent.node.cache.settings import CacheSettings
from agent.node.cache.unloads import Unloads
from agent.node.cache.versionpins import VersionPins

log = logging.getLogger("edgeagent.cache")

Key = tuple[str, int]
#: Makes the disk tier, given its view of memory and the memory tier's meter.
DiskFactory = Callable[..., DiskTier]


class Tiers:
    """The pools by device and the disk tier (None: no sourced models here)."""

    def __init__(self, entries: dict[Key, Entry], pools: dict[str, DevicePool],
                 unloads: Unloads, settings: CacheSettings, clock: Callable[[], float],
                 meter: MemoryMeter, disk: DiskFactory | None, pins: VersionPins) -> None:
        self.entries, self.pools, self.unloads, self.pins = entries, pools, unloads, pins
        self.settings, self.clock = settings, clock
        view: MemoryView = self
        self.disk = disk(memory=view, meter=meter) if disk is not None else None

    def pool_of(self, entry: Entry) -> DevicePool | None:
        return self.pools.get(entry.device)

    # -- EntryWatcher ------------------------------------------------------------------
    def moved(self, entry: Entry) -> None:
        pool = self.pools.get(entry.device)
        if pool is not None:
            pool.changed()
        self.unloads.moved(entry)
        if self.disk is not None and entry.spec.sourced:
            self.disk.usage_changed()

    def record_access(self, entry: Entry) -> None:
        """A request for ``entry``: its policies' request rates, memory's and disk's."""
        pool = self.pools.get(entry.device)
        if pool is not None:
            pool.policy.record_access(entry.id, self.clock())
        if self.disk is not None and entry.spec.sourced:
            self.disk.record_access(entry.id)

    # -- MemoryView (what the disk tier asks) ------------------------------------------
    def usage(self, key: Key) -> str:
        """Pinned (or kept at hand by a rollout: ``VersionPins.kept``), reading (loading,
        or a TF Serving model, whose server reads its directory), resident (in memory,
        files not needed), or idle."""
        if self.pins.kept(*key):
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

    def wait_bound(self, key: Key) -> float:
        entry = self.entries.get(key)
        return (self.settings.load_wait_max_s if entry is None
                else self.settings.wait_bound(entry))

    def files_changed(self, key: Key, on_disk: bool) -> None:
        """A resident model's penalty changes with its files (the download counts while
        they are off disk)."""
        entry = self.entries.get(key)
        if entry is not None:
            self._reprice(entry, "files back on disk" if on_disk else "files evicted")

    # -- penalties ---------------------------------------------------------------------
    def measured_runs(self, entry: Entry, warm: float | None, first: float | None) -> None:
        """The serving layer measured a warm run, or the cold first run of a model whose
        warm-up failed: a resident model is priced again with it."""
        account = entry.account
        if first is not None:
            account.first_run_seconds = first
        if warm is not None and warm != account.warm_run_seconds:
            account.warm_run_seconds = warm
            self._reprice(entry, "a warm run measured")

    def _reprice(self, entry: Entry, why: str) -> None:
        """A resident model's policy entry at its penalty now."""
        pool, key = self.pool_of(entry), entry.id
        if pool is None or key not in pool.memory:
            return
        penalty = self.penalty(entry)
        pool.policy.remove(key)
        pool.policy.admit(key, pool.memory.sizes[key], penalty, self.clock())
        log.info("%s: %s; miss penalty now %.3fs", entry.key, why, penalty)

    def penalty(self, entry: Entry, first_run: float | None = None) -> float:
        """Seconds a miss of ``entry`` costs (``miss_penalty``): load + the cold first
        run's surplus over a warm run (where both are measured) + its download while
        its files are not on disk."""
        account = entry.account
        return float(miss_penalty(
            account.load_seconds,
            account.first_run_seconds if first_run is None else first_run,
            account.warm_run_seconds, self.download_seconds(entry)))

    def download_seconds(self, entry: Entry) -> float:
        """Seconds ``entry``'s files take to pull before it can load: its last measured
        download while they are not on disk, else 0."""
        disk = self.disk
        if entry.spec.sourced and disk is not None and not disk.has(entry.id):
            return disk.download_seconds(entry.id)
        return 0.0
