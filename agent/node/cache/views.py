"""What the cache shows: the ``/v1/cache`` object of an entry and each pool's figures
(``/v1/cache``, ``/metrics``, the dashboard, ``edgeagent cache ls``)."""

from __future__ import annotations

from typing import Any

from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import State
from agent.node.cache.tiers import Tiers


def describe(tiers: Tiers, entry: Entry, now: float) -> dict[str, Any]:
    """The ``/v1/cache`` object for one entry."""
    pool = tiers.pool_of(entry)
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
        **_describe_disk(tiers, entry),
    }


def _describe_disk(tiers: Tiers, entry: Entry) -> dict[str, Any]:
    """The LOADING phase, and a sourced model's disk tier fields: its source (display
    URL only), files on disk, download progress and seconds."""
    disk, phase = tiers.disk, entry.life.phase
    shown = {"phase": phase.value if phase is not None else None}
    if not entry.spec.sourced or disk is None:
        return shown
    ref = disk.sources.get(entry.name)
    return {**shown, "source": ref.display_url if ref is not None else None,
            "listing_error": disk.listing_error(entry.name),
            "on_disk": disk.has(entry.id),
            "disk_bytes": disk.held.get(entry.id, 0),
            "download_seconds": round(disk.download_seconds(entry.id), 6),
            "download": disk.progress(entry.id)}


def memory(tiers: Tiers) -> dict[str, dict[str, Any]]:
    """Each pool's bytes, waiting loads and waits."""
    return {p.name: {"used_bytes": p.used, "reserved_bytes": p.reserved,
                     "budget_bytes": p.budget, "overhead_bytes": p.memory.overhead,
                     "waiting_loads": len(p.rooms), "room_waits": p.waits,
                     "room_wait_seconds": round(p.wait_seconds, 6)}
            for p in tiers.pools.values()}
