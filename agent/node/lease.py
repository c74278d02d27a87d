"""Lease or full report: what a node sends its coordinator each interval (``agent.wire``,
"Leases"), and the last full report's figures it measures changes against.

Each interval the reporter builds its report as before; ``LeaseKeeper.due`` says whether
to send it (and why) or to renew the lease instead. A full report goes when:

* the coordinator does not take leases: the node's first message is a lease naming no
  report, which such a coordinator answers ``{"report": true}``; an older one refuses
  the path, and gets a plain full report every interval, as before (a lease is tried
  again every ``full_report_s``: it may have been upgraded);
* the coordinator asks for one (``{"report": true}``: it restarted, or the lease
  reached a process that never saw the last full report);
* ``full_report_s`` passed since the last one (the arrivals queued since go with it);
* a rollout watches the node's versions (the report carries ``version_stats``,
  ``agent.node.coordinatorversions``): its waves and gates read every interval's;
* something the planner uses changed: capacity, node type, where peers reach the node,
  the models it serves, their device or residency, a model's size by more than the
  threshold, what it holds on disk or is pulling;
* a model's traffic changed beyond the threshold: its arrivals or its 503s over the
  last ``WINDOW_S`` against the rate the last full report gave. A count changes when
  it moved by more than ``threshold`` of what that rate predicts *and* by more than
  ``Z`` standard deviations of Poisson noise around it (a steady node's counts wander
  by about their square root: a relative test alone would fire on every quiet model,
  a noise test alone on every busy one);
* a model's latency changed: a percentile of the window (p50 to p99, each once the
  window holds 10 answers beyond it, so p99 after 1,000) moved by more than twice the
  threshold from the last full report's (latency percentiles from histogram buckets
  are coarser than counts).

Routed traffic rides with the full reports: a request forwarded elsewhere still counts
in the arrivals of the node it reached (what the planner sums), so a change in it is a
change in those. A full report carries each model's ``rate`` over the window (what the
coordinator extrapolates until the next one) and a fresh ``report_id``, which the
leases after it name.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, Callable

from agent.wire import Directives

WINDOW_S = 60.0  # the window a model's traffic and latency are compared over
Z = 4.0  # standard deviations of Poisson noise a count's change must also exceed
LATENCY_FACTOR = 2.0  # a latency percentile changes past this many thresholds
PERCENTILES = (50.0, 90.0, 95.0, 99.0)
MAX_REPORT_ID = 2 ** 53


def _merged(window: deque) -> list[tuple[float, float]]:
    """The window's latency buckets summed: cumulative ``(le, count)`` by bound."""
    total: dict[float, float] = {}
    for _, _, _, _, buckets in window:
        for le, count in buckets:
            total[le] = total.get(le, 0.0) + count
    return sorted(total.items())


class Traffic:
    """One model's intervals over the last ``WINDOW_S``: seconds, arrivals, 503s and
    latency buckets; and what the last full report said of them."""

    def __init__(self) -> None:
        self.window: deque = deque()  # (end, seconds, arrivals, drops, buckets)
        self.reference: tuple[float, float, dict[float, float]] | None = None

    def add(self, end: float, seconds: float, arrivals: float, drops: float,
            buckets: list[tuple[float, float]]) -> None:
        self.window.append((end, seconds, arrivals, drops, buckets))
        while self.window and self.window[0][0] - self.window[0][1] < end - WINDOW_S - 1e-9:
            self.window.popleft()

    def totals(self) -> tuple[float, float, float]:
        """(seconds, arrivals, 503s) over the window."""
        return (sum(w[1] for w in self.window), sum(w[2] for w in self.window),
                sum(w[3] for w in self.window))

    def rate(self) -> float:
        seconds, arrivals, _ = self.totals()
        return arrivals / seconds if seconds > 0 else 0.0

    def percentiles(self, quantile: Callable) -> dict[float, float]:
        """Each of ``PERCENTILES`` the window has enough answers for: 10 beyond it."""
        buckets = _merged(self.window)
        answers = buckets[-1][1] if buckets else 0.0
        out = {}
        for p in PERCENTILES:
            if answers * (1.0 - p / 100.0) >= 10.0:
                value = quantile(p / 100.0, buckets)
                if value is not None:
                    out[p] = value
        return out

    def mark(self, quantile: Callable) -> None:
        """The window now is what the coordinator was told."""
        seconds, arrivals, drops = self.totals()
        self.reference = (arrivals / seconds if seconds > 0 else 0.0,
                          drops / seconds if seconds > 0 else 0.0,
                          self.percentiles(quantile))

    def change(self, threshold: float, quantile: Callable) -> str | None:
        """What changed beyond ``threshold`` since ``mark`` (None: nothing)."""
        if self.reference is None:
            return "new traffic" if self.totals()[1] > 0 else None
        seconds, arrivals, drops = self.totals()
        rate, drop_rate, latency = self.reference
        for what, count, expected in (("arrivals", arrivals, rate * seconds),
                                      ("503s", drops, drop_rate * seconds)):
            moved = abs(count - expected)
            if moved > threshold * max(expected, 1.0) and moved > Z * math.sqrt(
                    max(expected, 1.0)):
                return f"{what} {count:g} in {seconds:g} s, {expected:.1f} expected"
        for p, value in self.percentiles(quantile).items():
            before = latency.get(p)
            if before is not None and abs(value - before) > LATENCY_FACTOR * threshold * \
                    max(before, 1e-3):
                return f"p{p:g} latency {value * 1000:.1f} ms, was {before * 1000:.1f} ms"
        return None


