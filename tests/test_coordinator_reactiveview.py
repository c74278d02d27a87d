"""The reactive check's kept view (``agent.coordinator.reactiveview``) decides exactly as
reading and decoding every live node's row at every check did, on SQLite and a real
PostgreSQL (tests/pgcluster.py)."""

from __future__ import annotations

import math
import random

import orjson
import pytest

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.fleetview import heard_until
from agent.coordinator.ingest import report_record
from agent.coordinator.planner import REACTIVE_SLACK_S, Planner
from agent.coordinator.stores import open_store
from agent.coordinator.summary import decoded_latency, renews_leases, report_latency, \
    summarize
from agent.wire import latency_at, latency_points, parse_report
from tests.helpers import Clock, churn, feed

MODELS = {"a": 99.0, "b": 95.0, "c": 50.0, "d": 99.9}  # model -> its SLO percentile


@pytest.fixture(params=["sqlite", "postgresql"])
def store_path(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "state" / "co.sqlite3"
    return request.getfixturevalue("postgres").new_database()


class Reference:
    """The check as it was: every live row read, its summary decoded where the node's
    heard time or latency is needed, the worst latency over every pair."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config, self.after, self.mark = config, {}, -math.inf

    def tick(self, store, now: float, percentiles: dict[str, float]
             ) -> tuple[dict[str, float], dict[str, float]] | None:
        """(node -> heard time of the nodes heard from, model -> worst latency)."""
        timeout, lag = self.config.node_timeout_s, self.config.lease_lag_s
        recent, heard = [], {}
        for name, seen, summary, raw, _ in store.live_nodes(
                max(now - timeout - 1.0, self.mark - REACTIVE_SLACK_S)):
            last = self.after.get(name, -math.inf)
            t = seen
            if not (seen > last or not lag or seen >= now) and renews_leases(orjson.loads(
                    summary if summary is not None
                    else summarize(parse_report(name, raw)))):
                t = heard_until(seen, now, lag)
            if now - seen <= timeout and t > last:
                recent.append((name, seen, summary, raw))
                heard[name] = t
        if not recent:
            return None
        self.after.update(heard)
        self.mark = max(self.mark, max(row[1] for row in recent))
        worst: dict[str, float] = {}
        for name, _, summary, raw in recent:
            for model, latency_ms in (
                    decoded_latency(orjson.loads(summary)) if summary is not None
                    else report_latency(parse_report(name, raw))):
                if model in percentiles and (v := latency_at(
                        latency_points(latency_ms), percentiles[model])) is not None \
                        and v > worst.get(model, -math.inf):
                    worst[model] = v
        return heard, worst


def body(rng: random.Random, leases: bool) -> dict:
    """A node's full report: some of the models with random latencies, sometimes a
    model it forwards (its latency measured at the client)."""
    models = {}
    for m in rng.sample(sorted(MODELS), rng.randint(1, 3)):
        latency = {q: round(rng.uniform(5, 400), 1) for q in ("p50", "p95", "p99")
                   if rng.random() < 0.8}
        models[m] = {"latency_ms": latency, "rate": 1.0}
    out = {"capacity": {"cores": 4, "cpu_memory_bytes": 1e9}, "models": models}
    if rng.random() < 0.3:
        forwarded = rng.choice(sorted(MODELS))
        out["routing"] = {"models": {forwarded: {"latency_ms": {
            "p99": round(rng.uniform(5, 600), 1)}, "forwarded": 3}}}
    if leases:
        out["report_id"] = rng.randint(1, 10**6)
    return out


def test_the_kept_view_decides_as_reading_every_row(store_path, tmp_path):
    """40 nodes over 12 checks 10 s apart: some send new full reports (latencies
    change), some only renew leases, some go silent (and time out), some are deleted
    and come back; some are stored without a summary. Each check hears the same nodes
    at the same times and finds the same worst latency per model as the reference, and
    the view keeps no node that is not live."""
    rng = random.Random(36)
    clock = Clock(1000.0)
    config = CoordinatorConfig(state_dir=tmp_path, rate_step_s=5, history_s=120,
                               plan_window_s=30, node_timeout_s=40, lease_write_s=10,
                               reactive_patience=2)
    store = open_store(store_path, rate_step_s=5)
    for m, p in MODELS.items():
        store.put_model(ModelSLO(m, slo_ms=100, percentile=p), 0)
    feed(store, clock, "seed", {m: 5.0 for m in MODELS},
         {m: {"batches": {"1": {"count": 100, "seconds": 1.0}}} for m in MODELS}, cores=16)
    planner = Planner(store, config, clock=clock)
    planner.plan_now()
    seen_worst, view_worst = [], planner._reactive_view.worst

    def worst(*args):  # what each check found, recorded
        seen_worst.append(view_worst(*args))
        return seen_worst[-1]

    planner._reactive_view.worst = worst
    reference = Reference(config)
    nodes = [f"n{i:02d}" for i in range(40)]
    leases = {n: rng.random() < 0.7 for n in nodes}
    heard_any = 0
    for tick in range(12):
        churn(store, rng, nodes, clock.t, lambda node: body(rng, leases[node]),
              report=0.3, renew=0.75, delete=0.8, first=tick == 0)
        clock.t += 10.0
        if tick == 6:  # the plan's percentiles change: kept values are worked out again
            for m in MODELS:
                store.put_model(ModelSLO(m, slo_ms=100, percentile=50.0), 0)
            planner.plan_now()
        percentiles = {m: m_plan.percentile
                       for m, m_plan in planner.current_plan().parsed.models.items()}
        want = reference.tick(store, clock.t, percentiles)
        before = len(seen_worst)
        planner.reactive_tick()
        if want is None:
            assert len(seen_worst) == before, tick
            continue
        heard, worst = want
        heard_any += len(heard)
        assert {n: planner._reactive_seen[n] for n in heard} == heard, tick
        assert planner._reactive_seen == reference.after, tick
        assert seen_worst[-1] == worst, tick
        live = {n for n, seen, *_ in store.live_nodes(-math.inf)
                if clock.t - seen <= config.node_timeout_s + 1.0}
        assert set(planner._reactive_view.kept.nodes) <= live, tick
    assert heard_any > 100 and len(seen_worst) >= 10
    store.close()


def test_a_new_full_report_with_another_latency_is_seen_at_the_next_check(tmp_path):
    """A leasing node's p99 goes from under the SLO to over it in a new full report
    (between checks it only renews): the next check counts a violation, each check
    after it (leases alone) too, and the third adds a replica."""
    clock = Clock(1000.0)
    config = CoordinatorConfig(state_dir=tmp_path, rate_step_s=5, history_s=120,
                               plan_window_s=30, node_timeout_s=60, lease_write_s=0,
                               reactive_patience=3)
    store = open_store(config.database, rate_step_s=5)
    store.put_model(ModelSLO("a", slo_ms=100), 0)
    feed(store, clock, "n1", {"a": 10.0}, {"a": {"batches": {"1": {"count": 100,
                                                                   "seconds": 1.0}}}})
    planner = Planner(store, config, clock=clock)
    start = planner.plan_now().plan["models"]["a"]["replicas"]

    def full_report(p99: float) -> None:
        raw = orjson.dumps({"capacity": {"cores": 4, "cpu_memory_bytes": 1e9},
                            "models": {"a": {"latency_ms": {"p99": p99}, "rate": 10.0}},
                            "report_id": 7})
        store.write_reports([report_record("n1", raw, parse_report("n1", raw), clock.t)])

    def check() -> tuple[int, int]:
        clock.t += 5.0
        store.write_reports([], {"n1": clock.t})  # a lease
        clock.t += 5.0
        planner.reactive_tick()
        return planner.reactive["a"].replicas, planner.reactive["a"].violations

    full_report(20.0)
    assert check() == (start, 0) and check() == (start, 0)
    full_report(500.0)
    assert check() == (start, 1)
    assert check() == (start, 2)
    assert check() == (start + 1, 0)
    assert store.current_plan().plan["models"]["a"]["replicas"] == start + 1
    full_report(20.0)
    assert check() == (start + 1, 0)
    store.close()
