"""Which version of each catalogued model every node serves: the catalog's version,
except where a rollout under way says otherwise for a node, never a version marked bad.
Every answer to a report carries the node's part (``wire.ModelVersions`` for each model
it is told to pull or reported holding, whether the plan assigned it or the node's own
repository has it; and each pull's version and digest); report workers get the table
as they get the plan.

The table is also what the routing table weighs a model's traffic by during a wave
whose rollout sets a ``traffic_share`` (``splits``: ``agent.coordinator.routing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from msgspec import structs

from agent.wire import Directives, ModelVersions


@dataclass(frozen=True)
class ModelEntry:
    """One model: the version (and digest) nodes serve by default (None: the newest
    their source lists), per-node versions and versions kept (a rollout's), the
    versions marked bad and the rollout under way."""

    default: tuple[int | None, str | None] = (None, None)
    nodes: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    keep: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bad: tuple[int, ...] = ()
    rollout: int | None = None
    #: the rollout's nodes and the share of the routed requests those on the new
    #: version carry (None: no share set)
    fleet: tuple[str, ...] = ()
    share: float | None = None

    def version_for(self, node: str) -> tuple[int | None, str | None]:
        return self.nodes.get(node, self.default)


@dataclass(frozen=True)
class VersionTable:
    """Model -> ``ModelEntry``; ``id`` changes whenever the table does (an answer made
    under another id is made again)."""

    id: int = 0
    models: dict[str, ModelEntry] = field(default_factory=dict)

    def pinned(self, held: Iterable[str]) -> frozenset[str]:
        """The models of ``held`` that the table pins."""
        return frozenset(m for m in held if m in self.models)

    def overlay(self, directives: Directives, held: Iterable[str] = ()) -> Directives:
        """``directives`` with each pull's version and digest the node's, and its
        ``model_versions``: for the models it is told to pull and those it reported
        holding (``held``: served from its own repository, on disk or being pulled)."""
        if not self.models:
            return directives
        node, pulls, versions = directives.node, [], {}
        for pull in directives.pull:
            entry = self.models.get(pull.model)
            if entry is not None:
                version, digest = entry.version_for(node)
                if version is not None:
                    pull = structs.replace(pull, version=version, digest=digest)
            pulls.append(pull)
        for model in sorted({p.model for p in pulls} | set(held)):
            entry = self.models.get(model)
            if entry is not None:
                versions[model] = ModelVersions(
                    serve=entry.version_for(node)[0], keep=entry.keep.get(node, ()),
                    bad=entry.bad, rollout=entry.rollout)
        if not versions:
            return directives
        return structs.replace(directives, pull=tuple(pulls), model_versions=versions)

    def splits(self) -> dict[str, tuple[frozenset[str], frozenset[str], float]]:
        """Model -> (its rollout's nodes, those of them on the new version, the share of
        the routed requests they carry), for the rollouts that set a ``traffic_share``."""
        return {m: (frozenset(e.fleet), frozenset(e.nodes), e.share)
                for m, e in self.models.items() if e.share is not None and e.nodes}

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "models": {m: {
            "default": {"version": e.default[0], "digest": e.default[1]},
            "nodes": {n: {"version": v, "digest": d} for n, (v, d) in e.nodes.items()},
            "keep": {n: list(k) for n, k in e.keep.items()}, "bad": list(e.bad),
            "rollout": e.rollout} for m, e in sorted(self.models.items())}}


def build_table(table_id: int, catalog: Iterable[Any], rollouts: Iterable[Any],
                bad: Iterable[dict[str, Any]]) -> VersionTable:
    """The table of the catalog (``ModelSLO``s: those with a source), the rollouts
    (``rollout.Rollout``; under way ones set per-node versions) and the bad versions
    (``Store.bad_versions`` rows)."""
    marked: dict[str, set[int]] = {}
    for row in bad:
        marked.setdefault(row["model"], set()).add(int(row["version"]))
    under_way = {r.model: r for r in rollouts if r.active}
    models = {}
    for slo in catalog:
        if slo.source is None:
            continue
        r = under_way.get(slo.name)
        if slo.version is None and r is None and slo.name not in marked:
            continue  # nothing to pin: the newest the source lists, as ever
        entry = ModelEntry(default=(slo.version, slo.digest),
                           bad=tuple(sorted(marked.get(slo.name, ()))))
        if r is not None:
            nodes = {n for wave in r.waves for n in wave}
            entry = ModelEntry(default=(r.from_version, r.from_digest),
                               nodes={n: r.version_for(n) for n in sorted(nodes)
                                      if r.version_for(n) != (r.from_version, r.from_digest)},
                               keep={n: r.keep_for(n) for n in sorted(nodes)
                                     if r.keep_for(n)},
                               bad=entry.bad, rollout=r.id, fleet=tuple(sorted(nodes)),
                               share=r.settings.traffic_share)
        models[slo.name] = entry
    return VersionTable(table_id, models)
