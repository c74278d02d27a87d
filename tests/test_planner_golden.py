"""The planner's output pinned on a seeded fleet: a long-term plan, a second one placing
against it, a reactive rescale and a plan after a sourced model left the catalog, each
compared with ``tests/planner_golden.json`` (replicas, rates, placement, moves,
exclusions, addresses, every node's directive row). The file was written by the planner
as it was before its read of the fleet was made cheaper for 100,000 nodes, so a change
that alters any plan for the same input fails here. ``EDGEAGENT_WRITE_GOLDEN=1`` writes
the file again (only for a change meant to alter plans)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import orjson

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.ingest import report_record
from agent.coordinator.store import ReportRecord
from agent.wire import parse_report

GOLDEN = Path(__file__).with_name("planner_golden.json")
MODELS = 40
SOURCED = {"m35", "m36", "m37", "m38"}  # catalogued with a source: placeable anywhere
GPU = {"m5", "m6"}  # reported on a GPU device: no CPU memory
STEP = 5.0


def model_body(rng: random.Random, name: str, dt: float, rate: float | None,
               p99: float | None = None) -> dict:
    requests = float(rng.randint(0, 300))
    p50 = round(rng.uniform(5, 40), 3)
    body = {"device": "cuda:0" if name in GPU else "cpu",
            "resident": rng.random() < 0.8, "size_bytes": rng.randint(1, 400) * 1_000_000,
            "arrivals": [[0.001, dt, requests]], "requests": requests,
            "batches": {"1": {"count": rng.randint(0, 5000), "seconds": rng.uniform(0, 60)},
                        "4": {"count": rng.randint(0, 500), "seconds": rng.uniform(0, 20)}},
            "latency_ms": {"p50": p50, "p99": p99 if p99 is not None else round(p50 * 2, 3)}}
    if rate is not None:
        body["rate"] = rate if rate >= 0 else requests / dt
    return body


def node_body(rng: random.Random, i: int, dt: float, leasing: bool,
              hot: str | None = None) -> dict:
    names = rng.sample([f"m{k}" for k in range(MODELS - 6)], rng.randint(1, 6))
    body: dict = {"capacity": {"cores": rng.choice([2, 4, 8]),
                               "cpu_memory_bytes": rng.choice([1, 2, 4]) * 2**30},
                  "models": {m: model_body(rng, m, dt, -1 if leasing else None,
                                           5000.0 if m == hot else None) for m in names}}
    if i % 2 == 0:
        body["peer"] = {"url": f"http://10.0.{i // 250}.{i % 250}:8000",
                        "grpc": f"10.0.{i // 250}.{i % 250}:8001"}
    if i % 5 == 0:
        body["disk"] = [{"model": rng.choice(sorted(SOURCED)), "version": 1, "bytes": 1e6}]
    if i % 7 == 0:
        body["pulling"] = [{"model": rng.choice(sorted(SOURCED)), "version": 2}]
    if i % 9 == 0:  # forwards a model it does not serve
        routed = rng.choice(sorted(SOURCED))
        body["routing"] = {"version": 3, "models": {routed: {
            "forwarded": 5.0, "arrivals": [[0.001, dt, 40.0]],
            "latency_ms": {"p99": 30.0}, **({"rate": 4.0} if leasing else {})}}}
    if leasing:
        body["report_id"] = 1000 + i
    return body


def write_fleet(store, rng: random.Random, nodes: int, now: float, *,
                hot: str | None = None) -> None:
    """Every node's report at ``now`` (some a little older), as ingestion writes them;
    every fourth without a summary (an old row: the planner validates its report)."""
    records = []
    for i in range(nodes):
        name = f"node-{i:03d}"
        body = node_body(rng, i, STEP, leasing=i % 3 != 0, hot=hot)
        raw = json.dumps(body).encode()
        at = now - rng.uniform(0, 20)
        record = report_record(name, raw, parse_report(name, raw), at)
        records.append(record if i % 4 else record._replace(summary=None))
    store.write_reports(records, {f"node-{i:03d}": now for i in range(0, nodes, 2)})


def history(store, now: float) -> None:
    store.write_reports([ReportRecord("gone", b'{"capacity": {"cores": 1, '
                                      b'"cpu_memory_bytes": 1}}', {
        f"m{k}": [(now - 200 + t, STEP, float((k * 7 + t) % 50) * (40 if k < 3 else 1))
                  for t in range(0, 200, 5)] for k in range(MODELS)}, now - 500)])


def summary(stored) -> dict:
    plan = stored.plan
    return {"kind": plan["kind"],
            "models": {m: {k: (round(v, 9) if isinstance(v, float) else v)
                           for k, v in row.items()
                           if k in ("replicas", "rate", "proc_ms", "placement", "unplaced",
                                    "proc_source", "source", "rate_points")}
                       for m, row in plan["models"].items()},
            "assignment": plan["assignment"], "moves": plan["moves"],
            "excluded": plan["excluded"], "retired": plan["retired"],
            "addresses": plan["addresses"],
            "capacity": plan["capacity"],
            "rows": {n: orjson.loads(r) for n, r in sorted(stored.rows.items())}}


def test_plans_match_the_golden_file(planner_setup):
    store, planner, clock = planner_setup
    # the fleet's stored times are its leases' own (every lease written, as when the
    # file was made), not times up to lease_write_s behind them
    planner.config = planner.config.with_overrides(lease_write_s=0.0)
    rng = random.Random(36)
    clock.t = 10_000.0
    for k in range(MODELS):
        name = f"m{k}"
        store.put_model(ModelSLO(
            name, slo_ms=rng.choice([50.0, 100.0, 200.0]), priority=rng.choice([1.0, 2.0]),
            cpu_per_replica=rng.choice([0.5, 1.0]),
            # m1 and m2: a replica needs more memory than most nodes have (unplaced)
            memory_per_replica_bytes=1.5e9 if k in (1, 2) else rng.choice([0.0, 5e6]),
            proc_ms=rng.choice([None, 8.0]),
            source=f"s3://models/{name}" if name in SOURCED else None,
            version=1 if name in SOURCED else None), 0)
    history(store, clock.t)
    write_fleet(store, rng, 300, clock.t)
    plans = [planner.plan_now("long-term")]
    clock.t += 30
    write_fleet(store, rng, 280, clock.t)  # 20 nodes fall silent by the next plans
    plans.append(planner.plan_now("long-term"))
    for _ in range(3):  # m3's latency far past its SLO: the reactive loop adds a replica
        clock.t += 10
        write_fleet(store, random.Random(7), 280, clock.t, hot="m3")
        reactive = planner.reactive_tick()
    assert reactive is not None and reactive.kind == "reactive"
    plans.append(reactive)
    store.delete_model("m36")
    clock.t += 10
    plans.append(planner.plan_now("manual"))
    got = [summary(p) for p in plans]
    if os.environ.get("EDGEAGENT_WRITE_GOLDEN"):
        GOLDEN.write_text("[\n" + ",\n".join(json.dumps(p, sort_keys=True, separators=(",", ":"))
                                             for p in got) + "\n]\n")
    want = json.loads(GOLDEN.read_text())
    assert [p["kind"] for p in got] == ["long-term", "long-term", "reactive", "manual"]
    assert got[3]["retired"] == ["m36"] and got[0]["moves"]["started"] > 0
    assert sum(m["unplaced"] for m in got[0]["models"].values()) > 0  # the fleet is short
    for k, (g, w) in enumerate(zip(got, want)):
        for key in w:
            assert g[key] == w[key], f"plan {k}: {key} differs from the golden file"
    assert len(got) == len(want)
