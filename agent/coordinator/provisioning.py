"""Cost-aware provisioning over a forecast (MArk, ATC'19, §4.2 Algorithm 1).

At each planning step MArk serves the forecast demand with the instances of the lowest
cost per request, counting each candidate's launch overhead; instances already running
are candidates with no overhead. Decisions written down here (the paper is terse):

- Demand ``F_t`` is a request rate (req/s) per step of ``step_s`` seconds; step ``tau``
  (default 0: the current one; MArk uses the load 5 minutes ahead) is the provisioning
  target. An instance type's capacity ``C_i`` is its measured batch throughput
  ``b / T_b`` (req/s, as the batching layer measures it) or a given ``capacity_rps``.
  A type whose batch time exceeds the SLO cannot meet it and is left out.
- FILL: while the planned capacity is short at ``tau``, find the longest run
  ``tau..e`` of steps that are short, and add the candidate with the lowest
  ``(O_i + steps * step_h * P_i) / N_i``, where ``N_i`` is the short demand one such
  instance serves over ``tau..e`` (``min(C_i, shortfall_t)`` per step). ``steps`` is
  ``e - tau + 1`` (the paper writes ``e - tau``, zero for a single step). The launch
  overhead ``O_i`` is the price paid while it starts: ``P_i * launch_s / 3600``.
- Scale-in by cost (beyond the paper, which stops whatever the plan does not use): a
  running instance the plan does not need at ``tau`` is kept when the forecast needs more
  than the plan within ``O_i / P_i`` (its break-even time: idling until then costs no
  more than launching it again), the cheapest per unit of capacity first. This is
  Algorithm 1's own comparison (running instances carry no overhead) carried across a
  dip in the forecast; without it the greedy stops and relaunches around every dip
  (``bench/provisioning.py`` compares the variants against the exhaustive optimum).
- Rollout step (beyond the paper; on by default, ``lookahead``): FILL prices a
  candidate per request over the next run of short steps, so a type cheap per request
  but unable to carry a later peak can replace a running one that will be needed again.
  The plan is therefore compared with its one-instance swaps (one instance of a type
  for as many of another as still cover the target), each priced by the dollars over
  the whole forecast when the greedy plans every later step; the cheapest wins (a
  one-step rollout of the greedy, Bertsekas-style). It narrows the gap to the optimum
  on ``bench/provisioning.py``'s cases, but does not close it: the greedy that follows
  a swap is as myopic as before (figures in docs/benchmarks.md).
- Cool-down (optional, ``scale_in_plans``; the artifact uses 6, the paper's "destroying
  requests are sent after a cool-down period to ensure better service quality"):
  running instances are also kept while the plan is short of the largest target of the
  last ``scale_in_plans`` plans, the cheapest per unit of capacity first. (The artifact
  keeps the per-type maximum of the last 6 plans; with one pool per plan the largest
  target is the same hold without remembering plans.) It costs money with a good
  forecast (``bench/provisioning.py``), so it is off by default (1) and there for a
  forecast that is not trusted.
- The artifact's controller (``proactive_controller2``) plans for the largest residual
  of the next 6 steps rather than for ``tau``; this module follows the paper.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

from agent.validation import number

SCALE_IN_PLANS = 1      # no cool-down; the artifact's is 6
ARTIFACT_SCALE_IN_PLANS = 6


class ProvisioningError(ValueError):
    """A provisioning problem that cannot be read or solved."""


@dataclass(frozen=True)
class InstanceType:
    name: str
    price_per_hour: float
    capacity_rps: float
    launch_s: float = 0.0
    batch_ms: float | None = None     # time of one batch (T_b), for the SLO check

    @property
    def overhead(self) -> float:
        """Dollars paid while an instance launches."""
        return self.price_per_hour * self.launch_s / 3600.0

    def meets(self, slo_ms: float | None) -> bool:
        return slo_ms is None or self.batch_ms is None or self.batch_ms <= slo_ms


@dataclass
class Decision:
    plan: dict[str, int]
    launch: dict[str, int]
    stop: dict[str, int]
    cost_per_hour_before: float
    cost_per_hour_after: float
    target_rps: float
    held_rps: float           # the demand scale-in keeps capacity for

    def to_json(self) -> dict:
        return {"plan": self.plan, "launch": self.launch, "stop": self.stop,
                "cost_per_hour_before": self.cost_per_hour_before,
                "cost_per_hour_after": self.cost_per_hour_after,
                "target_rps": self.target_rps, "held_rps": self.held_rps}


def _hourly(types: list[InstanceType], counts: dict[str, int]) -> float:
    return sum(t.price_per_hour * counts.get(t.name, 0) for t in types)


def fill(types: list[InstanceType], forecast: list[float], running: dict[str, int],
         step_s: float, tau: int = 0) -> dict[str, int]:
    """Algorithm 1's FILL: instance counts per type covering ``forecast[tau]``."""
    if not 0 <= tau < len(forecast):
        raise ProvisioningError(f"tau {tau} is outside the forecast ({len(forecast)} steps)")
    if not types:
        raise ProvisioningError("no instance type can meet the SLO")
    free = {t.name: int(running.get(t.name, 0)) for t in types}
    plan = {t.name: 0 for t in types}
    planned = 0.0
    step_h = step_s / 3600.0
    for _ in range(100_000):
        short = [f - planned for f in forecast]
        if short[tau] <= 1e-9:
            return _drop_redundant(types, plan, running, forecast[tau])
        e = tau
        while e + 1 < len(short) and short[e + 1] > 1e-9:
            e += 1
        best = None
        for t in types:
            served = sum(min(t.capacity_rps, short[k]) for k in range(tau, e + 1)) * step_s
            for is_running in (True, False):
                if is_running and free[t.name] == 0:
                    continue
                overhead = 0.0 if is_running else t.overhead
                cost = (overhead + (e - tau + 1) * step_h * t.price_per_hour) / served
                if best is None or cost < best[0] - 1e-15:
                    best = (cost, t, is_running)
        _, t, is_running = best
        plan[t.name] += 1
        planned += t.capacity_rps
        if is_running:
            free[t.name] -= 1
    raise ProvisioningError("demand too large for the instance capacities")


