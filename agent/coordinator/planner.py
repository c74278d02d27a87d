"""Faro's hybrid autoscaler over the fleet: catalog + node reports → ``faro.Problem`` →
``solve`` → ``place`` → a stored plan, on a long-term and a short-term loop.

* Long-term (every ``plan_interval_s``, Faro: 5 min): each catalogued model present on a
  live node gets its arrival-rate series (``rate_step_s`` bins summed over nodes, the
  last ``history_s``), a forecast over the next ``plan_window_s`` (Faro: 7 min), and is
  planned for the ``rate_quantile`` quantile of the forecast's window samples, not its
  mean (Faro §3.5.2). Then ``solve`` (Stages 2–3) and ``place``.
* Short-term (every ``reactive_interval_s``, Faro: 10 s): ``reactive_step`` per model on
  the worst observed latency at its SLO percentile among nodes heard from since the
  last tick; +1 replica after ``reactive_patience`` violating ticks, only into free
  cores, never down (Faro §4.4). The long-term plan resets the counts.

Decisions where the papers leave room:
* A replica is one worker of the model on a node; it needs ``cpu_per_replica`` cores.
  Capacity is the sum of live nodes' cores and CPU memory budgets.
* Processing time p (Faro's "average per-request replica processing time"): total
  busy seconds over requests processed, summed over nodes and batch sizes, so batching
  (MArk §4.3: a batch of b counts T_b / b per request) lowers it. Before any node
  measured one: the catalog's ``proc_ms``, else ``DEFAULT_PROC_MS``.
* Arrival points cover intervals; they are spread over the bins they overlap in
  proportion to the overlap, so any report interval gives the same series.
* A node that renews leases between full reports (``agent.node.lease``) sends its
  arrivals only with them: the store's bins hold its traffic up to its last full report.
  From then on the forecast counts it at the rate that report gave (``ModelReport.rate``,
  its last minute's; the node reports again when that changes beyond its threshold),
  until the next full report brings the real points in its place. Its forecast ends,
  and the reactive check hears it, by ``fleetview.heard_until`` (leases are stored late).
* Placement is on CPU memory: a model is held once per node that runs it
  (``resident_bytes``: its largest reported size) and may only go to nodes whose
  repository has it, preferring the last plan's nodes, then nodes where it is
  resident; GPU-device models count no CPU memory (their node's cache keeps
  the GPU budget). Replicas that fit nowhere are listed in the plan as ``unplaced``.
* A model catalogued with a ``source`` may go to any live node with room (the node
  pulls it: ``plan.directive_rows``); among nodes otherwise alike, those that hold its
  files (``NodeReport.disk``, or pulling them) come first, after the last plan's. A
  catalogued model that no live node holds and that has no source is left out, under
  ``excluded`` with that reason.
* A model reported by nodes but absent from the catalog has no SLO: it is not planned
  and no directive touches it.
* With routing (``agent.coordinator.routing``), a request is counted in the arrivals of
  the node it reached the fleet at, not of the node a forward brought it to, so a
  model's summed arrivals are the fleet's rate for it; the latency a forwarding node
  measured (hop included) is watched by the reactive loop like any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Any, Callable

import numpy as np

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.faro import (Capacity, ModelDemand, JobSpec, Machine, Problem,
                                    ProblemError, RateForecast, ReactiveState, forecast,
                                    place, reactive_step, solve)
from agent.coordinator.faro.tables import model_value
from agent.coordinator.fleetview import FleetReader, FleetView, heard_from
from agent.coordinator.plan import ModelPlan, Plan
from agent.coordinator.store import StoredPlan, Store
from agent.coordinator.reactiveview import ReactiveView
from agent.coordinator.summary import expand
from agent.errors import AgentError
from agent.wire import NodeReport, parse_report

log = logging.getLogger("edgeagent.coordinator.planner")

DEFAULT_PROC_MS = 10.0


class PlanError(AgentError, ValueError):
    """Nothing to plan (no live node or catalogued model) or the problem is infeasible."""

    status = 409


def rate_series(points: list[tuple[float, float, float]], end: float, step: float,
                span: float) -> np.ndarray:
    """Arrival rate per ``step`` bin over ``(end - span, end]`` from ``(t_end, seconds,
    count)`` points, each spread over the bins it overlaps; leading bins that no point
    covers (before the history starts) are dropped."""
    n = max(1, int(span // step))
    start = end - n * step
    counts = np.zeros(n)
    covered = np.zeros(n, dtype=bool)
    for t_end, seconds, count in points:
        lo, hi = max(t_end - seconds, start), min(t_end, end)
        if hi <= lo:
            continue
        first, last = int((lo - start) // step), min(n - 1, int(math.ceil((hi - start) / step)) - 1)
        for b in range(first, last + 1):
            overlap = min(hi, start + (b + 1) * step) - max(lo, start + b * step)
            if overlap > 0:
                counts[b] += count * overlap / seconds
                covered[b] = True
    if not covered.any():
        return np.zeros(0)
    return counts[int(np.argmax(covered)):] / step


def check_spec(spec: JobSpec) -> None:
    """ValueError naming the field unless ``spec``'s numbers can be planned: finite,
    rate >= 0, times and needs > 0 (reports are range-checked at ingestion; this
    catches what their sums, forecasts and the catalog can still make of them)."""
    checks = (("rate", spec.rate, 0.0, False), ("proc_s", spec.proc_s, 0.0, True),
              ("slo_s", spec.slo_s, 0.0, True), ("priority", spec.priority, 0.0, True),
              ("cpu_per_replica", spec.cpu_per_replica, 0.0, True),
              ("memory_per_replica_bytes", spec.memory_per_replica_bytes, 0.0, False))
    for field, value, low, strict in checks:
        if not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < low or (strict and value == low):
            raise ValueError(f"{field} is {value!r}: not a number the planner can use")


def exclusion_reason(exc: BaseException) -> str:
    """Why a model was left out of a plan, for ``/v1/plan``: the error's message."""
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)


