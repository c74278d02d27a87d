"""The coordinator's pins on this node (its directives' ``pin``): which of the planned
models to pin, the pins that are the coordinator's, and their names kept across a
restart.

A planned model is pinned while the pinned models of its device still leave room to load
the largest model the device serves (most replicas first); the rest are loaded and kept
by use: a plan may fill a node to the byte, and pins that took it all would turn every
other request into a 507. Only the models pinned here are ever unpinned here (an
operator's pin stays). Their names are kept in ``<data_dir>/coordinator-pins.json``, so
that after a restart (which restores pins from the state file, with no directives yet)
they are unpinned again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from agent.node.cache import CacheError
from agent.node.state import read_state, write_state

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.reporter")

PINS_FORMAT = 1


class CoordinatorPins:
    """The models the coordinator's directives pinned on ``node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.path = node.config.data_dir / "coordinator-pins.json"
        self.pinned: set[str] = set()  # pinned here for the coordinator
        self._estimates: dict[str, int] = {}  # model version -> bytes, never measured

    def hold(self, planned: list[str], replicas: dict[str, int]) -> None:
        """Pin those of ``planned`` that leave room (``leaving_room``) and unpin the
        coordinator's others."""
        cache = self.node.cache
        wanted = self.leaving_room(planned, replicas)
        for name in sorted(wanted):
            try:
                entry = cache.entry(name)
            except CacheError as exc:
                log.warning("coordinator asks to pin %s: %s", name, exc)
                continue
            if not entry.account.pinned:
                cache.set_pinned(name, True)
                self.pinned.add(name)
        for name in sorted(self.pinned - wanted):
            self.unpin(name)

    def release(self) -> None:
        """Unpin every model pinned for the coordinator (its directives lapsed)."""
        for name in sorted(self.pinned):
            self.unpin(name)

    def leaving_room(self, planned: list[str], replicas: dict[str, int]) -> set[str]:
        """The planned models to pin: those the plan runs most replicas of first, each
        as long as the pinned models of its device (the operator's included) still
        leave room to load the largest model the device serves."""
        cache = self.node.cache
        pools: dict[str, list[Any]] = {}  # device -> entries
        for entry in cache.entries.values():
            pools.setdefault(entry.device, []).append(entry)
        sizes = {e.key: self.size_of(e) for es in pools.values() for e in es}
        pinned = {d: sum(sizes[e.key] for e in es if e.account.pinned
                         and e.name not in self.pinned) for d, es in pools.items()}
        reserve = {d: max((sizes[e.key] for e in es), default=0) for d, es in pools.items()}
        out = set()
        for name in sorted(planned, key=lambda m: (-replicas.get(m, 0), m)):
            try:
                entry = cache.entry(name)
            except CacheError:
                continue
            pool = cache.pool_of(entry)
            if pool is None:
                continue
            size = sizes.get(entry.key) or self.size_of(entry)
            device = entry.device
            if pinned.get(device, 0) + size + reserve.get(device, 0) <= pool.memory.capacity:
                pinned[device] = pinned.get(device, 0) + size
                out.add(name)
        return out

    def size_of(self, entry: Any) -> int:
        """What ``entry`` holds or would hold in memory: its measured size, else its
        backend's estimate (a model never loaded here: what the cache would reserve;
        made once per version, it may read the model's file)."""
        known = entry.account.measured_bytes or entry.account.size_bytes
        if known:
            return int(known)
        if entry.key not in self._estimates:
            cache = self.node.cache
            try:
                self._estimates[entry.key] = int(cache.backend_factory(
                    entry.spec.backend or "onnx", entry.name, entry.version,
                    entry.spec.version_root, entry.spec.config, cache.footprints).estimate())
            except Exception:  # noqa: BLE001 - its files unreadable now: its load will say
                return 0
        return self._estimates[entry.key]

    def unpin(self, name: str) -> None:
        self.pinned.discard(name)
        with contextlib.suppress(CacheError):
            if self.node.cache.entry(name).account.pinned:
                self.node.cache.set_pinned(name, False)

    def save(self) -> None:
        """Keep the names pinned for the coordinator (when they changed)."""
        try:
            saved = read_state(self.path) if self.path.exists() else None
            if saved is None and not self.pinned:
                return
            if saved and sorted(saved.get("pins", [])) == sorted(self.pinned):
                return
            write_state(self.path, {"format": PINS_FORMAT, "pins": sorted(self.pinned)})
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)

    def revert_saved(self) -> None:
        """Unpin what was pinned for the coordinator before a restart (no directives
        cover it now)."""
        saved = read_state(self.path) if self.path.exists() else None
        for name in (saved or {}).get("pins", []):
            if isinstance(name, str):
                self.unpin(name)
        if saved:
            self.save()
            self.node.schedule_persist()