def _drop_redundant(types: list[InstanceType], plan: dict[str, int],
                    running: dict[str, int], need: float) -> dict[str, int]:
    """Remove instances the plan covers ``need`` without (a large one added last can make
    earlier small ones redundant): the priciest per hour first, new before running."""
    plan = dict(plan)
    total = sum(t.capacity_rps * plan[t.name] for t in types)
    for t in sorted(types, key=lambda t: -t.price_per_hour):
        while plan[t.name] > 0 and total - t.capacity_rps >= need - 1e-9:
            plan[t.name] -= 1
            total -= t.capacity_rps
    return plan


def keep_for_later(types: list[InstanceType], plan: dict[str, int],
                   running: dict[str, int], forecast: list[float], step_s: float,
                   tau: int = 0) -> dict[str, int]:
    """Add to ``plan`` the running instances it leaves out that the forecast needs again
    within their break-even time (idle price until then <= launch overhead)."""
    plan = dict(plan)
    spare = {t.name: int(running.get(t.name, 0)) - plan.get(t.name, 0) for t in types}
    step_h = step_s / 3600.0
    while True:
        capacity = sum(t.capacity_rps * plan.get(t.name, 0) for t in types)
        later = next((k for k in range(tau + 1, len(forecast))
                      if forecast[k] > capacity + 1e-9), None)
        if later is None:
            return plan
        idle_h = (later - tau) * step_h
        keep = next((t for t in sorted(types, key=lambda t: t.price_per_hour / t.capacity_rps)
                     if spare[t.name] > 0 and idle_h * t.price_per_hour <= t.overhead + 1e-15),
                    None)
        if keep is None:
            return plan
        plan[keep.name] = plan.get(keep.name, 0) + 1
        spare[keep.name] -= 1


def greedy_plan(types: list[InstanceType], forecast: list[float], running: dict[str, int],
                step_s: float, tau: int = 0, break_even: bool = True) -> dict[str, int]:
    """FILL, then (``break_even``) the running instances kept for later."""
    plan = fill(types, forecast, running, step_s, tau)
    return keep_for_later(types, plan, running, forecast, step_s, tau) if break_even else plan


