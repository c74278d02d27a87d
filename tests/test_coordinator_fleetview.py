"""The plan's view of the fleet (agent/coordinator/fleetview.py) holds what the planner
read before from each node's ``NodeReport`` (``summary.expand`` of its summary, or its
report validated): the same sums in the same order, for random valid reports with odd
routing, rates and holdings, stored with a summary and without; and read from a store
as nodes come, renew, report anew, go silent and are deleted, the kept view
(``FleetReader``) decodes only new reports and equals one read from scratch."""

import math
import random

import orjson
import pytest

from agent.coordinator.fleetview import FleetReader, FleetView, Models, NodeFacts, \
    report_rates
from agent.coordinator.ingest import report_record
from agent.coordinator.stores import open_store
from agent.coordinator.summary import decoded_latency, expand, summarize
from agent.wire import parse_report
from tests.helpers import churn


def random_report(rng: random.Random, i: int) -> dict:
    names = [f"m{k}" for k in range(8)]
    body: dict = {"capacity": {"cores": rng.choice([1, 2.5, 8]),
                               "cpu_memory_bytes": rng.choice([1e9, 2 ** 33])},
                  "models": {}}
    for name in rng.sample(names, rng.randint(0, 5)):
        m = {"device": rng.choice(["cpu", "cpu", "cuda:0"]), "resident": rng.random() < 0.6,
             "size_bytes": rng.choice([0, 1e6, 5e6, 123.5]),
             "batches": {str(b): {"count": rng.randint(0, 10 ** 5),
                                  "seconds": rng.uniform(0, 100)}
                         for b in rng.sample([1, 2, 4, 8], rng.randint(0, 3))},
             "latency_ms": {q: rng.uniform(1, 500)
                            for q in rng.sample(["p50", "p90", "p99", "p99.9"],
                                                rng.randint(0, 4))}}
        if rng.random() < 0.7:
            m["rate"] = rng.uniform(0, 50)
        body["models"][name] = m
    if rng.random() < 0.4:  # forwards models, some of which it also serves
        body["routing"] = {"version": 1, "models": {
            name: {"forwarded": 3.0, **({"rate": rng.uniform(0, 9)} if rng.random() < 0.6
                                        else {}),
                   **({"latency_ms": {"p99": rng.uniform(1, 90)}} if rng.random() < 0.5
                      else {})}
            for name in rng.sample(names, rng.randint(1, 3))}}
    if rng.random() < 0.3:
        body["disk"] = [{"model": rng.choice(names), "version": 1}]
    if rng.random() < 0.3:
        body["pulling"] = [{"model": rng.choice(names)}]
    if rng.random() < 0.5:
        body["peer"] = {"url": f"http://10.0.0.{i}:8000"}
    if rng.random() < 0.7:
        body["report_id"] = i + 1
    return body


def reference(rows, now, lease_lag_s):
    """What the planner computed from each live node's ``NodeReport``, in node order,
    at ``now``: a node that renews leases heard from up to ``lease_lag_s`` after its
    stored time, but not past now."""
    ends, busy, tails, holders, files, peers = {}, {}, {}, {}, {}, {}
    for name, seen, reported, report, leases in rows:
        heard = max(seen, min(now, seen + lease_lag_s)) if leases else seen
        for m, mr in report.models.items():
            ends[m] = min(ends.get(m, heard), heard)
            seconds, done = mr.busy_seconds_per_request()
            total = busy.setdefault(m, [0.0, 0.0])
            total[0], total[1] = total[0] + seconds, total[1] + done
            holders.setdefault(m, {})[name] = (mr.device, mr.resident, mr.size_bytes)
        for m, rate in report_rates(report):
            tails.setdefault(m, []).append((reported, rate))
        for h in (*report.disk, *report.pulling):
            files.setdefault(h.model, set()).add(name)
        if report.peer is not None:
            peers[name] = (report.peer.url, report.peer.grpc)
    return ends, busy, tails, holders, files, peers


def test_the_view_holds_what_the_reports_said():
    rng = random.Random(36)
    for trial in range(40):
        now, lease_lag_s = rng.uniform(80, 120), rng.choice([0.0, 15.0])
        models, nodes, rows = Models(), [], []
        for i in range(rng.randint(1, 25)):
            name, seen = f"n{i}", rng.uniform(0, 100)
            reported = seen - rng.uniform(0, 50)
            raw = orjson.dumps(random_report(rng, i))
            report = parse_report(name, raw)
            if rng.random() < 0.3:  # an old row: the report validated, not its summary
                facts = NodeFacts.of_row(name, None, raw, reported, models)
            else:
                summary = summarize(report)
                facts = NodeFacts.of_row(name, summary, raw, reported, models)
                report = expand(summary)
            nodes.append((name, seen, facts))
            leases = parse_report(name, raw).report_id is not None
            rows.append((name, seen, reported, report, leases))
        view = FleetView(nodes, models, now, lease_lag_s)
        ends, busy, tails, holders, files, peers = reference(rows, now, lease_lag_s)
        assert {m: h.end for m, h in view.held.items()} == ends, trial
        assert {m: [h.seconds, h.done] for m, h in view.held.items()} == busy, trial
        assert {m: [tuple(t) for t in a.tolist()] for m, a in view.tails.items()} == tails, \
            trial
        assert {m: h.nodes for m, h in view.held.items()} == \
            {m: {n: r for n, (_, r, _) in on.items()} for m, on in holders.items()}, trial
        assert {m: (h.largest, h.cpu_only) for m, h in view.held.items()} == \
            {m: (max(s for _, _, s in on.values()), all(d == "cpu" for d, _, _ in on.values()))
             for m, on in holders.items()}, trial
        assert view.files == files and view.peers == peers, trial
        assert list(view.capacity) == [name for name, *_ in rows]


