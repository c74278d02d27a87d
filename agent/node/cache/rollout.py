"""Version rollout in TF Serving's availability-preserving order: a new default version
of a model that is serving is loaded beside the old one, requests without a version are
switched to it only once it is READY, and the old one is unloaded after its requests in
flight finish. No request fails for the rollout: until the switch every request goes to
the old version; after it, to the new one. A new version that fails to load leaves the
old one serving (the next rescan tries again).

What to do is decided by ``next_action``, a pure function of the versions it sees (TF
Serving's ``AvailabilityPreservingPolicy::GetNextAction``); ``Rollouts`` carries it out,
one rollout per model at a time, started by a rescan (``ModelCache.update_specs``): a
local version directory, a source's new listing, a coordinator's pull of a new version.

The coordinator's version pins (``agent.node.cache.versionpins``) move the default
version either way (a rollout's wave, or its rollback) the same way
(``ModelCache.set_version_pins``); a version they keep is not unloaded after the switch
away from it (``release`` unloads it once no longer kept). A rollout whose target changed
while it loaded looks again once done, and unloads what no longer serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Collection, Mapping

from agent.node.cache.catalog import Catalog
from agent.node.cache.entry import Entry
from agent.node.cache.errors import CacheError
from agent.node.cache.leases import Leases
from agent.node.cache.lifecycle import State
from agent.node.cache.unloads import Unloads

log = logging.getLogger("edgeagent.rollout")


class Action(enum.Enum):
    SERVE_NEW = "serve the new version: no old one to keep available"
    LOAD_NEW = "keep the old version serving and load the new one beside it"
    SWITCH = "serve the new version, then unload the old one once idle"
    KEEP_OLD = "the new version did not load: the old one keeps serving"


def next_action(old: int | None, new: int | None, listed: Collection[int],
                states: Mapping[int, State]) -> Action:
    """What a rollout from ``old`` (the version serving before a rescan) to ``new`` (the
    default now) does next, given the versions the repository ``listed`` and each
    version's state (absent: UNLOADED)."""
    if old is None or new is None or old == new or old not in listed \
            or states.get(old) is not State.READY:
        return Action.SERVE_NEW
    new_state = states.get(new, State.UNLOADED)
    if new_state is State.READY:
        return Action.SWITCH
    if new_state is State.FAILED:
        return Action.KEEP_OLD
    return Action.LOAD_NEW


class Rollouts:
    """The rollouts under way, one task per model."""

    def __init__(self, catalog: Catalog, leases: Leases, unloads: Unloads) -> None:
        self.catalog, self.leases, self.unloads = catalog, leases, unloads
        self.tasks: dict[str, asyncio.Task] = {}
        self.releasing: set[asyncio.Task] = set()  # unloads of versions no longer kept
        self.done = 0

    def _action(self, name: str, old: int | None) -> Action:
        spec = self.catalog.specs.get(name)
        if spec is None:
            return Action.SERVE_NEW
        states = {v: e.state for (n, v), e in self.catalog.entries.items() if n == name}
        return next_action(old, self.catalog.default(spec), spec.versions, states)

    def rescanned(self, serving: dict[str, int | None]) -> None:
        """After a rescan (or new version pins), ``serving``: the version each model
        served before it. A model with a new default keeps its old version serving while
        a rollout runs."""
        for name in self.catalog.specs:
            self._look(name, serving.get(name))

    def _look(self, name: str, old: int | None) -> None:
        held = self.catalog.held
        if self._action(name, old) is Action.SERVE_NEW:
            held.pop(name, None)
        else:
            held[name] = old
            self._start(name, old, self.catalog.default(self.catalog.specs[name]))

    def _start(self, name: str, old: int, new: int) -> None:
        task = self.tasks.get(name)
        if task is not None and not task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a rescan outside the event loop: the new one serves
            self.catalog.held.pop(name, None)
            return
        self.tasks[name] = loop.create_task(self._roll_out(name, old, new))

    async def _roll_out(self, name: str, old: int, new: int) -> None:
        """Load ``new`` beside ``old`` (kept from eviction meanwhile), switch, and unload
        ``old`` once idle."""
        catalog = self.catalog
        old_entry = catalog.entries.get((name, old))
        if old_entry is None:
            return
        was_pinned = old_entry.account.pinned
        old_entry.pin(True)  # the new one's load must not evict it
        log.info("rollout %s: loading version %d beside %d", name, new, old)
        with contextlib.suppress(CacheError):
            await self.leases.ensure_loaded(name, new)
        if catalog.held.get(name) != old or self._default(name) != new:
            old_entry.pin(was_pinned)
            self._superseded(name, new)
            return
        if self._action(name, old) in (Action.LOAD_NEW, Action.KEEP_OLD):
            old_entry.pin(was_pinned)
            log.warning("rollout %s: version %d did not load, %d keeps serving: %s",
                        name, new, old, catalog.entry(name, new).life.error)
            return
        new_entry = catalog.entry(name, new)
        new_entry.pin(new_entry.account.pinned or was_pinned)
        del catalog.held[name]  # requests without a version now get ``new``
        old_entry.pin(False)
        if catalog.pins.kept(name, old):
            log.info("rollout %s: version %d serves; %d kept at hand", name, new, old)
        else:
            log.info("rollout %s: version %d serves; unloading %d once idle", name, new,
                     old)
            await self.unloads.when_idle(old_entry, keep=self._keeps)
        self.done += 1

    def _default(self, name: str) -> int | None:
        spec = self.catalog.specs.get(name)
        return self.catalog.default(spec) if spec is not None else None

    def _keeps(self, entry: Entry) -> bool:
        """``entry`` serves, is the default or is kept at hand: not to be unloaded."""
        name = entry.name
        return entry.version in (self.catalog.serving(name), self._default(name)) \
            or self.catalog.pins.kept(name, entry.version)

    def _superseded(self, name: str, new: int) -> None:
        """A rescan or new pins changed ``name``'s versions while ``new`` loaded: look
        again once this rollout's task is done, and unload ``new`` once idle unless it
        still serves."""
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: name in self.catalog.specs
                       and self._look(name, self.catalog.serving(name)))
        self.release(name, {new})

    def release(self, name: str, versions: set[int]) -> None:
        """Unload ``name``'s READY ``versions`` once idle, unless one serves, is the
        default or is kept at hand."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the event loop (no node running): nothing to do
            return
        for version in sorted(versions):
            entry = self.catalog.entries.get((name, version))
            if entry is not None and entry.state is State.READY and not self._keeps(entry):
                task = loop.create_task(
                    self.unloads.when_idle(entry, keep=self._keeps))
                self.releasing.add(task)
                task.add_done_callback(self.releasing.discard)

    async def close(self) -> None:
        tasks = [*self.tasks.values(), *self.releasing]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