#: How far before the last reactive check's newest report the next one looks for
#: fresh reports (reports another coordinator's writer commits a little late).
REACTIVE_SLACK_S = 30.0


class Planner:
    """Plans from the store's catalog and reports; keeps the reactive counters and
    the current plan (read from the store again only when another plan is newer)."""

    def __init__(self, store: Store, config: CoordinatorConfig, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.config, self.clock = store, config, clock
        self.reactive: dict[str, ReactiveState] = {}
        self._reactive_seen: dict[str, float] = {}  # node -> last_seen already observed
        self._reactive_mark = -math.inf  # the newest last_seen the last check saw
        self._reactive_view = ReactiveView(store)  # what the checks read of each node
        self._fleet = FleetReader(store)  # what the plans read of each node
        self._current: StoredPlan | None = None
        self.last_error: str | None = None

    # -- inputs ----------------------------------------------------------------------
    def live_reports(self, now: float, since: float = -math.inf,
                     after: dict[str, float] | None = None
                     ) -> dict[str, tuple[float, NodeReport, float]]:
        """node -> (last_seen, report, when that report came) for nodes heard from
        within the timeout (and at or after ``since``; and after ``after[node]`` when
        given): built from each node's stored summary (validated at ingestion), else its
        stored report, validated now."""
        timeout = self.config.node_timeout_s
        out = {}
        for name, seen, summary, raw, reported in self.store.live_nodes(
                max(now - timeout - 1.0, since)):
            if now - seen <= timeout and (after is None or seen > after.get(name, -math.inf)):
                out[name] = (seen, expand(summary) if summary is not None
                             else parse_report(name, raw),
                             seen if reported is None else reported)
        return out

    def read_fleet(self, now: float) -> FleetView:
        """What a plan reads of the nodes heard from within the timeout (their stored
        summaries, each decoded once per report: ``FleetReader``)."""
        timeout = self.config.node_timeout_s
        return self._fleet.read(now - timeout - 1.0, now, timeout, self.config.lease_lag_s)

    def current_plan(self) -> StoredPlan | None:
        """The store's newest plan (parsed again only when its id changed)."""
        newest = self.store.current_plan_id()
        if newest is None:
            self._current = None
        elif self._current is None or self._current.id != newest:
            self._current = self.store.current_plan()
        return self._current

    def _saved(self, plan: Plan, kind: str, now: float) -> StoredPlan:
        """Store ``plan`` and make it the current one."""
        doc = plan.to_json()
        plan_id = self.store.save_plan(doc, kind, now)
        self._current = StoredPlan(plan_id, now, kind, doc)
        return self._current

    def planning_rate(self, model: str, end: float,
                      tails: list[tuple[float, float]] = (),  # type: ignore[assignment]
                      bins: list[tuple[float, float]] | None = None) -> tuple[float, int]:
        """(rate to plan for, history points used) for ``model`` from the store's bins
        that end by ``end`` (when every node running it was last heard from) and the
        ``tails`` of the nodes whose arrivals come with their next full report."""
        predicted, points = self.rate_forecast(model, end, tails, bins)
        if predicted is None:
            return 0.0, 0
        return predicted.window_quantile(self.config.rate_quantile), points

    def _history(self, end: float) -> tuple[float, float, int]:
        """(start, stop, bins) of the complete history bins a forecast that ends at
        ``end`` reads."""
        step = self.store.rate_step_s
        n = max(1, int(self.config.history_s // step))
        stop = math.floor(end / step + 1e-9) * step
        return stop - n * step, stop, n

    def rate_forecast(self, model: str, end: float,
                      tails: list[tuple[float, float]] = (),  # type: ignore[assignment]
                      bins: list[tuple[float, float]] | None = None
                      ) -> tuple[RateForecast | None, int]:
        """(forecast of ``model``'s rate per ``rate_step_s`` over the next
        ``plan_window_s``, history points used); None without history. ``tails``:
        ``(since, rate)`` of each node whose arrivals since ``since`` are not in the
        store yet (it renews leases): counted at that rate up to ``end``. ``bins``: the
        model's ``(start, count)`` bins from at least the history's start on, oldest
        first (None: read from the store)."""
        cfg = self.config
        step = self.store.rate_step_s
        start, stop, n = self._history(end)
        # n complete bins, then the one in progress, [stop, end): its rate so far
        # counts when it spans at least a tenth of a step
        width = np.full(n + 1, step)
        width[n] = end - stop
        counts = np.zeros(n + 1)
        covered = np.zeros(n + 1, dtype=bool)
        if bins is None:
            bins = self.store.rate_bins(model, since=start - step / 2)
        for t, count in bins:
            i = int(round((t - start) / step))
            if 0 <= i <= n:
                counts[i] += count
                covered[i] = True
        if len(tails):  # every node's tail over every bin at once
            since, rate = np.asarray(tails, dtype=float).T
            lo = start + np.arange(n + 1) * step
            overlap = np.clip(np.minimum(lo + width, end)[None, :]
                              - np.maximum(lo[None, :], since[:, None]), 0.0, None)
            counts += rate @ overlap
            covered |= overlap.any(axis=0)
        if width[n] < step / 10:
            width, counts, covered = width[:n], counts[:n], covered[:n]
        if not covered.any():
            return None, 0
        first = int(np.argmax(covered))
        series = counts[first:] / width[first:]
        horizon = max(1, round(cfg.plan_window_s / step))
        return forecast(series, horizon, n_samples=200, seed=0), int(series.size)

    @staticmethod
    def processing_ms(slo: ModelSLO, reports: list[NodeReport]) -> tuple[float, str]:
        """(per-request processing ms, where it came from) on the nodes of ``reports``."""
        seconds = done = 0.0
        for report in reports:
            m = report.models.get(slo.name)
            if m is not None:
                busy, requests = m.busy_seconds_per_request()
                seconds, done = seconds + busy, done + requests
        return _processing_ms(slo, seconds, done)

    def build(self, now: float) -> tuple[Problem, dict[str, dict[str, Any]],
                                         dict[str, NodeReport]]:
        """The Faro problem for now, per-model plan details, and the live reports (a
        plan reads the fleet's view, ``read_fleet``; sizing reads the reports too)."""
        problem, details = self._problem(now, self.read_fleet(now))
        return problem, details, {n: r for n, (_, r, _) in self.live_reports(now).items()}

    def _problem(self, now: float, fleet: FleetView
                 ) -> tuple[Problem, dict[str, dict[str, Any]]]:
        """The Faro problem of ``fleet`` for now, and per-model plan details."""
        if not len(fleet):
            raise PlanError("no live nodes: none reported in the last "
                            f"{self.config.node_timeout_s:g} s")
        catalog, nowhere = [], []
        for m in self.store.models():
            (catalog if m.name in fleet.held or m.source is not None
             else nowhere).append(m)
        if not catalog:
            raise PlanError("no catalogued model is in a live node's repository or has a "
                            "source; add one with PUT /v1/models/{name} or 'edgeagent "
                            "coordinator models set'")
        ends = [now, *(held.end for held in fleet.held.values())]
        history = self.store.history_bins(
            self._history(min(ends))[0] - self.store.rate_step_s / 2)
        specs, details = [], {}
        for slo in nowhere:
            details[slo.name] = {"excluded": "no live node holds it and it has no source "
                                             "to pull it from"}
        for slo in catalog:
            try:  # one model's bad inputs leave it out of the plan, not the fleet
                held = fleet.held.get(slo.name)
                rate, points = self.planning_rate(slo.name, now if held is None else held.end,
                                                  fleet.tails.get(slo.name, []),
                                                  history.get(slo.name, []))
                proc_ms, source = _processing_ms(slo, held.seconds, held.done) \
                    if held is not None else _processing_ms(slo, 0.0, 0.0)
                spec = JobSpec(
                    name=slo.name, rate=rate, proc_s=proc_ms / 1000.0,
                    slo_s=slo.slo_ms / 1000.0, percentile=slo.percentile,
                    priority=slo.priority, cpu_per_replica=slo.cpu_per_replica,
                    memory_per_replica_bytes=slo.memory_per_replica_bytes)
                check_spec(spec)
            except Exception as exc:  # noqa: BLE001 - any failure of its inputs
                details[slo.name] = {"excluded": exclusion_reason(exc)}
                log.warning("plan: %s left out: %s", slo.name, details[slo.name]["excluded"])
                continue
            specs.append(spec)
            details[slo.name] = {"rate_points": points, "proc_source": source}
            if slo.source is not None:
                details[slo.name]["source"] = slo.pull()
        capacity = Capacity(cpu=sum(c for c, _ in fleet.capacity.values()),
                            memory_bytes=sum(m for _, m in fleet.capacity.values()))
        problem = Problem(capacity=capacity, models=tuple(specs),
                          objective=self.config.objective, estimator=self.config.estimator)
        return problem, details

    # -- plans -----------------------------------------------------------------------
    def _place(self, problem: Problem, replicas: dict[str, int],
               fleet: FleetView, previous: StoredPlan | None,
               sourced: set[str] = frozenset()):  # type: ignore[assignment]
        """``sourced``: the models with a source (they may go to any node)."""
        nodes = [Machine(n, cores, memory)
                 for n, (cores, memory) in sorted(fleet.capacity.items())]
        demands = []
        for spec in problem.models:
            held = fleet.held.get(spec.name)
            anywhere = spec.name in sourced
            demands.append(ModelDemand(
                name=spec.name, replicas=replicas[spec.name],
                cpu_per_replica=spec.cpu_per_replica,
                resident_bytes=held.largest if held is not None and held.cpu_only else 0.0,
                memory_per_replica_bytes=spec.memory_per_replica_bytes,
                pinned_nodes=frozenset() if anywhere or held is None
                else frozenset(held.nodes),
                preferred_nodes=frozenset(fleet.files.get(spec.name, ())) if anywhere
                else frozenset()))
        current = dict(previous.parsed.assignment if previous else {})
        # A model the last plan did not place starts where it is resident (no new load).
        placed = {m for row in current.values() for m in row}
        copied = set()  # the rows copied before a change (the plan's own are kept)
        for spec in problem.models:
            held = fleet.held.get(spec.name)
            if spec.name not in placed and held is not None:
                for n, resident in held.nodes.items():
                    if resident:
                        if n not in copied:
                            current[n] = dict(current.get(n, {}))
                            copied.add(n)
                        current[n][spec.name] = 1
        return place(nodes, demands, current)

    def _render(self, problem: Problem, replicas: dict[str, int], latency: dict[str, float],
                utility: dict[str, float], drops: dict[str, float], placement: Any,
                details: dict[str, dict[str, Any]], now: float, kind: str,
                solver: str, objective: float | None, fleet: FleetView) -> Plan:
        models = {}
        where: dict[str, dict[str, int]] = {}  # model -> node -> replicas
        for n, row in placement.assignment.items():
            for name, count in row.items():
                where.setdefault(name, {})[n] = count
        for spec in problem.models:
            models[spec.name] = ModelPlan(
                replicas=replicas[spec.name],
                rate=spec.rate, proc_ms=spec.proc_s * 1000.0,
                slo_ms=spec.slo_s * 1000.0, percentile=spec.percentile,
                priority=spec.priority, cpu_per_replica=spec.cpu_per_replica,
                memory_per_replica_bytes=spec.memory_per_replica_bytes,
                predicted_latency_ms=latency[spec.name] * 1000.0
                if math.isfinite(latency[spec.name]) else None,
                utility=utility[spec.name], drop_rate=drops[spec.name],
                placement=where.get(spec.name, {}),
                unplaced=placement.unplaced.get(spec.name, 0),
                **details.get(spec.name, {}),
            )
        return Plan(created=now, kind=kind, objective=problem.objective,
                    estimator=problem.estimator, solver=solver, objective_value=objective,
                    rate_quantile=self.config.rate_quantile, window_s=self.config.plan_window_s,
                    capacity=problem.capacity, models=models, assignment=placement.assignment,
                    started=placement.started, stopped=placement.stopped,
                    addresses={n: peer for n, peer in fleet.peers.items()
                               if placement.assignment.get(n)})

    def _solve_isolated(self, problem: Problem, details: dict[str, dict[str, Any]]
                        ) -> tuple[Problem, Any]:
        """(problem, allocation): ``solve(problem)``; when that fails, the models that
        fail to solve alone are left out (their reason in ``details``) and the rest is
        solved again. A failure of the whole fleet (infeasible together) is raised."""
        if not problem.models:
            raise PlanError("every model was left out of the plan: " + "; ".join(
                f"{m}: {d['excluded']}" for m, d in details.items() if "excluded" in d))
        try:
            return problem, solve(problem)
        except Exception as exc:  # noqa: BLE001 - which model? solve each alone
            failure = exc
        kept = []
        for spec in problem.models:
            try:
                solve(dataclasses.replace(problem, models=(spec,)))
            except Exception as exc:  # noqa: BLE001
                details[spec.name] = {"excluded": exclusion_reason(exc)}
                log.warning("plan: %s left out: %s", spec.name, details[spec.name]["excluded"])
            else:
                kept.append(spec)
        if len(kept) == len(problem.models):
            raise failure  # no single model's fault
        problem = dataclasses.replace(problem, models=tuple(kept))
        return self._solve_isolated(problem, details)

    def plan_now(self, kind: str = "long-term") -> StoredPlan:
        """Plan from scratch (long-term or manual), store and return the plan. A model
        whose inputs make planning fail is left out, listed under ``excluded`` with the
        reason; the rest of the fleet is planned."""
        now = self.clock()
        try:
            fleet = self.read_fleet(now)
            problem, details = self._problem(now, fleet)
            problem, allocation = self._solve_isolated(problem, details)
        except (PlanError, ProblemError) as exc:
            self.last_error = str(exc)
            raise PlanError(str(exc)) from None
        placement = self._place(problem, allocation.replicas, fleet, self.current_plan(),
                                {m for m, d in details.items() if "source" in d})
        plan = self._render(problem, allocation.replicas, allocation.latency_s,
                            allocation.utility, allocation.drop_rate, placement, details,
                            now, kind, allocation.solver, allocation.objective, fleet)
        plan = dataclasses.replace(plan, excluded={
            m: d["excluded"] for m, d in sorted(details.items()) if "excluded" in d},
            retired=self._retired(self.current_plan()))
        stored = self._saved(plan, kind, now)
        self.reactive = {m: ReactiveState(n) for m, n in allocation.replicas.items()}
        self.last_error = None
        log.info("plan %d (%s, %s): %s%s", stored.id, kind, allocation.solver,
                 ", ".join(f"{m}={n}" for m, n in allocation.replicas.items()),
                 f"; unplaced {placement.unplaced}" if placement.unplaced else "")
        return stored

    def reactive_tick(self) -> StoredPlan | None:
        """One short-term check; a new (reactive) plan when some model scaled up. It
        takes the nodes heard from since the last check (a report or a lease; a node
        that renews leases by ``heard_until``, as its forecast ends; nothing, when none
        was), decoding only reports new since then (``ReactiveView``), and reads the
        plan only when it changed."""
        now = self.clock()
        current = self.current_plan()
        if current is None:
            return None
        plan = current.parsed
        timeout, after = self.config.node_timeout_s, self._reactive_seen
        recent, heard, mark = [], {}, -math.inf
        for name, seen, node in self._reactive_view.live(
                max(now - timeout - 1.0, self._reactive_mark - REACTIVE_SLACK_S),
                {name: m.percentile for name, m in plan.models.items()}):
            last = after.get(name, -math.inf)
            if now - seen <= timeout and (t := heard_from(
                    seen, node.renews, now, self.config.lease_lag_s, last)) > last:
                recent.append(node)
                heard[name], mark = t, max(mark, seen)
        if not recent:
            return None
        after.update(heard)
        self._reactive_mark = max(self._reactive_mark, mark)
        free = plan.free_cpu()
        grown = {}
        worst = self._reactive_view.worst(recent)
        for name, m in sorted(plan.models.items()):
            observed = worst.get(name)
            if observed is None:
                continue
            state = self.reactive.get(name)
            if state is None or state.replicas < m.replicas:
                state = ReactiveState(m.replicas, state.violations if state else 0)
            room = int(free // m.cpu_per_replica + 1e-9)
            new = reactive_step(state, observed, m.slo_ms,
                                patience=self.config.reactive_patience, step=1,
                                max_replicas=state.replicas + max(room, 0))
            if new.replicas > state.replicas:
                free -= (new.replicas - state.replicas) * m.cpu_per_replica
                grown[name] = new.replicas
                log.info("reactive: %s latency %.1f ms > SLO %.1f ms for %d checks: "
                         "%d -> %d replicas", name, observed, m.slo_ms,
                         self.config.reactive_patience, state.replicas, new.replicas)
            self.reactive[name] = new
        if not grown:
            return None
        return self._rescale(current, grown, self.read_fleet(now), now)

    def _retired(self, previous: StoredPlan | None) -> tuple[str, ...]:
        """The models with a source that ``previous`` ran (or had retired) and the
        catalog no longer holds: nodes that hold them drop them (assigned copies only)."""
        if previous is None:
            return ()
        plan = previous.parsed
        ran = {n for n, m in plan.models.items() if m.source is not None}
        return tuple(sorted((ran | set(plan.retired)) - {m.name for m in self.store.models()}))

    def _rescale(self, current: StoredPlan, grown: dict[str, int],
                 fleet: FleetView, now: float) -> StoredPlan:
        """The current plan with ``grown`` replica counts, re-placed and re-scored."""
        plan = current.parsed
        specs = tuple(m.spec(n) for n, m in plan.models.items())
        problem = Problem(capacity=plan.capacity, models=specs,
                          objective=plan.objective, estimator=plan.estimator)
        replicas = {n: grown.get(n, m.replicas) for n, m in plan.models.items()}
        latency, utility, drops = {}, {}, {}
        for spec in specs:
            utility[spec.name], latency[spec.name], drops[spec.name] = model_value(
                spec, replicas[spec.name], problem)
        placement = self._place(problem, replicas, fleet, current,
                                {n for n, m in plan.models.items() if m.source is not None})
        details = {n: {k: v for k, v in (("rate_points", m.rate_points),
                                         ("proc_source", m.proc_source),
                                         ("source", m.source)) if v is not None}
                   for n, m in plan.models.items()}
        new = self._render(problem, replicas, latency, utility, drops, placement, details,
                           now, "reactive", plan.solver, None, fleet)
        new = dataclasses.replace(new, retired=plan.retired)
        return self._saved(new, "reactive", now)


def _processing_ms(slo: ModelSLO, seconds: float, done: float) -> tuple[float, str]:
    """(per-request processing ms, where it came from) from the busy ``seconds`` and
    requests ``done`` summed over the nodes holding ``slo``'s model: measured, else the
    catalog's, else ``DEFAULT_PROC_MS``."""
    if done > 0 and seconds > 0:
        return seconds / done * 1000.0, "measured"
    if slo.proc_ms is not None:
        return slo.proc_ms, "catalog"
    return DEFAULT_PROC_MS, "default"


class PlannerLoops:
    """Runs the long-term and reactive loops on the event loop; planning itself runs in
    a worker thread, one plan at a time (``replan`` shares the lock)."""

    def __init__(self, planner: Planner, *, prepare: Callable[[], Any] = lambda: None,
                 adopt: Callable[[StoredPlan], Any] = lambda plan: None,
                 leading: Callable[[], bool] = lambda: True) -> None:
        """``prepare`` runs in the worker before each plan (write queued reports);
        ``adopt`` gets each new plan on the event loop; the loops skip their ticks
        while ``leading()`` is False (another coordinator plans)."""
        self.planner = planner
        self.prepare, self.adopt, self.leading = prepare, adopt, leading
        self.lock = asyncio.Lock()
        self.tasks: list[asyncio.Task] = []

    async def _in_worker(self, step: Callable[..., Any], *args: Any) -> Any:
        def work() -> Any:
            self.prepare()
            return step(*args)
        plan = await asyncio.get_running_loop().run_in_executor(None, work)
        if plan is not None:
            self.adopt(plan)
        return plan

    async def replan(self, kind: str = "manual") -> StoredPlan:
        async with self.lock:
            return await self._in_worker(self.planner.plan_now, kind)

    async def react(self) -> StoredPlan | None:
        def step() -> StoredPlan | None:  # in the worker: the store may be busy
            if self.planner.store.current_plan_id() is None:  # first plan asap
                try:
                    return self.planner.plan_now("long-term")
                except PlanError:
                    return None
            return self.planner.reactive_tick()
        async with self.lock:
            return await self._in_worker(step)

    async def _every(self, interval: float, step: Callable[[], Any], name: str) -> None:
        while True:
            await asyncio.sleep(interval)
            if not self.leading():
                continue
            try:
                await step()
            except PlanError as exc:
                log.info("%s: no plan: %s", name, exc)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bad tick must not stop the loop
                log.exception("%s failed", name)

    def start(self) -> None:
        cfg = self.planner.config
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._every(cfg.plan_interval_s,
                                         lambda: self.replan("long-term"), "long-term plan")),
            loop.create_task(self._every(cfg.reactive_interval_s, self.react, "reactive check")),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled or failed, either way done
                pass
        self.tasks = []
