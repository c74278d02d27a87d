"""The cache's bounds, the agent's (``load_wait_max_s``, ``load_retry_s``,
``idle_unload_s``; a SIGHUP replaces them) unless a model's config sets its own."""

from __future__ import annotations

from dataclasses import dataclass

from agent.node.cache.entry import Entry


@dataclass
class CacheSettings:
    load_wait_max_s: float = 30.0
    load_retry_s: float = 30.0
    idle_unload_s: float | None = None

    def wait_bound(self, entry: Entry) -> float:
        """Seconds a load of ``entry`` may wait for room (and a pull for disk room)."""
        own = entry.spec.config.load_wait_max_s
        return self.load_wait_max_s if own is None else own

    def retry_bound(self, entry: Entry) -> float:
        """Seconds a failed load of ``entry`` is remembered."""
        own = entry.spec.config.load_retry_s
        return self.load_retry_s if own is None else own

    def idle_unload_after(self, entry: Entry) -> float | None:
        """Seconds unused after which ``entry`` is unloaded; None: never."""
        own = entry.spec.config.idle_unload_s
        return self.idle_unload_s if own is None else own
