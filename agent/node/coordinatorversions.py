"""The coordinator's rollouts on this node (its directives' ``model_versions``): the
version each model serves, the ones kept at hand and the bad ones, and the per-version
figures the report carries back (``version_stats``).

The pins are set on the cache (``ModelCache.set_version_pins``: a changed version rolls
out as a new one does, ``agent.node.cache.rollout``) and kept in
``<data_dir>/coordinator-versions.json``: unlike the other directives, pins do not
lapse, and a restart starts from them. A pinned version the source's listing lacks lists
the source again (once at a time); still missing, it is the version's ``error``.

For the models under a rollout, the report carries ``version_stats``
(``wire.VersionStat``): per version, cumulative counters read from the agent's
Prometheus registry (requests, 5xx errors, successes and their latency histogram), its
state and size, its failed loads, the last interval's latency percentiles and why it
cannot serve (its failed load, its pull's error, a listing without it). While it does,
the node sends its full report every interval, not a lease (``agent.node.lease``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any, Collection

from agent.node.cache.lifecycle import State
from agent.node.cache.versionpins import VersionPin
from agent.node.state import read_state, write_state
from agent.percentiles import percentiles_ms

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.reporter")

VERSIONS_FILE = "coordinator-versions.json"
VERSIONS_FORMAT = 1
Figures = dict[tuple[str, str], dict[str, Any]]  # (model, version label) -> counters


def sample_versions(registry: Any, models: Collection[str]) -> Figures:
    """(model, version label) -> {requests, errors (5xx), ok, buckets: {le seconds:
    cumulative}} for ``models``, from the agent's Prometheus ``registry``."""
    out: Figures = {}

    def row(labels: dict[str, str]) -> dict[str, Any] | None:
        if labels["model"] not in models or not labels.get("version"):
            return None
        return out.setdefault((labels["model"], labels["version"]), {
            "requests": 0.0, "errors": 0.0, "ok": 0.0, "buckets": {}})

    for family in registry.collect():
        if family.name == "edgeagent_requests":
            for s in family.samples:
                r = row(s.labels) if s.name.endswith("_total") else None
                if r is not None:
                    r["requests"] += s.value
                    if s.labels.get("code", "").startswith("5"):
                        r["errors"] += s.value
        elif family.name == "edgeagent_request_duration_seconds":
            for s in family.samples:
                r = row(s.labels)
                if r is None:
                    continue
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    r["buckets"][le] = r["buckets"].get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    r["ok"] += s.value
    return out