def test_decoded_latency_is_what_the_expanded_report_measured():
    rng = random.Random(7)
    for i in range(200):
        report = parse_report("n", random_report(rng, i))
        summary = summarize(report)
        expanded = expand(summary)
        routed = expanded.routing.models.items() if expanded.routing else ()
        want = [(m, r.latency_ms) for m, r in (*expanded.models.items(), *routed)
                if r.latency_ms]
        assert [(m, lat) for m, lat in decoded_latency(orjson.loads(summary)) if lat] == want, i


@pytest.fixture(params=["sqlite", "postgresql"])
def store_path(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "state" / "co.sqlite3"
    return request.getfixturevalue("postgres").new_database()


def views_equal(a: FleetView, b: FleetView) -> bool:
    def held(v):
        return {m: (h.nodes, h.end, h.seconds, h.done, h.largest, h.cpu_only)
                for m, h in v.held.items()}

    def tails(v):
        return {m: t.tolist() for m, t in v.tails.items()}

    return (list(a.capacity.items()) == list(b.capacity.items()) and a.peers == b.peers
            and a.files == b.files and held(a) == held(b) and tails(a) == tails(b))


def test_the_kept_reader_decodes_only_new_reports_and_reads_as_from_scratch(store_path):
    """60 nodes over 10 reads 10 s apart: some send new full reports (some stored
    without a summary), some only renew leases, some go silent (and time out), some are
    deleted and come back. Each read of the kept reader equals a new reader's, and it
    decoded exactly the rows whose ``reported`` it had not decoded."""
    rng = random.Random(41)
    store = open_store(store_path, rate_step_s=5)
    kept, now, timeout = FleetReader(store), 1000.0, 40.0
    nodes = [f"n{i:02d}" for i in range(60)]
    reported: dict[str, float] = {}  # what the kept reader decoded, by node
    decoded, decode = [], kept.kept.decode  # the rows it decodes, by node

    def counted(name, *row):
        decoded.append(name)
        return decode(name, *row)

    kept.kept.decode = counted
    for tick in range(10):
        churn(store, rng, nodes, now, lambda node: random_report(rng, int(node[1:])),
              report=0.25, renew=0.8, delete=0.85, first=tick == 0)
        now += 10.0
        marks = {n: r for n, seen, r in store.live_marks(now - timeout - 1.0)}
        new = sorted(n for n, r in marks.items() if reported.get(n, math.nan) != r)
        decoded.clear()
        view = kept.read(now - timeout - 1.0, now, timeout, 15.0)
        assert sorted(decoded) == new, tick
        reported = {n: e[0] for n, e in kept.kept.nodes.items()}
        assert set(reported) <= set(marks), tick  # the nodes no longer live forgotten
        assert views_equal(view, FleetReader(store).read(now - timeout - 1.0, now, timeout,
                                                          15.0)), tick
        assert list(view.capacity) == sorted(n for n, seen, _ in store.live_marks(-math.inf)
                                             if now - seen <= timeout)
    assert 0 < len(new) < len(marks) // 2  # the last read looked its few new rows up by name
    store.close()


def test_the_reader_forgets_model_names_no_live_node_reports(tmp_path):
    """Nodes that report a new model name at every full report (the old ones no node
    reports any more), beside one that reported once and only renews its lease: the
    reader's names stay bounded, and each view holds what the live nodes report (the
    steady node's model too, after the names started over)."""
    store = open_store(tmp_path / "co.sqlite3", rate_step_s=5)
    reader, now = FleetReader(store), 1000.0
    raw = orjson.dumps({"capacity": {"cores": 2, "cpu_memory_bytes": 1e9}, "report_id": 1,
                        "models": {"steady-m": {"rate": 2.0}}})
    store.write_reports([report_record("steady", raw, parse_report("steady", raw), now)], {})
    most = 0
    for tick in range(40):
        records = []
        for i in range(20):
            body = {"capacity": {"cores": 4, "cpu_memory_bytes": 1e9}, "report_id": 1,
                    "models": {f"t{tick}-n{i}-m{k}": {"rate": 1.0} for k in range(5)}}
            raw = orjson.dumps(body)
            records.append(report_record(f"n{i}", raw, parse_report(f"n{i}", raw), now))
        store.write_reports(records, {"steady": now})
        now += 10.0
        view = reader.read(now - 41.0, now, 40.0, 0.0)
        assert sorted(view.held) == sorted([f"t{tick}-n{i}-m{k}" for i in range(20)
                                            for k in range(5)] + ["steady-m"]), tick
        assert set(view.tails) == set(view.held), tick
        assert list(view.held["steady-m"].nodes) == ["steady"], tick
        assert view.tails["steady-m"][:, 1].tolist() == [2.0], tick
        most = max(most, len(reader.models.names))
    assert 1000 < most <= 2 * 101 + 1000 + 100  # it grew past the slack, then started over
    store.close()
