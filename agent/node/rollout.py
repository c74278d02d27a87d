"""Version rollout in TF Serving's availability-preserving order: a new default version
of a model that is serving is loaded beside the old one, requests without a version are
switched to it only once it is READY, and the old one is unloaded after its requests in
flight finish. No request fails for the rollout: until the switch every request goes to
the old version; after it, to the new one.

The cache holds the old version as the serving one (``ModelCache.serving_version``) and
calls ``on_new_version`` when a rescan brings a newer default (a local version directory,
a source's new listing, a coordinator's pull of a new version); ``Rollouts`` runs one
rollout per model at a time. A new version that fails to load leaves the old one serving
(the next rescan tries again).

The coordinator's version pins (``agent.node.versionpins``) move the default version
either way (a rollout's wave, or its rollback) through the same hook; a version they
keep is not unloaded after the switch away from it (``release`` unloads it once no
longer kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from agent.node.cache import CacheError, ModelCache
from agent.node.lifecycle import State

log = logging.getLogger("edgeagent.rollout")

#: Seconds between looks at the old version's requests in flight before unloading it.
DRAIN_POLL_S = 0.05


class Rollouts:
    """The rollouts under way, one task per model; started by the cache's
    ``on_new_version`` hook."""

    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache
        self.tasks: dict[str, asyncio.Task] = {}
        self.done = 0
        cache.on_new_version.append(self.start)

    def start(self, name: str, old: int, new: int) -> None:
        task = self.tasks.get(name)
        if task is not None and not task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a rescan outside the event loop: no rollout, the new one serves
            self.cache.serving_version.pop(name, None)
            return
        self.tasks[name] = loop.create_task(self.roll_out(name, old, new))

    async def roll_out(self, name: str, old: int, new: int) -> None:
        """Load ``new`` beside ``old`` (kept from eviction meanwhile), switch, drain
        and unload ``old``."""
        cache = self.cache
        old_entry = cache.entries.get((name, old))
        if old_entry is None:
            return
        was_pinned = old_entry.account.pinned
        old_entry.account.pinned = True  # the new one's load must not evict it
        log.info("rollout %s: loading version %d beside %d", name, new, old)
        try:
            new_entry = await cache.ensure_loaded(name, new)
        except CacheError as exc:
            old_entry.account.pinned = was_pinned
            log.warning("rollout %s: version %d did not load, %d keeps serving: %s",
                        name, new, old, exc)
            return
        if cache.serving_version.get(name) != old \
                or cache.default_version(new_entry.spec) != new:
            old_entry.account.pinned = was_pinned
            # superseded (a rescan or a pin changed the versions meanwhile): look again
            # once this task is done, and let go of what no longer serves
            loop = asyncio.get_running_loop()
            loop.call_soon(cache.set_version_pins, cache.version_pins.pins)
            if cache.default_version(new_entry.spec) != new:
                loop.create_task(self.drain_and_unload(new_entry))
            return
        new_entry.account.pinned = new_entry.account.pinned or was_pinned
        del cache.serving_version[name]  # requests without a version now get ``new``
        old_entry.account.pinned = False
        self.done += 1
        if cache.version_pins.kept(name, old):
            log.info("rollout %s: version %d serves; %d kept at hand", name, new, old)
            return
        log.info("rollout %s: version %d serves; unloading %d once idle", name, new, old)
        await self.drain_and_unload(old_entry)

    def release(self, name: str, versions: set[int]) -> None:
        """Unload ``name``'s ``versions`` (no longer kept by a pin) once idle, unless one
        serves or is on its way to."""
        cache = self.cache
        spec = cache.specs.get(name)
        if spec is None:
            return
        serving = {cache.serving_version.get(name), cache.default_version(spec)}
        for version in sorted(versions - serving):
            entry = cache.entries.get((name, version))
            if entry is not None and entry.state is State.READY:
                asyncio.get_running_loop().create_task(self.drain_and_unload(entry))

    async def drain_and_unload(self, entry) -> None:
        """Unload ``entry`` once its requests in flight are done (unless something took
        it back meanwhile: pinned again, or serving again)."""
        cache = self.cache
        while entry.state is State.READY and not entry.account.pinned \
                and cache.serving_version.get(entry.name) != entry.version \
                and cache.default_version(entry.spec) != entry.version \
                and not cache.version_pins.kept(entry.name, entry.version):
            if entry.account.in_flight == 0:
                with contextlib.suppress(CacheError):
                    await cache.evict(entry.name, entry.version)
                return
            await asyncio.sleep(DRAIN_POLL_S)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(BaseException):
                await task
