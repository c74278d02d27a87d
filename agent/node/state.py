"""Warm-restart state: the resident set, pins and learned footprint factors, written
atomically (temp file, fsync, rename) so a crash leaves the old or the new file, never
half of one. On start the agent reloads the resident set, most popular first."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from agent.memory import write_atomic

from agent.node.cache import ModelCache
from agent.node.cache.lifecycle import State

log = logging.getLogger("edgeagent.state")
FORMAT = 1


def snapshot(cache: ModelCache) -> dict[str, Any]:
    now = cache.clock()
    resident = []
    for entry in cache.entries.values():
        if entry.state in (State.READY, State.LOADING):
            pool = cache.pool_of(entry)
            rate = pool.policy.request_rate(entry.id, now) if pool else None
            resident.append({"name": entry.name, "version": entry.version,
                             "rate": rate or 0.0,
                             "hits": entry.stats.hits + entry.stats.misses})
    pins = {e.name: e.account.pinned for e in cache.entries.values()
            if e.account.pinned != e.spec.config.pin}
    return {"format": FORMAT, "resident": resident, "pins": pins,
            "footprint_factors": cache.footprints.to_json()}


def write_state(path: Path, doc: dict[str, Any], *,
                open_file: Callable[..., Any] = open) -> None:
    """Write the state atomically (``agent.memory.write_atomic``): on a failure (a full
    disk) no temporary file is left and the old state file stays; the error is raised."""
    write_atomic(path, json.dumps(doc, indent=1), open_file=open_file)


def read_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when absent or unreadable (logged, never fatal)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable state file %s: %s", path, exc)
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        log.warning("ignoring state file %s: unknown format", path)
        return None
    return doc


def restore_order(doc: dict[str, Any]) -> list[tuple[str, int]]:
    """(name, version) of the saved resident set, most popular first."""
    items = [r for r in doc.get("resident", []) if isinstance(r, dict)
             and isinstance(r.get("name"), str) and isinstance(r.get("version"), int)]
    items.sort(key=lambda r: (-(r.get("rate") or 0.0), -(r.get("hits") or 0), r["name"]))
    return [(r["name"], r["version"]) for r in items]
