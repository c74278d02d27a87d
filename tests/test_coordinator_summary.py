"""The planner's summary of a report (agent/coordinator/summary.py): what it keeps is
what the planner reads, for reports the agent sends and for odd but valid ones."""

import copy
import random

from agent.coordinator.planner import Planner
from agent.coordinator.summary import expand, summarize
from agent.wire import latency_at, latency_points, parse_report

REPORT = {"node_type": "c5.large",
          "capacity": {"cores": 8, "cpu_memory_bytes": 2 ** 31,
                       "gpus": [{"device": "cuda:0", "memory_bytes": 2 ** 33}]},
          "models": {"a": {"device": "cpu", "resident": True, "size_bytes": 1e8,
                           "arrivals": [[1.0, 5.0, 10]], "state": "ready",
                           "batches": {"1": {"count": 100, "seconds": 2.0},
                                       "4": {"count": 10, "seconds": 0.5}},
                           "latency_ms": {"p50": 10.0, "p99": 40.0, "p99.9": None}},
                     "b": {"device": "cuda:0", "resident": False},
                     "c": {}}}


def _planner_view(report):
    """What the planner reads of a NodeReport."""
    return (report.capacity.cores, report.capacity.cpu_memory_bytes,
            report.node_type,
            {name: (m.device, m.resident, m.size_bytes, m.busy_seconds_per_request(),
                    {q: latency_at(latency_points(m.latency_ms), q) for q in (1.0, 50.0, 90.0, 99.0, 99.99)})
             for name, m in report.models.items()})


def test_expand_gives_the_planner_what_the_report_said():
    report = parse_report("n1", REPORT)
    assert _planner_view(expand(summarize(report))) == _planner_view(report)
    assert len(summarize(report)) < len(str(REPORT))


def test_summary_round_trips_random_valid_reports():
    rng = random.Random(3)
    for i in range(300):
        body = copy.deepcopy(REPORT)
        body["capacity"]["cores"] = rng.choice([0.5, 1, 64, 1e6])
        body.pop("node_type") if rng.random() < 0.3 else None
        for j in range(rng.randint(0, 6)):
            body["models"][f"m{j}"] = {
                "device": rng.choice(["cpu", "cuda:1"]), "resident": rng.random() < 0.5,
                "size_bytes": rng.choice([0, 1, 2 ** 40, 123.5]),
                "batches": {str(b): {"count": rng.randint(0, 10 ** 6),
                                     "seconds": rng.uniform(0, 1e4)}
                            for b in rng.sample(range(1, 1025), rng.randint(0, 3))},
                "latency_ms": {f"p{q}": rng.uniform(0, 1e4)
                               for q in rng.sample([50, 90, 99, 99.9], rng.randint(0, 4))}}
        report = parse_report(f"n{i}", body)
        assert _planner_view(expand(summarize(report))) == _planner_view(report)


def test_planner_uses_the_summary_and_falls_back_to_the_report(tmp_path):
    from agent.coordinator.config import CoordinatorConfig
    from agent.coordinator.store import ReportRecord, Store

    store = Store(tmp_path / "c.sqlite3")
    report = parse_report("n1", REPORT)
    store.write_reports([ReportRecord("n1", REPORT, {}, 100.0, summarize(report)),
                         ReportRecord("n2", REPORT, {}, 100.0)])  # no summary: validated
    planner = Planner(store, CoordinatorConfig(), clock=lambda: 110.0)
    live = planner.live_reports(110.0)
    assert sorted(live) == ["n1", "n2"]
    assert _planner_view(live["n1"][1]) == _planner_view(live["n2"][1])
    assert planner.live_reports(110.0, since=101.0) == {}
    assert planner.live_reports(100.0 + 61.0) == {}  # past node_timeout_s
