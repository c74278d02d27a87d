"""Sizing and provisioning of the live fleet, from what the coordinator knows.

* :func:`size_fleet`: ``POST /v1/sizing``: the Ribbon search
  (``ribbon.search``) over a :class:`~agent.coordinator.ribbon.fleet.FleetEvaluator`
  built from the planner's models (catalog, forecast rate, SLO), the live reports
  (per kind of node: cores, memory, measured processing time per model) and the
  instance catalogue (``node_types``: the coordinator config's, or the request's over
  it). The answer is ``plan size --json``'s object plus ``types`` (the order of
  ``best``) and ``models`` (the rates and processing times sized for).
* :func:`provision_fleet`: ``GET /v1/provisioning``: MArk's provisioner
  (``provisioning.Provisioner``) over the planner's forecast of the total request rate
  in one-minute steps (MArk's unit; the largest forecast rate within each),
  the catalogue's kinds as instance types (capacity: cores over the rate-weighted
  processing time measured on that kind, or its ``capacity_rps``) and the live nodes
  per kind as the running instances.

Bad requests raise :class:`SizingRequestError` (400) naming the field; no live node or
no catalogued model is the planner's ``PlanError`` (409).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.coordinator.choices import SIZE_MAX_SAMPLES, SIZE_METHODS
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.faro import JobSpec
from agent.coordinator.nodetypes import NodeType, parse_node_types
from agent.coordinator.planner import Planner, PlanError
from agent.coordinator.provisioning import InstanceType, Provisioner, ProvisioningError
from agent.coordinator.ribbon.fleet import FleetEvaluator, PoolType
from agent.coordinator.ribbon.search import search
from agent.coordinator.ribbon.space import DEFAULT_TARGET_PERCENT
from agent.errors import AgentError
from agent.validation import (SchemaError, boolean, check, choice, json_object, number,
                              only)
from agent.wire import NodeReport

MAX_SAMPLES = 10_000
MAX_POOLS = 200_000       # candidate pools (the product of max_count + 1, less one)
PROVISION_STEP_S = 60.0   # MArk's scheduling unit (1 minute)
MAX_INSTANCES = 1000      # provisioning adds one instance at a time: bound the work
REQUEST_FIELDS = ("from_reports", "node_types", "seed", "max_samples", "method",
                  "qos_target_percent")


class SizingRequestError(AgentError, ValueError):
    """A sizing request that cannot be answered as asked (bad field, unknown price)."""

    status = 400


@dataclass(frozen=True)
class SizingRequest:
    node_types: dict[str, NodeType] | None    # None: the kinds the live nodes report
    seed: int = 0
    max_samples: int | None = None
    method: str = "bo"
    qos_target_percent: float = DEFAULT_TARGET_PERCENT


def parse_sizing_request(body: Any, config: CoordinatorConfig) -> SizingRequest:
    """The ``POST /v1/sizing`` body: ``{"from_reports": true}`` or ``{"node_types":
    {...}}`` (entries over the config's), optional ``seed``, ``max_samples``,
    ``method``, ``qos_target_percent``."""
    try:
        d = check(json_object, body, "body")
        only(d, REQUEST_FIELDS, noun="field")
        from_reports = check(boolean, d.get("from_reports", False), "from_reports")
        if from_reports == ("node_types" in d):
            raise SchemaError(None, "give either \"from_reports\": true (the kinds the "
                              "live nodes report, priced by the coordinator's node_types) "
                              "or node_types: {name: {price_per_hour, max_count, ...}}")
        types = None if from_reports else parse_node_types(d["node_types"], "node_types",
                                                           base=config.node_types)
        if types is not None and not types:
            raise SchemaError("node_types", "must name at least one kind of node")
        seed = check(number(0, 2**32 - 1, integer=True), d.get("seed", 0), "seed")
        samples = d.get("max_samples")
        if samples is not None:
            samples = check(number(1, MAX_SAMPLES, integer=True), samples, "max_samples")
        method = check(choice(*SIZE_METHODS), d.get("method", "bo"), "method")
        target = check(number(0, 100, strict_lo=True, finite=True),
                       d.get("qos_target_percent", DEFAULT_TARGET_PERCENT),
                       "qos_target_percent")
    except SchemaError as exc:
        raise SizingRequestError(str(exc)) from None
    return SizingRequest(types, int(seed), samples, method, float(target))


def _by_kind(live: dict[str, NodeReport]) -> dict[str, list[NodeReport]]:
    out: dict[str, list[NodeReport]] = {}
    for name in sorted(live):
        if live[name].node_type:
            out.setdefault(live[name].node_type, []).append(live[name])
    return out


def _catalogue(request_types: dict[str, NodeType] | None, config: CoordinatorConfig,
               live: dict[str, NodeReport]) -> dict[str, NodeType]:
    if request_types is not None:
        return request_types
    kinds = {r.node_type for r in live.values() if r.node_type}
    if not kinds:
        raise SizingRequestError("from_reports: no live node states its node_type "
                                 "(coordinator.node_type in the agent config)")
    unpriced = sorted(k for k in kinds if k not in config.node_types)
    if unpriced:
        raise SizingRequestError(
            f"from_reports: node type(s) {', '.join(map(repr, unpriced))} (reported by "
            f"{', '.join(sorted(n for n, r in live.items() if r.node_type in unpriced))}) "
            "have no price: add them to node_types in the coordinator config")
    return {k: config.node_types[k] for k in sorted(kinds)}


def _shape(t: NodeType, reports: list[NodeReport], where: str) -> tuple[float, float]:
    """(cores, cpu memory bytes) of one node of kind ``t``: given, else the mean of
    its live nodes' reports."""
    cores, memory = t.cores, t.cpu_memory_bytes
    if reports:
        if cores is None:
            cores = sum(r.capacity.cores for r in reports) / len(reports)
        if memory is None:
            memory = sum(r.capacity.cpu_memory_bytes for r in reports) / len(reports)
    if cores is None or memory is None:
        missing = "cores" if cores is None else "cpu_memory_bytes"
        raise SizingRequestError(f"{where}.{t.name}.{missing}: no live node of this kind "
                                 "reports it; give it")
    return float(cores), float(memory)


def _proc_s(planner: Planner, spec: JobSpec, t: NodeType,
            reports: list[NodeReport]) -> float:
    """Processing seconds per request of ``spec`` on kind ``t``: given, measured on its
    nodes, else the fleet's (the planner's)."""
    if spec.name in t.proc_ms:
        return t.proc_ms[spec.name] / 1000.0
    slo = planner.store.model(spec.name)
    if slo is not None and reports:
        ms, source = Planner.processing_ms(slo, reports)
        if source == "measured":
            return ms / 1000.0
    return spec.proc_s


def fleet_evaluator(planner: Planner, config: CoordinatorConfig, now: float,
                    request: SizingRequest) -> FleetEvaluator:
    """The live-fleet evaluator for ``request``, from the planner's view at ``now``."""
    problem, _, live = planner.build(now)
    kinds = _by_kind(live)
    catalogue = _catalogue(request.node_types, config, live)
    where = "node_types" if request.node_types is not None else "config node_types"
    types = []
    for name, t in catalogue.items():
        cores, memory = _shape(t, kinds.get(name, []), where)
        types.append(PoolType(name, t.price_per_hour, t.max_count, cores, memory,
                              {m.name: _proc_s(planner, m, t, kinds.get(name, []))
                               for m in problem.models}))
    try:
        return FleetEvaluator(types, list(problem.models),
                              target_percent=request.qos_target_percent,
                              objective=config.objective, estimator=config.estimator)
    except ValueError as exc:  # every max_count 0
        raise SizingRequestError(f"{where}: {exc}") from None


def size_fleet(planner: Planner, config: CoordinatorConfig, now: float,
               request: SizingRequest) -> dict[str, Any]:
    """Run the search; ``plan size --json``'s object plus ``types`` and ``models``."""
    evaluator = fleet_evaluator(planner, config, now, request)
    if evaluator.space.size > MAX_POOLS:
        where = "node_types" if request.node_types is not None else "config node_types"
        raise SizingRequestError(f"{where}: max_count allows {evaluator.space.size} pools; "
                                 f"at most {MAX_POOLS} can be searched")
    limit = request.max_samples or (min(evaluator.space.size, MAX_SAMPLES)
                                    if request.method == "exhaustive" else SIZE_MAX_SAMPLES)
    result = search(evaluator, request.method, seed=request.seed, max_samples=limit)
    out = result.to_json()
    best = result.best
    out["types"] = list(evaluator.space.types)
    out["qos_target_percent"] = evaluator.space.target_percent
    out["method"] = request.method
    out["models"] = {m.name: {"rate": m.rate, "slo_ms": m.slo_s * 1000.0,
                              "proc_ms": {t.name: t.proc_s[m.name] * 1000.0
                                          for t in evaluator.types}}
                     for m in evaluator.models}
    out["replicas"] = None if best is None else evaluator.score(best.counts).replicas
    return out


# -- provisioning ------------------------------------------------------------------------


def forecast_total(planner: Planner, models: tuple[JobSpec, ...], now: float,
                   step_s: float) -> list[float]:
    """The fleet's request rate per ``step_s`` over the planning window: the sum over
    models of the ``rate_quantile`` quantile of their forecast per ``rate_step_s``, and
    per provisioning step the largest of its forecast steps (MArk's F_t is the
    maximum rate predicted within step t)."""
    q = planner.config.rate_quantile
    total: list[float] = []
    for m in models:
        predicted, _ = planner.rate_forecast(m.name, now)
        if predicted is None:
            continue
        steps = [float(x) for x in predicted.quantiles((q,))[q]]
        total = [a + b for a, b in zip(total, steps)] if total else steps
    if not total:
        return [0.0]
    group = max(1, round(step_s / planner.config.rate_step_s))
    return [max(total[i:i + group]) for i in range(0, len(total), group)]


def provision_fleet(planner: Planner, config: CoordinatorConfig, now: float
                    ) -> dict[str, Any]:
    """What to launch and stop now (MArk) for the forecast, with the cost per hour
    before and after; kinds without a known capacity are listed in ``left_out``."""
    if not config.node_types:
        raise PlanError("no instance catalogue: add node_types (price_per_hour per kind) "
                        "to the coordinator config")
    problem, _, live = planner.build(now)
    kinds = _by_kind(live)
    step_s = max(PROVISION_STEP_S, config.rate_step_s)
    forecast = forecast_total(planner, problem.models, now, step_s)
    weights = {m.name: m.rate for m in problem.models}
    total_rate = sum(weights.values())
    types, left_out, shown = [], {}, {}
    for name, t in sorted(config.node_types.items()):
        reports = kinds.get(name, [])
        capacity = t.capacity_rps
        if capacity is None:
            try:
                cores, _ = _shape(t, reports, "node_types")
            except SizingRequestError:
                left_out[name] = "no cores: no live node of this kind, none in the config"
                continue
            procs = {m.name: _proc_s(planner, m, t, reports) for m in problem.models}
            mean_proc = (sum(weights[n] * p for n, p in procs.items()) / total_rate
                         if total_rate > 0 else sum(procs.values()) / len(procs))
            capacity = cores / mean_proc
        if not math.isfinite(capacity) or capacity <= 0:
            left_out[name] = "no capacity"
            continue
        types.append(InstanceType(name, t.price_per_hour, float(capacity), t.launch_s))
        shown[name] = {"price_per_hour": t.price_per_hour, "capacity_rps": float(capacity),
                       "launch_s": t.launch_s, "running": len(reports)}
    if not types:
        raise PlanError("no kind of node has a known capacity: "
                        + "; ".join(f"{k}: {v}" for k, v in left_out.items()))
    fewest = max(forecast) / max(t.capacity_rps for t in types)
    if fewest > MAX_INSTANCES:
        raise PlanError(f"the forecast ({max(forecast):.4g} req/s) needs more than "
                        f"{MAX_INSTANCES} nodes of any kind in node_types")
    running = {name: len(reports) for name, reports in kinds.items()}
    unknown = sorted(k for k in running if k not in shown)
    provisioner = Provisioner(types, step_s=step_s,
                              running={k: v for k, v in running.items() if k in shown})
    try:
        decision = provisioner.step(forecast)
    except ProvisioningError as exc:
        raise PlanError(f"provisioning: {exc}") from None
    return {**decision.to_json(), "step_s": step_s, "forecast_rps": forecast,
            "types": shown, "left_out": left_out, "unpriced_running": unknown}