def rollout_cost(types: list[InstanceType], first: dict[str, int], forecast: list[float],
                 running: dict[str, int], step_s: float, tau: int = 0,
                 break_even: bool = True) -> float:
    """Dollars over ``forecast[tau:]`` when ``first`` is the plan now and the greedy
    plans every later step (with the forecast that remains)."""
    total, prev = step_cost(types, running, first, step_s), first
    for k in range(tau + 1, len(forecast)):
        plan = greedy_plan(types, forecast[k:], prev, step_s, 0, break_even)
        total += step_cost(types, prev, plan, step_s)
        prev = plan
    return total


def improve_by_rollout(types: list[InstanceType], plan: dict[str, int],
                       forecast: list[float], running: dict[str, int], step_s: float,
                       tau: int = 0, break_even: bool = True) -> dict[str, int]:
    """The local improvement step: ``plan`` or a variant with one instance of a type
    swapped for instances of another (as many as still cover ``forecast[tau]``),
    whichever costs least when the greedy follows it over the forecast (a one-step
    rollout of the greedy, which prices each candidate over the whole window rather
    than per request over the next run of short steps)."""
    capacity = {t.name: t.capacity_rps for t in types}
    need = forecast[tau]
    candidates = [plan]
    for out in types:
        if plan.get(out.name, 0) == 0:
            continue
        for into in types:
            if into is out:
                continue
            swapped = dict(plan)
            swapped[out.name] -= 1
            swapped[into.name] = swapped.get(into.name, 0) + 1
            while sum(capacity[n] * c for n, c in swapped.items()) < need - 1e-9:
                swapped[into.name] += 1
            candidates.append(swapped)
    costs = [rollout_cost(types, c, forecast, running, step_s, tau, break_even)
             for c in candidates]
    best = 0
    for i, cost in enumerate(costs):
        if cost < costs[best] - 1e-12:
            best = i
    return candidates[best]


class Provisioner:
    """Rolling MArk provisioning: one :meth:`step` per planning interval."""

    def __init__(self, types: list[InstanceType], *, step_s: float = 60.0, tau: int = 0,
                 slo_ms: float | None = None, scale_in_plans: int = SCALE_IN_PLANS,
                 running: dict[str, int] | None = None, recent_targets=(),
                 break_even: bool = True, lookahead: bool = True):
        self.all_types = list(types)
        self.break_even, self.lookahead = break_even, lookahead
        self.types = [t for t in types if t.meets(slo_ms)]
        self.step_s, self.tau = step_s, tau
        self.running = {t.name: int((running or {}).get(t.name, 0)) for t in types}
        # the targets of the last scale_in_plans - 1 plans (this one makes scale_in_plans)
        self.recent: deque[float] = deque(recent_targets, maxlen=max(0, scale_in_plans - 1))

    def step(self, forecast: list[float]) -> Decision:
        plan = greedy_plan(self.types, list(forecast), self.running, self.step_s, self.tau,
                           self.break_even)
        if self.lookahead:
            plan = improve_by_rollout(self.types, plan, list(forecast), self.running,
                                      self.step_s, self.tau, self.break_even)
        target = float(forecast[self.tau])
        held = max([target, *self.recent])
        capacity = {t.name: t.capacity_rps for t in self.all_types}
        planned = sum(capacity[n] * c for n, c in plan.items())
        spare = {n: self.running.get(n, 0) - plan.get(n, 0) for n in self.running}
        # Keep running instances (cheapest per capacity first) while the plan is short of
        # the largest recent target.
        for t in sorted(self.all_types, key=lambda t: t.price_per_hour / t.capacity_rps):
            while planned < held - 1e-9 and spare.get(t.name, 0) > 0:
                plan[t.name] = plan.get(t.name, 0) + 1
                spare[t.name] -= 1
                planned += t.capacity_rps
        before = _hourly(self.all_types, self.running)
        launch = {n: c - self.running.get(n, 0) for n, c in plan.items()
                  if c > self.running.get(n, 0)}
        stop = {n: r - plan.get(n, 0) for n, r in self.running.items() if r > plan.get(n, 0)}
        self.running = {t.name: plan.get(t.name, 0) for t in self.all_types}
        self.recent.append(target)
        return Decision({t.name: plan.get(t.name, 0) for t in self.all_types}, launch, stop,
                        before, _hourly(self.all_types, self.running), target, held)


