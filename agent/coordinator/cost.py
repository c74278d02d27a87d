"""What the coordinator costs, for ``/metrics``: its CPU by part (its own process, its
report workers, its planning process) against the reports it answered and the nodes
it kept, so that an operator reads how many nodes it holds (docs/coordinator.md, "How
many nodes one coordinator holds") from the running service, not from a benchmark.

Every process's CPU is kept by pid as last told (a worker started again is a new pid,
and the old one's CPU stays counted): the totals only grow. ``sample`` (every
``SAMPLE_S``) adds the live nodes' seconds and keeps the last ``WINDOW_S`` of samples,
over which the two ratios are taken:

* CPU per report: the coordinator's and its report workers' CPU per report or lease
  answered (idle costs included, as a fleet pays them);
* CPU per node-second: every part's CPU (planning too) per live node and second, that
  is the cores one node costs: 1 / it is the nodes one core holds.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

SAMPLE_S = 5.0
WINDOW_S = 60.0
#: The parts of the coordinator whose CPU is counted; the first two answer reports.
PARTS = ("main", "report_workers", "planner")


class _Sample(NamedTuple):
    at: float
    report_cpu: float  # main + report workers
    all_cpu: float
    answered: int
    node_seconds: float


class CostMeter:
    """CPU and reports as told (``cpu``, ``tally``), sampled into ratios (``sample``)."""

    def __init__(self) -> None:
        self._cpu: dict[tuple[str, int], float] = {}  # (part, pid) -> CPU seconds
        self._tally: dict[int, tuple[int, int, int]] = {}  # pid -> (answered, refused,
        # leases)
        self.node_seconds = 0.0
        self.live_nodes = 0
        self._samples: deque[_Sample] = deque()

    def cpu(self, part: str, pid: int, seconds: float) -> None:
        """Process ``pid`` (of ``part``) has used ``seconds`` of CPU since it started."""
        self._cpu[(part, pid)] = seconds

    def tally(self, pid: int, answered: int, refused: int, leases: int = 0) -> None:
        """Process ``pid`` has answered and refused that many reports (and renewed that
        many leases) since it started."""
        self._tally[pid] = (answered, refused, leases)

    def cpu_total(self, part: str) -> float:
        return sum(s for (p, _), s in self._cpu.items() if p == part)

    def reports(self) -> tuple[int, int]:
        """(answered, refused) by every process."""
        return (sum(a for a, _, _ in self._tally.values()),
                sum(r for _, r, _ in self._tally.values()))

    def leases(self) -> int:
        """Leases renewed by every process."""
        return sum(n for _, _, n in self._tally.values())

    def sample(self, now: float, live_nodes: int) -> None:
        """Now (monotonic seconds) with ``live_nodes`` live: their seconds since the last
        sample are added, and the window moves on."""
        if self._samples:
            self.node_seconds += self.live_nodes * max(0.0, now - self._samples[-1].at)
        self.live_nodes = live_nodes
        report_cpu = self.cpu_total("main") + self.cpu_total("report_workers")
        self._samples.append(_Sample(now, report_cpu, report_cpu + self.cpu_total("planner"),
                                     self.reports()[0] + self.leases(), self.node_seconds))
        while len(self._samples) > 2 and now - self._samples[1].at >= WINDOW_S:
            self._samples.popleft()

    def per_report(self) -> float | None:
        """CPU seconds of the coordinator and its workers per report or lease answered
        in the window (None before two samples, or without either)."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        answered = last.answered - first.answered
        return (last.report_cpu - first.report_cpu) / answered if answered > 0 else None

    def per_node_second(self) -> float | None:
        """CPU seconds of every part per live node-second in the window (None before two
        samples, or without a live node)."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        node_seconds = last.node_seconds - first.node_seconds
        return (last.all_cpu - first.all_cpu) / node_seconds if node_seconds > 0 else None

    def metrics_lines(self, prefix: str, loops: dict[str, tuple[float, float]]
                      ) -> list[str]:
        """Prometheus text: the counters, the live nodes, the two ratios and ``loops``
        (process -> its event loop's smoothed lag and busy share, ``Shedder``'s)."""
        answered, refused = self.reports()
        lines = [f"# HELP {prefix}_cpu_seconds_total CPU time used, by part: main (the "
                 "coordinator's process), report_workers, planner.",
                 f"# TYPE {prefix}_cpu_seconds_total counter"]
        lines += [f'{prefix}_cpu_seconds_total{{part="{part}"}} {self.cpu_total(part):.6f}'
                  for part in PARTS]
        lines += [f"# HELP {prefix}_reports_total Node reports, by answer: answered (200) or "
                  "refused (503 with Retry-After while overloaded).",
                  f"# TYPE {prefix}_reports_total counter",
                  f'{prefix}_reports_total{{answer="answered"}} {answered}',
                  f'{prefix}_reports_total{{answer="refused"}} {refused}',
                  f"# HELP {prefix}_leases_total Node leases renewed (between full "
                  "reports).", f"# TYPE {prefix}_leases_total counter",
                  f"{prefix}_leases_total {self.leases()}",
                  f"# HELP {prefix}_live_nodes Nodes heard from within node_timeout_s.",
                  f"# TYPE {prefix}_live_nodes gauge",
                  f"{prefix}_live_nodes {self.live_nodes}",
                  f"# HELP {prefix}_node_seconds_total Live nodes times seconds.",
                  f"# TYPE {prefix}_node_seconds_total counter",
                  f"{prefix}_node_seconds_total {self.node_seconds:.3f}"]
        for name, value, what in (
                ("cpu_per_report_seconds", self.per_report(),
                 "CPU of the coordinator and its report workers per report or lease "
                 "answered"),
                ("cpu_per_node_second", self.per_node_second(),
                 "CPU of every part per live node and second (cores per node)")):
            if value is not None:
                lines += [f"# HELP {prefix}_{name} {what}, over the last "
                          f"{WINDOW_S:g} s.", f"# TYPE {prefix}_{name} gauge",
                          f"{prefix}_{name} {value:.9f}"]
        lines += [f"# HELP {prefix}_loop_lag_seconds How late each process's event loop "
                  "runs (smoothed); reports are refused past report_shed_lag_ms while it "
                  "is saturated.", f"# TYPE {prefix}_loop_lag_seconds gauge"]
        lines += [f'{prefix}_loop_lag_seconds{{process="{process}"}} {lag:.6f}'
                  for process, (lag, _) in sorted(loops.items())]
        lines += [f"# HELP {prefix}_loop_busy_ratio The share of time each process's event "
                  "loop had work, on a CPU or waiting for one (smoothed; saturated from "
                  "0.9).", f"# TYPE {prefix}_loop_busy_ratio gauge"]
        lines += [f'{prefix}_loop_busy_ratio{{process="{process}"}} {busy:.4f}'
                  for process, (_, busy) in sorted(loops.items())]
        return lines
