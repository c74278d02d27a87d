"""What the cache knows of one version of one model, in three parts: its lifecycle
(``agent.node.cache.lifecycle``), its accounting (the bytes it holds and what a miss costs,
its pin and references) and its statistics (counters for people and metrics).

Only the cache package writes an entry's fields (``tests/test_cache_package.py``); what
decides whether the entry may be evicted (its state, pin and leases) changes only through
the entry's own verbs and the lifecycle's named moves, which tell its ``EntryWatcher``
(the tiers: their room queues, ``changed``)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.backends.base import Backend, TensorSpec
from agent.node.cache.lifecycle import Lifecycle, State
from agent.node.repository import ModelSpec

MEASUREMENTS_KEPT = 3  # a model's recent clean size measurements that price its next load


@dataclass
class Accounting:
    """What the model holds and costs, as the pool and the policy see it: its size, the
    measurements that price its next load, the seconds a miss costs, its pin and the
    references that keep it from being unloaded."""

    size_bytes: int = 0
    size_estimated: bool = True
    #: The last ``MEASUREMENTS_KEPT`` clean measurements of its size (survive unloads).
    measurements: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=MEASUREMENTS_KEPT))
    load_seconds: float = 0.0
    first_run_seconds: float = 0.0
    #: A warm run's seconds, as the serving layer measured it (None: not yet): the
    #: first run's surplus over it is part of the penalty (``miss_penalty``).
    warm_run_seconds: float | None = None
    pinned: bool = False
    in_flight: int = 0                 # requests holding a reference (never unloaded)
    idle_since: float | None = None    # cache clock when its last request ended

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


@dataclass
class Statistics:
    """Counters of what happened to the model (``/v1/cache``, metrics, warm restart)."""

    loads: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    room_waits: int = 0          # loads of this model that waited (slot or room)
    room_wait_seconds: float = 0.0
    slot_seconds: float = 0.0    # its loads' time from slot and room to ready, in all
    last_used: float | None = None  # wall clock when its last request ended


class EntryWatcher(Protocol):
    """Who is told when an entry's state, pin or leases changed (what may be evicted,
    and what memory does with its files, may have changed)."""

    def moved(self, entry: Entry) -> None: ...


class _Unwatched:
    def moved(self, entry: Entry) -> None:
        pass


@dataclass
class Entry:
    """One version of one model: its spec, the loaded backend and what it says about
    itself, and the three parts above. ``state`` is read-only: only
    ``lifecycle.transition`` moves it."""

    spec: ModelSpec
    version: int
    watcher: EntryWatcher = field(default=_Unwatched(), repr=False, compare=False)
    life: Lifecycle = field(init=False)
    account: Accounting = field(init=False)
    stats: Statistics = field(default_factory=Statistics)
    backend: Backend | None = None
    metadata: dict[str, Any] | None = None  # inputs/outputs, kept after unload
    signature: list[TensorSpec] | None = None  # input specs, kept after unload

    def __post_init__(self) -> None:
        self.life = Lifecycle(self.key, on_move=lambda: self.watcher.moved(self))
        self.account = Accounting(pinned=self.spec.config.pin)

    # -- leases and pins -----------------------------------------------------------------
    def lease(self) -> None:
        """A request holds it (never unloaded under it)."""
        self.account.in_flight += 1

    def unlease(self, now: float, wall_clock: float | None = None) -> bool:
        """A request let go (``wall_clock``: it was served then); True when none is
        left, the watcher told."""
        account = self.account
        account.in_flight -= 1
        if wall_clock is not None:
            self.stats.last_used = wall_clock
        if account.in_flight:
            return False
        account.idle_since = now
        self.watcher.moved(self)
        return True

    def pin(self, pinned: bool) -> None:
        """Pin (never a victim) or unpin it."""
        self.account.pinned = pinned
        self.watcher.moved(self)

    @property
    def state(self) -> State:
        return self.life.state

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