def step_cost(types: list[InstanceType], prev: dict[str, int], now: dict[str, int],
              step_s: float) -> float:
    """Dollars for one step: running price plus launch overhead of what was added."""
    return sum(t.price_per_hour * now.get(t.name, 0) * step_s / 3600.0
               + max(0, now.get(t.name, 0) - prev.get(t.name, 0)) * t.overhead
               for t in types)


def simulate(types: list[InstanceType], demand: list[float], *, horizon: int = 6,
             step_s: float = 60.0, slo_ms: float | None = None,
             scale_in_plans: int = SCALE_IN_PLANS, break_even: bool = True,
             lookahead: bool = True) -> tuple[float, int]:
    """Roll the provisioner over ``demand`` with a perfect forecast of ``horizon`` steps:
    (total dollars, steps whose demand the capacity did not cover)."""
    p = Provisioner(types, step_s=step_s, slo_ms=slo_ms, scale_in_plans=scale_in_plans,
                    break_even=break_even, lookahead=lookahead)
    cap = {t.name: t.capacity_rps for t in types}
    total, unmet, prev = 0.0, 0, {t.name: 0 for t in types}
    for k in range(len(demand)):
        d = p.step(demand[k:k + horizon])
        total += step_cost(types, prev, d.plan, step_s)
        unmet += sum(cap[n] * c for n, c in d.plan.items()) < demand[k] - 1e-9
        prev = d.plan
    return total, unmet


def peak_cost(types: list[InstanceType], demand: list[float], step_s: float = 60.0,
              slo_ms: float | None = None) -> float:
    """"Always the peak": the cheapest pool that covers the whole trace's peak, held."""
    ok = [t for t in types if t.meets(slo_ms)]
    peak = max(demand)
    best = min(_pools(ok, peak), key=lambda c: _hourly(ok, c))
    return step_cost(ok, {}, best, step_s) + _hourly(ok, best) * step_s / 3600.0 * (
        len(demand) - 1)


def _pools(types: list[InstanceType], need: float):
    ranges = [range(int(math.ceil(need / t.capacity_rps)) + 1) for t in types]
    for counts in itertools.product(*ranges):
        if sum(c * t.capacity_rps for c, t in zip(counts, types)) >= need - 1e-9:
            yield {t.name: c for t, c in zip(types, counts)}


def optimal_cost(types: list[InstanceType], demand: list[float], step_s: float = 60.0,
                 slo_ms: float | None = None) -> float:
    """Exhaustive dynamic programme over per-step counts (small cases only): the least
    total of running prices and launch overheads that covers the demand at every step.

    A step's cost is separable by type (``P_i`` per instance running, ``O_i`` per one
    added), so the minimum over the previous counts is taken one type (array axis) at a
    time: O(states x counts) per step instead of O(states^2)."""
    import numpy as np

    ok = [t for t in types if t.meets(slo_ms)]
    peak = max(demand)
    sizes = [int(math.ceil(peak / t.capacity_rps)) + 1 for t in ok]
    if math.prod(sizes) * max(sizes) * len(demand) > 50_000_000:
        raise ProvisioningError("too large for the exhaustive search")
    step_h = step_s / 3600.0
    grids = np.meshgrid(*(np.arange(n) for n in sizes), indexing="ij")
    capacity = sum(g * t.capacity_rps for g, t in zip(grids, ok))
    running = sum(g * t.price_per_hour * step_h for g, t in zip(grids, ok))
    best = np.full(sizes, np.inf)
    best[(0,) * len(ok)] = 0.0
    for d in demand:
        for axis, t in enumerate(ok):
            # min over the previous count p of best(.., p, ..) + O * max(0, s - p)
            n = sizes[axis]
            k = np.arange(n)
            launch = t.overhead * np.maximum(0, k[:, None] - k[None, :])   # [s, p]
            moved = np.moveaxis(best, axis, 0)                               # [p, ...]
            mins = np.min(launch.reshape(n, n, *([1] * (len(ok) - 1))) + moved[None],
                          axis=1)
            best = np.moveaxis(mins, 0, axis)
        best = np.where(capacity >= d - 1e-9, best + running, np.inf)
    return float(best.min())