def planner_facts(report: dict[str, Any]) -> dict[str, Any]:
    """What a report body says that the planner or the directives use, beside traffic
    and sizes: compared whole between two reports."""
    def held(key: str) -> frozenset:
        return frozenset((h["model"], h["version"]) for h in report.get(key) or ())

    return {"capacity": repr(report.get("capacity")), "node type": report.get("node_type"),
            "address": repr(report.get("peer")), "disk": held("disk"),
            "pulling": held("pulling"),
            "models": {name: (m.get("device"), m.get("resident"))
                       for name, m in (report.get("models") or {}).items()}}


class LeaseKeeper:
    """Whether each interval's report goes in full or a lease goes instead, and the
    lease's body; see the module docstring. Times from the caller's clock."""

    def __init__(self, full_report_s: float, threshold: float, *,
                 quantile: Callable, rng: Callable[[], float] = random.random) -> None:
        self.full_report_s, self.threshold = full_report_s, threshold
        self.quantile, self.rng = quantile, rng
        self.traffic: dict[str, Traffic] = {}
        #: whether the coordinator takes leases (None: not known yet, ask with a lease)
        self.supported: bool | None = None
        self.refused_at: float | None = None  # when a lease was last refused
        self.asked = False  # it asked for a full report
        self.report_id: int | None = None  # of the last full report answered
        self.facts: dict[str, Any] | None = None
        self.sizes: dict[str, float] = {}
        self.reported_at: float | None = None
        self.reason: str | None = None  # why the last full report went
        self.leases = self.full_reports = 0

    def observe(self, model: str, end: float, seconds: float, arrivals: float,
                drops: float, buckets: list[tuple[float, float]]) -> None:
        """One interval of ``model``'s traffic (each interval, lease or not)."""
        self.traffic.setdefault(model, Traffic()).add(end, seconds, arrivals, drops, buckets)

    def due(self, report: dict[str, Any], now: float) -> str | None:
        """Why ``report`` must go in full now; None: renew the lease instead."""
        if self.supported is None:
            return None  # a lease asks
        if not self.supported:
            if self.refused_at is not None and now - self.refused_at >= self.full_report_s:
                return None  # ask again
            return "coordinator without leases"
        if self.asked or self.report_id is None or self.facts is None:
            return "asked by the coordinator"
        if self.reported_at is None or now - self.reported_at >= self.full_report_s:
            return f"every {self.full_report_s:g} s"
        if report.get("version_stats"):
            return "a rollout under way"  # its gates read every interval's figures
        facts = planner_facts(report)
        for key, value in facts.items():
            if value != self.facts.get(key):
                return f"{key} changed"
        for name, m in (report.get("models") or {}).items():
            size, before = m.get("size_bytes") or 0.0, self.sizes.get(name) or 0.0
            if abs(size - before) > self.threshold * max(before, 1.0):
                return f"{name}: size {size:g} bytes, was {before:g}"
        for name, traffic in sorted(self.traffic.items()):
            change = traffic.change(self.threshold, self.quantile)
            if change is not None:
                return f"{name}: {change}"
        return None

    def refused(self, now: float) -> None:
        """The coordinator refused a lease (it does not know the path)."""
        self.supported, self.refused_at = False, now

    def answered(self, asked: bool) -> None:
        """The coordinator answered a lease (``asked``: with ``{"report": true}``)."""
        self.supported, self.asked = True, asked
        if not asked:
            self.leases += 1

    def prepare(self, report: dict[str, Any]) -> dict[str, Any]:
        """``report`` ready to go in full: to a coordinator that takes leases, with a
        fresh ``report_id`` and each model's rate."""
        if not self.supported:
            return report
        report["report_id"] = int(self.rng() * MAX_REPORT_ID)
        routed = (report.get("routing") or {}).get("models") or {}
        for where in (report.get("models") or {}, routed):
            for name, m in where.items():
                traffic = self.traffic.get(name)
                if traffic is not None and (where is not routed or "arrivals" in m):
                    m["rate"] = round(traffic.rate(), 6)
        return report

    def reported(self, report: dict[str, Any], answer: Directives, now: float,
                 reason: str) -> None:
        """``report`` (prepared) was answered with ``answer``: the reference from now."""
        if "report_id" in report and answer.answer is None:
            self.supported = None  # an answer without a version: ask again
        self.asked = False
        self.report_id, self.reported_at, self.reason = report.get("report_id"), now, reason
        self.facts = planner_facts(report)
        self.sizes = {n: m.get("size_bytes") or 0.0
                      for n, m in (report.get("models") or {}).items()}
        for name, traffic in list(self.traffic.items()):
            if traffic.window and traffic.window[-1][0] < now - WINDOW_S:
                del self.traffic[name]  # a model gone quiet from the repository
            else:
                traffic.mark(self.quantile)
        self.full_reports += 1

    def lease(self, held: Directives | None, routing_version: int | None) -> dict[str, Any]:
        """The lease's body: the last full report's id, the answer and table held."""
        body: dict[str, Any] = {}
        if self.report_id is not None and self.supported:
            body["report"] = self.report_id
        if held is not None and held.answer is not None:
            body["answer"] = held.answer
        if routing_version is not None:
            body["routing"] = routing_version
        return body

    def status(self, now: float) -> dict[str, Any]:
        return {"leases": self.supported, "leases_renewed": self.leases,
                "full_reports": self.full_reports,
                "last_full_report_s_ago": None if self.reported_at is None
                else round(now - self.reported_at, 3),
                "last_full_report_reason": self.reason}