class CoordinatorVersions:
    """The version pins the coordinator set on ``node`` and its figures per version;
    ``pull_errors``: model -> its last pull's error (``Assignments.assign_errors``)."""

    def __init__(self, node: Node, pull_errors: dict[str, str]) -> None:
        self.node, self.pull_errors = node, pull_errors
        self.path = node.config.data_dir / VERSIONS_FILE
        #: (model, version label) -> the cumulative buckets at the last report
        self._buckets: dict[tuple[str, str], dict[float, float]] = {}
        self._relisting: asyncio.Task | None = None
        #: model -> why the version pinned cannot be served (its listing lacks it)
        self.errors: dict[str, str] = {}

    def tasks(self) -> list[asyncio.Task]:
        return [self._relisting] if self._relisting is not None else []

    def apply(self, model_versions: dict[str, Any]) -> None:
        """Pin each model to the version the coordinator names (``model_versions``:
        ``wire.ModelVersions``); saved for a restart."""
        cache = self.node.cache
        pins = {m: VersionPin.of(v) for m, v in model_versions.items()}
        before = cache.version_pins.pins
        if pins == before:
            return
        cache.set_version_pins(pins)
        unlisted = sorted(m for m, p in pins.items() if p.serve is not None
                          and m in cache.specs and cache.specs[m].sourced
                          and p.serve not in cache.specs[m].versions)
        if unlisted and (self._relisting is None or self._relisting.done()):
            self._relisting = asyncio.get_running_loop().create_task(self._relist(unlisted))
        changed = sorted(m for m in set(pins) | set(before) if pins.get(m) != before.get(m))
        for name in changed:
            self.errors.pop(name, None)
        log.info("coordinator pins versions of %s: %s", ", ".join(changed),
                 {m: pins[m].to_json() if m in pins else None for m in changed})
        try:
            write_state(self.path, {"format": VERSIONS_FORMAT, "versions": {
                m: p.to_json() for m, p in sorted(pins.items())}})
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)

    async def _relist(self, names: list[str]) -> None:
        """List the sources of ``names``, pinned to a version their listing lacks; a
        version still missing after it is the pin's error (``version_stats``)."""
        node = self.node
        try:
            if await node.disk.refresh(names):
                node.rescan(relist=False)
        except Exception as exc:  # noqa: BLE001 - the listing's own error is kept
            log.warning("listing %s again for the pinned versions: %s", names, exc)
        for name in names:
            spec, pin = node.cache.specs.get(name), node.cache.version_pins.get(name)
            if spec is not None and pin is not None and pin.serve is not None \
                    and pin.serve not in spec.versions:
                self.errors[name] = (
                    f"model {name!r}: its source lists no version {pin.serve} (versions: "
                    f"{', '.join(map(str, spec.versions)) or 'none'})")

    def restore(self) -> None:
        """Start from the version pins saved before a restart (they do not lapse)."""
        saved = read_state(self.path) if self.path.exists() else None
        pins = {}
        for name, doc in ((saved or {}).get("versions") or {}).items():
            try:
                pins[name] = VersionPin.from_json(doc)
            except (AttributeError, TypeError):
                log.warning("%s: ignored a malformed pin of %r", self.path, name)
        if pins:
            self.node.cache.set_version_pins(pins)

    # -- version_stats -------------------------------------------------------------------
    def report_fields(self) -> dict[str, Any]:
        """What a report carries of the rollouts: ``version_stats`` while one runs."""
        stats = self.stats()
        return {"version_stats": stats} if stats else {}

    def stats(self) -> dict[str, list[dict[str, Any]]]:
        """``version_stats`` for the models under a rollout (``wire.VersionStat``)."""
        cache = self.node.cache
        watched = {m for m, p in cache.version_pins.pins.items()
                   if p.rollout is not None and m in cache.specs}
        sampled = sample_versions(self.node.metrics.registry, watched) if watched else {}
        before, self._buckets = self._buckets, {}
        out: dict[str, list[dict[str, Any]]] = {}
        for name in sorted(watched):
            pin = cache.version_pins.pins[name]
            versions = {v for (n, v), e in cache.entries.items() if n == name
                        and (e.state is not State.UNLOADED or e.life.load_attempts)}
            versions |= {int(v) for (n, v) in sampled if n == name and v.isdigit()}
            versions |= set(pin.keep) | ({pin.serve} if pin.serve is not None else set())
            out[name] = [self._row(name, v, pin, sampled.get((name, str(v)), {}), before)
                         for v in sorted(versions)]
        return out

    def _row(self, name: str, version: int, pin: VersionPin, figures: dict[str, Any],
             before: dict[tuple[str, str], dict[float, float]]) -> dict[str, Any]:
        """One version's ``VersionStat``; its buckets kept for the next interval's
        percentiles."""
        cache = self.node.cache
        serving = cache.serving_version(name)
        entry = cache.entries.get((name, version))
        buckets = figures.get("buckets", {})
        self._buckets[(name, str(version))] = buckets
        earlier = before.get((name, str(version)), {})
        delta = sorted((le, c - earlier.get(le, 0.0)) for le, c in buckets.items())
        row: dict[str, Any] = {
            "version": version, "serving": version == serving,
            "state": entry.state.value if entry is not None else "unknown",
            "size_bytes": entry.account.size_bytes
            if entry is not None and entry.state is State.READY else 0,
            "requests": figures.get("requests", 0.0),
            "errors": figures.get("errors", 0.0), "ok": figures.get("ok", 0.0),
            "load_failures": entry.life.failed_loads if entry is not None else 0,
            "latency_buckets": [[round(le * 1000.0, 6), c] for le, c
                                in sorted(buckets.items()) if le != math.inf],
            "latency_ms": percentiles_ms(delta),
        }
        error = entry.life.error if entry is not None and entry.state is State.FAILED \
            else None
        if error is None and version == pin.serve and version != serving:
            error = self.errors.get(name) or self.pull_errors.get(name)
        if error:
            row["error"] = error[:1024]
        return row