def problem_from_dict(data: Any) -> tuple[Provisioner, list[float]]:
    """A provisioner and forecast from the ``plan provision --problem`` JSON."""
    if not isinstance(data, dict):
        raise ProvisioningError("problem must be a JSON object")
    raw = data.get("types")
    if not isinstance(raw, list) or not raw:
        raise ProvisioningError("types: a non-empty list is needed")
    types = []
    for k, t in enumerate(raw):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ProvisioningError(f"types[{k}]: an object with a name is needed")
        price = _num(t.get("price_per_hour"), f"types[{k}].price_per_hour", lo=0.0)
        batch_ms = None
        if "capacity_rps" in t:
            cap = _num(t["capacity_rps"], f"types[{k}].capacity_rps", lo=0.0, strict=True)
            if "batch_ms" in t:
                batch_ms = _num(t["batch_ms"], f"types[{k}].batch_ms", lo=0.0, strict=True)
        elif "batch_size" in t and "batch_ms" in t:
            b = _num(t["batch_size"], f"types[{k}].batch_size", lo=0.0, strict=True)
            batch_ms = _num(t["batch_ms"], f"types[{k}].batch_ms", lo=0.0, strict=True)
            cap = b / (batch_ms / 1000.0)
        else:
            raise ProvisioningError(f"types[{k}]: capacity_rps, or batch_size and "
                                    f"batch_ms, are needed")
        launch = _num(t.get("launch_s", 0.0), f"types[{k}].launch_s", lo=0.0)
        types.append(InstanceType(t["name"], price, cap, launch, batch_ms))
    if len({t.name for t in types}) != len(types):
        raise ProvisioningError("types: names repeat")
    forecast = data.get("forecast")
    if not isinstance(forecast, list) or not forecast:
        raise ProvisioningError("forecast: a non-empty list of rates (req/s) is needed")
    forecast = [_num(f, "forecast[]", lo=0.0) for f in forecast]
    step_s = _num(data.get("step_s", 60.0), "step_s", lo=0.0, strict=True)
    tau = data.get("tau", 0)
    if not isinstance(tau, int) or isinstance(tau, bool) or not 0 <= tau < len(forecast):
        raise ProvisioningError("tau: an index into the forecast is needed")
    slo = data.get("slo_ms")
    slo = None if slo is None else _num(slo, "slo_ms", lo=0.0, strict=True)
    running = data.get("running", {})
    if not isinstance(running, dict) or any(
            n not in {t.name for t in types} or not isinstance(c, int)
            or isinstance(c, bool) or c < 0
            for n, c in running.items()):
        raise ProvisioningError("running: counts (integers >= 0) of known types")
    recent = data.get("recent_targets", [])
    if not isinstance(recent, list):
        raise ProvisioningError("recent_targets: a list of rates")
    recent = [_num(r, "recent_targets[]", lo=0.0) for r in recent]
    plans = data.get("scale_in_plans", SCALE_IN_PLANS)
    if not isinstance(plans, int) or isinstance(plans, bool) or not 1 <= plans <= 1000:
        raise ProvisioningError("scale_in_plans: an integer 1..1000 is needed")
    p = Provisioner(types, step_s=step_s, tau=tau, slo_ms=slo, running=running,
                    scale_in_plans=plans, recent_targets=recent)
    if not p.types:
        raise ProvisioningError("no instance type can meet the SLO")
    return p, forecast


def _num(v: Any, where: str, lo: float | None = None, strict: bool = False) -> float:
    """``agent.validation.number``'s check (finite, within ``lo``), as a
    ``ProvisioningError`` naming ``where``."""
    try:
        return float(number(lo, strict_lo=strict, finite=True)(v))
    except ValueError as exc:
        raise ProvisioningError(f"{where}: {exc}") from None


def random_cases(n: int, steps: int = 8) -> Iterator[tuple[list[InstanceType], list[float]]]:
    """``n`` seeded small problems (2-3 instance types, a noisy periodic demand of
    ``steps`` steps) for comparing the greedy with the exhaustive search."""
    import numpy as np

    for seed in range(n):
        rng = np.random.default_rng(seed)
        types = [InstanceType(f"t{i}", float(rng.uniform(0.1, 1.0)),
                              float(rng.uniform(20, 100)), float(rng.uniform(30, 300)))
                 for i in range(int(rng.integers(2, 4)))]
        base = rng.uniform(50, 200)
        demand = [float(max(0.0, base * (1 + 0.5 * np.sin(k / 2 + rng.uniform(0, 6)))
                            + rng.normal(0, 10))) for k in range(steps)]
        yield types, demand
