"""The coordinator's plan: per-model replicas and their placement on nodes, as the planner
makes it, the store keeps it (JSON) and ``GET /v1/plan`` shows it; and the directives a
plan implies for one node.

JSON (``Plan.to_json``; the API adds the stored plan's ``id``)::

    {"created": 1700000000.0, "kind": "long-term", "objective": "fairsum",
     "estimator": "mdc", "solver": "cobyla", "objective_value": 1.9, "rate_quantile": 0.9,
     "window_s": 420.0, "capacity": {"cpu": 8, "memory_bytes": 2147483648},
     "models": {"resnet": {"replicas": 2, "rate": 40.0, "proc_ms": 20.0, "slo_ms": 200.0,
                           "percentile": 99.0, "priority": 1.0, "cpu_per_replica": 1.0,
                           "memory_per_replica_bytes": 0.0, "predicted_latency_ms": 48.0,
                           "utility": 1.0, "drop_rate": 0.0, "placement": {"edge-1": 2},
                           "unplaced": 0, "rate_points": 42, "proc_source": "measured",
                           "source": {"source": "s3://models/resnet", "source_options": {},
                                      "version": 2, "digest": null, "config": {}}}},
     "assignment": {"edge-1": {"resnet": 2}}, "moves": {"started": 2, "stopped": 0},
     "addresses": {"edge-1": ["http://10.0.0.7:8000", "10.0.0.7:8001"]}}

``source`` (only for a model catalogued with one): where the nodes the plan assigns it
pull it from (``catalog.ModelSLO.pull``). ``addresses``: where peers reach each node the
plan runs models on (its last report's ``peer``), for the routing table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from agent.coordinator.faro import Capacity, JobSpec
from agent.wire import Directives, Pull


@dataclass(frozen=True)
class ModelPlan:
    """One model's line of a plan: its inputs (rate, processing time, SLO...) and what
    was decided (replicas, where, predicted latency, utility, share dropped)."""

    replicas: int = 0
    rate: float = 0.0
    proc_ms: float = 0.0
    slo_ms: float = 0.0
    percentile: float = 99.0
    priority: float = 1.0
    cpu_per_replica: float = 1.0
    memory_per_replica_bytes: float = 0.0
    predicted_latency_ms: float | None = None
    utility: float = 0.0
    drop_rate: float = 0.0
    placement: dict[str, int] = field(default_factory=dict)  # node -> replicas
    unplaced: int = 0
    rate_points: int | None = None  # history points the forecast saw (long-term plans)
    proc_source: str | None = None  # measured | catalog | default
    source: dict[str, Any] | None = None  # catalog.ModelSLO.pull(): where nodes pull it

    def spec(self, name: str) -> JobSpec:
        """The solver's view of this model (rate, times in seconds, needs)."""
        return JobSpec(name=name, rate=self.rate, proc_s=self.proc_ms / 1000.0,
                         slo_s=self.slo_ms / 1000.0, percentile=self.percentile,
                         priority=self.priority, cpu_per_replica=self.cpu_per_replica,
                         memory_per_replica_bytes=self.memory_per_replica_bytes)

    def to_json(self) -> dict[str, Any]:
        out = {"replicas": self.replicas, "rate": self.rate, "proc_ms": self.proc_ms,
               "slo_ms": self.slo_ms, "percentile": self.percentile,
               "priority": self.priority, "cpu_per_replica": self.cpu_per_replica,
               "memory_per_replica_bytes": self.memory_per_replica_bytes,
               "predicted_latency_ms": self.predicted_latency_ms, "utility": self.utility,
               "drop_rate": self.drop_rate, "placement": dict(self.placement),
               "unplaced": self.unplaced}
        if self.rate_points is not None:
            out["rate_points"] = self.rate_points
        if self.proc_source is not None:
            out["proc_source"] = self.proc_source
        if self.source is not None:
            out["source"] = dict(self.source)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModelPlan":
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Plan:
    """A whole plan. Fields a stored JSON plan lacks take their defaults."""

    created: float = 0.0
    kind: str = ""
    objective: str = ""
    estimator: str = ""
    solver: str = ""
    objective_value: float | None = None
    rate_quantile: float = 0.0
    window_s: float = 0.0
    capacity: Capacity = field(default_factory=lambda: Capacity(0.0, 0.0))
    models: dict[str, ModelPlan] = field(default_factory=dict)
    assignment: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> model -> n
    started: int = 0  # replicas started and stopped against the previous plan
    stopped: int = 0
    excluded: dict[str, str] = field(default_factory=dict)  # model -> why left out
    #: models with a source that an earlier plan ran and the catalog no longer holds:
    #: dropped wherever a node holds them
    retired: tuple[str, ...] = ()
    #: where the peers of each node the plan runs models on reach it, as its last
    #: report said (``NodeReport.peer``: ``[url, grpc]``): every coordinator sharing
    #: the store routes by the same table (``agent.coordinator.routing``)
    addresses: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def free_cpu(self) -> float:
        """Cores of the capacity that no planned replica takes."""
        return self.capacity.cpu - sum(m.replicas * m.cpu_per_replica
                                       for m in self.models.values())

    def to_json(self) -> dict[str, Any]:
        return {"created": self.created, "kind": self.kind, "objective": self.objective,
                "estimator": self.estimator, "solver": self.solver,
                "objective_value": self.objective_value, "rate_quantile": self.rate_quantile,
                "window_s": self.window_s,
                "capacity": {"cpu": self.capacity.cpu,
                             "memory_bytes": self.capacity.memory_bytes},
                "models": {name: m.to_json() for name, m in self.models.items()},
                "assignment": {n: dict(row) for n, row in self.assignment.items()},
                "moves": {"started": self.started, "stopped": self.stopped},
                "excluded": [{"model": m, "reason": r} for m, r in self.excluded.items()],
                "retired": list(self.retired),
                "addresses": {n: list(a) for n, a in self.addresses.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Plan":
        scalars = ("created", "kind", "objective", "estimator", "solver", "objective_value",
                   "rate_quantile", "window_s")
        capacity = data.get("capacity") or {}
        moves = data.get("moves") or {}
        return cls(**{k: data[k] for k in scalars if k in data},
                   capacity=Capacity(capacity.get("cpu", 0.0),
                                     capacity.get("memory_bytes", 0.0)),
                   models={name: ModelPlan.from_json(m)
                           for name, m in (data.get("models") or {}).items()},
                   assignment={n: dict(row)
                               for n, row in (data.get("assignment") or {}).items()},
                   started=moves.get("started", 0), stopped=moves.get("stopped", 0),
                   excluded={e["model"]: e["reason"] for e in data.get("excluded") or ()
                             if isinstance(e, dict) and "model" in e and "reason" in e},
                   retired=tuple(m for m in data.get("retired") or () if isinstance(m, str)),
                   addresses={n: tuple(a) for n, a in (data.get("addresses") or {}).items()})


def directive_rows(plan: Mapping[str, Any]) -> dict[str, bytes]:
    """Each node's row of a plan's JSON form: the JSON of ``[workers, drop_rate, pulls,
    away, address]`` (the node's replicas per model, those models' drop rates, the pulls
    of those with a source, the models with a source the plan runs elsewhere or that
    the catalog no longer holds, ``retired``, and where peers reach it), what
    answering a report needs of a plan: one bytes object per node, which the garbage
    collector does not track, instead of a dict per node (a 10,000-node plan in every
    report process)."""
    models = plan.get("models") or {}
    addresses = plan.get("addresses") or {}
    sourced = sorted({m for m, row in models.items() if row.get("source") is not None}
                     | set(plan.get("retired") or ()))
    drop = {m: r for m, row in models.items() if (r := float(row.get("drop_rate") or 0.0)) > 0}
    pull = {m: {"model": m, **row["source"], "load": True}
            for m, row in models.items() if row.get("source")}
    rows = {}
    for node, assigned in (plan.get("assignment") or {}).items():
        workers = {m: int(n) for m, n in assigned.items() if n > 0}
        drops = {m: drop[m] for m in workers if m in drop}
        pulls = [pull[m] for m in sorted(workers) if m in pull] if pull else []
        away = [m for m in sourced if m not in workers]
        rows[node] = orjson.dumps([workers, drops, pulls, away, addresses.get(node)])
    return rows


def directives_from_row(row: bytes | None, node: str, resident: set[str], ttl_s: float,
                        plan_id: int | None = None,
                        held: set[str] = frozenset()) -> Directives:  # type: ignore[assignment]
    """The directives of ``node``'s ``directive_rows`` row (None: the plan has none for
    it). ``resident``: the models the node reported resident (no need to prefetch them);
    ``held``: those it reported at all, on disk or pulling (``NodeReport.held``: a model
    with a source the plan runs elsewhere is dropped only where it is held)."""
    if row is None:
        return Directives(node=node, ttl_s=ttl_s, plan_id=plan_id)
    workers, drops, *rest = orjson.loads(row)
    pulls, away = (rest + [[], []])[:2]  # a row of an older plan has neither
    pin = tuple(sorted(workers))
    return Directives(node=node, ttl_s=ttl_s, plan_id=plan_id, workers=workers, pin=pin,
                      prefetch=tuple(m for m in pin if m not in resident), drop_rate=drops,
                      pull=tuple(Pull(**p) for p in pulls),
                      drop=tuple(m for m in away if m in held))


def row_away(row: bytes | None) -> tuple[str, ...]:
    """The models with a source that a ``directive_rows`` row's plan runs elsewhere."""
    if row is None:
        return ()
    parsed = orjson.loads(row)
    return tuple(parsed[3]) if len(parsed) > 3 else ()
