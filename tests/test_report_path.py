"""The coordinator's report path at fleet scale (issue 16): one parser, msgspec's decoder
over the wire declaration (agent.wire), whose refusals the declaration's own checks
explain field by field (the same verdict, and the field named), and the fleet in memory
stays small for the garbage collector (a full collection walks every tracked object on
the event loop)."""

from __future__ import annotations

import gc
import random

import msgspec
import orjson

import agent.wire as wire
from agent.coordinator.ingest import Fleet, report_record, reported_models
from agent.schema import explain
from agent.validation import load_json


def _model(rng: random.Random) -> dict:
    p50 = round(rng.uniform(5, 30), 3)
    return {"device": rng.choice(["cpu", "cuda:0"]), "state": "ready",
            "resident": rng.random() < 0.5, "pinned": False,
            "size_bytes": rng.randint(1, 50) * 1_000_000, "load_seconds": 0.2,
            "workers": rng.choice([None, 1, 2]), "arrivals": [[0.002, 5.0, rng.randint(0, 99)]],
            "requests": float(rng.randint(0, 200)), "drops": 0,
            "batches": {"1": {"count": 100, "seconds": 1.5}, "4": {"count": 7, "seconds": 0.2}},
            "batch_ms": {"1": p50, "4": p50 * 2},
            "latency_ms": {"p50": p50, "p90": None, "p99": p50 * 2, "p99.9": p50 * 3}}


def _report(rng: random.Random) -> dict:
    return {"capacity": {"cores": 8, "cpu_memory_bytes": 2**34, "gpus": []},
            "interval_s": 5.0, "models": {f"m{j}": _model(rng) for j in range(5)}}


_VALUES = [None, True, False, -1, 0, 1, 1.5, float("nan"), float("inf"), -0.0, 1e300,
           10**30, "x", "", [], {}, [1, 2, 3], [1.0, 0, 1.0], {"count": 1},
           {"count": 1, "seconds": 2}, {"count": 1, "x": 2}, {"count": True, "seconds": 1}]
_KEYS = ["1", "0", "01", "2048", "1024", " 1", "p50", "p50.0", "p0", "p100", "p99.9",
         "p99.99999", "P50", 1]
_FIELDS = ["device", "resident", "pinned", "size_bytes", "load_seconds", "workers",
           "arrivals", "batches", "batch_ms", "latency_ms", "requests", "drops", "state",
           "unknown"]


def _mutate(rng: random.Random, report: dict) -> str:
    """Break (or not) one model of ``report``; its name."""
    name = rng.choice(list(report["models"]))
    model = report["models"][name]
    field, r = rng.choice(_FIELDS), rng.random()
    if r < 0.4:
        model[field] = rng.choice(_VALUES)
    elif r < 0.6:
        model[rng.choice(["batches", "batch_ms", "latency_ms"])] = {
            rng.choice(_KEYS): rng.choice(_VALUES)}
    elif r < 0.8:
        model["arrivals"] = [[rng.choice(_VALUES) if rng.random() < 0.3 else 1.0
                              for _ in range(rng.choice([2, 3, 3, 4]))]]
    elif r < 0.9:
        model["arrivals"] = [[0.0, 1e-9, 1e6]]  # over MAX_RATE
    else:
        model["batches"] = {"1": {"count": rng.choice(_VALUES),
                                  "seconds": rng.choice(_VALUES)}}
    return name


def test_the_decoder_and_the_declarations_checks_agree() -> None:
    """Reports as agents send them and broken ones: msgspec's decoder and the
    declaration's checks (``schema.explain``, which words the errors) accept the same
    ones, and a refusal names the broken model's field, never msgspec's ``[...]``."""
    rng = random.Random(16)
    accepted = refused = 0
    for i in range(3000):
        body = _report(rng)
        name = _mutate(rng, body) if i % 4 else None  # a quarter left as agents send them
        raw = msgspec.json.encode(body)  # (nan and inf as null, as JSON can hold them)
        found = explain(wire.NodeReport, load_json(raw))
        try:
            wire.parse_report("node-1", raw)
        except wire.ReportError as exc:
            refused += 1
            assert found is not None and (exc.key, exc.message) == (found.key, found.message)
            assert exc.key.startswith(f"models.{name}"), (exc.key, body["models"][name])
            assert "[...]" not in str(exc)
        else:
            accepted += 1
            assert found is None, (found, body)
    assert accepted > 700 and refused > 700  # both sides exercised


def test_parse_report_takes_text_bytes_or_data() -> None:
    body = _report(random.Random(5))
    raw = orjson.dumps(body)
    report = wire.parse_report("n", raw)
    assert wire.parse_report("n", raw.decode()) == report == wire.parse_report("n", body)
    assert report.models["m0"].arrivals[0].seconds == 5.0
    assert report.capacity == wire.NodeCapacity(cores=8, cpu_memory_bytes=2.0 ** 34)


def test_fleet_keeps_few_objects_per_node() -> None:
    """10,000 nodes' last reports add a few GC-tracked objects per node, not their
    parsed JSON (which would be ~60 per node: a full collection of seconds)."""
    rng = random.Random(3)
    bodies = [orjson.dumps(_report(rng)) for _ in range(50)]
    fleet = Fleet(ttl_s=60.0)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(10_000):
        raw = bodies[i % 50]
        report = wire.parse_report(f"node-{i}", orjson.loads(raw))
        fleet.record(f"node-{i}", raw, reported_models(report), float(i))
    gc.collect()
    assert len(gc.get_objects()) - before < 3 * 10_000
    row = fleet.nodes["node-7"].row
    assert row.report == orjson.loads(bodies[7]) and row.last_seen == 7.0
    assert [name for name, _ in fleet.nodes["node-7"].models] == [f"m{j}" for j in range(5)]


def test_a_queued_record_is_one_object_for_the_collector() -> None:
    """The records waiting for the group commit (thousands a second) are one new
    object each for the collector's young generation (the record; its arrival points
    as JSON bytes), not a dict and a tuple per model and point (~12 each here, which
    filled the young generation and were walked while they waited); the store still
    reads their points."""
    rng = random.Random(4)
    bodies = [orjson.dumps(_report(rng)) for _ in range(50)]
    reports = [wire.parse_report("n", orjson.loads(b)) for b in bodies]
    assert sum(len(m.arrivals) for r in reports for m in r.models.values()) > 50
    gc.collect()
    gc.disable()  # gc.get_count()[0]: tracked objects allocated and still alive
    try:
        young = gc.get_count()[0]
        records = [report_record(f"node-{i}", bodies[i % 50], reports[i % 50], 1000.0 + i)
                   for i in range(10_000)]
        assert gc.get_count()[0] - young < 1.1 * 10_000
    finally:
        gc.enable()
    points = orjson.loads(records[7].arrivals)
    model = next(m for m, r in reports[7].models.items() if r.arrivals)
    arrival = reports[7].models[model].arrivals[0]
    assert points[model][0] == [1007.0 - arrival.age_s, arrival.seconds, arrival.count]
