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
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Collection, Mapping

from agent.node.cache.catalog import Catalog
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
        self.done = 0

    def _action(self, name: str, old: int | None) -> Action:
        spec = self.catalog.specs.get(name)
        if spec is None:
            return Action.SERVE_NEW
        states = {v: e.state for (n, v), e in self.catalog.entries.items() if n == name}
        return next_action(old, spec.default_version, spec.versions, states)

    def rescanned(self, serving: dict[str, int | None]) -> None:
        """After a rescan, ``serving``: the version each model served before it. A model
        with a new default keeps its old version serving while a rollout runs."""
        held = self.catalog.held
        for name, spec in self.catalog.specs.items():
            old = serving.get(name)
            if self._action(name, old) is Action.SERVE_NEW:
                held.pop(name, None)
            else:
                held[name] = old
                self._start(name, old, spec.default_version)

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
        if catalog.held.get(name) != old:
            old_entry.pin(was_pinned)
            return  # superseded (a rescan changed the versions meanwhile)
        if self._action(name, old) in (Action.LOAD_NEW, Action.KEEP_OLD):
            old_entry.pin(was_pinned)
            log.warning("rollout %s: version %d did not load, %d keeps serving: %s",
                        name, new, old, catalog.entry(name, new).life.error)
            return
        new_entry = catalog.entry(name, new)
        new_entry.pin(new_entry.account.pinned or was_pinned)
        del catalog.held[name]  # requests without a version now get ``new``
        old_entry.pin(False)
        log.info("rollout %s: version %d serves; unloading %d once idle", name, new, old)
        await self.unloads.when_idle(old_entry,
                                     keep=lambda e: catalog.serving(name) == e.version)
        self.done += 1

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(BaseException):
                await task
