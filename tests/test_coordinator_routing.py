"""The coordinator's routing table (issue 34): made from the plan and the live nodes'
addresses, versioned by its content, sent whole only to a node that holds another
version, and the routed traffic nodes report, shown per model."""

from __future__ import annotations

import json

import orjson

from agent.coordinator.ingest import Fleet, reported_models, reported_routing
from agent.coordinator.routing import RoutingBook
from agent.coordinator.store import StoredPlan
from agent.coordinator.summary import expand, summarize
from agent.wire import Directives, parse_report
from tests.helpers import wait_for

PLAN = {"models": {"a": {"replicas": 3, "placement": {"n1": 2, "n2": 1}},
                   "b": {"replicas": 1, "placement": {"n3": 1}}},
        "assignment": {"n1": {"a": 2}, "n2": {"a": 1}, "n3": {"b": 1}}}


def report(name, *, version=None, peer=True, models=("a",), report_id=None):
    body = {"capacity": {"cores": 2, "cpu_memory_bytes": 1e9},
            "models": {m: {"resident": True} for m in models}}
    if report_id is not None:
        body["report_id"] = report_id
    if peer:
        body["peer"] = {"url": f"http://10.0.0.{name[-1]}:8000",
                        "grpc": f"10.0.0.{name[-1]}:8001"}
        body["routing"] = {"version": version}
    return parse_report(name, json.dumps(body))


def fleet_of(*names, now=100.0, **reports):
    fleet = Fleet(ttl_s=60)
    fleet.adopt(StoredPlan(1, 0.0, "long-term", PLAN))
    for name in names:
        r = reports.get(name) or report(name)
        fleet.record(name, b"{}", reported_models(r), now, reported_routing(r))
    return fleet


def test_the_table_is_the_plan_over_the_live_nodes_that_route():
    fleet = fleet_of("n1", "n2", "n3", n3=report("n3", peer=False))
    book = fleet.routing
    assert book.update(fleet.plan, fleet.addresses(0.0), 60.0)
    table = orjson.loads(book.table)
    # n3 reports no address (it does not route): no node serves b through the table
    assert table["models"] == {"a": {"n1": 2, "n2": 1}}
    assert table["nodes"] == {"n1": {"url": "http://10.0.0.1:8000", "grpc": "10.0.0.1:8001"},
                              "n2": {"url": "http://10.0.0.2:8000", "grpc": "10.0.0.2:8001"}}
    assert table["version"] == book.version and table["max_age_s"] == 60.0
    assert not book.update(fleet.plan, fleet.addresses(0.0), 60.0)  # nothing changed
    # the same plan and addresses make the same version in another process
    other = RoutingBook()
    other.update(StoredPlan(1, 0.0, "long-term", PLAN), fleet.addresses(0.0), 60.0)
    assert other.version == book.version and other.table == book.table

    # n2 goes silent: it leaves the table at once, a new version
    fleet.record("n1", b"{}", (), 200.0, reported_routing(report("n1")))
    assert book.update(fleet.plan, fleet.addresses(150.0), 60.0)
    assert orjson.loads(book.table)["models"] == {"a": {"n1": 2}}
    assert book.planned_nodes() == {"n1", "n2", "n3"}


def test_the_answer_carries_the_version_and_the_table_only_when_needed():
    fleet = fleet_of("n1", "n2", "n3")
    fleet.routing.update(fleet.plan, fleet.addresses(0.0), 60.0)
    version = fleet.routing.version

    first = Directives.from_json(fleet.answer("n1", report("n1"))[1])
    assert first.routing_version == version and first.routing.version == version
    assert first.routing.models["a"] == {"n1": 2, "n2": 1} and first.workers == {"a": 2}
    held = fleet.answer("n1", report("n1", version=version))[1]
    assert orjson.loads(held)["routing_version"] == version and b'"routing":' not in held
    plain = fleet.answer("n3", report("n3", peer=False))[1]  # a node that does not route
    assert b"routing" not in plain
    fleet.routing.update(None, {}, 60.0)  # no plan: the nodes drop their tables
    assert orjson.loads(fleet.answer("n1", report("n1", version=version))[1])[
        "routing_version"] is None


def test_routed_traffic_is_shown_per_model_and_kept_for_the_planner():
    body = {"capacity": {"cores": 2}, "models": {"a": {"latency_ms": {"p99": 12.0}}},
            "peer": {"url": "http://10.0.0.1:8000"},
            "routing": {"version": 3, "models": {
                "a": {"served": 10, "forwarded": 5, "received": 2, "fallbacks": 1,
                      "errors": 1},
                "z": {"forwarded": 4, "arrivals": [[1.0, 5.0, 4]],
                      "latency_ms": {"p99": 250.0}}}}}
    r = parse_report("n1", json.dumps(body))
    fleet = Fleet(ttl_s=60)
    fleet.record("n1", b"{}", reported_models(r), 100.0, reported_routing(r))
    routed = fleet.routed_by_model(50.0)
    assert routed["a"] == {"n1": {"served": 10, "forwarded": 5, "received": 2,
                                  "fallbacks": 1, "errors": 1}}
    assert routed["z"]["n1"]["forwarded"] == 4
    # the reactive loop sees the routed latency of a model the node forwards
    again = expand(summarize(r))
    assert again.routing.models["z"].latency_ms == {"p99": 250.0}
    from agent.coordinator.ingest import report_record
    record = report_record("n1", b"{}", r, 100.0)
    assert json.loads(record.arrivals) == {"z": [[99.0, 5.0, 4.0]]}


def test_a_node_gets_the_table_through_the_coordinator(start_coordinator):
    co = start_coordinator(node_timeout_s=30)
    assert co.request("PUT", "/v1/models/a", {"slo_ms": 100})[0] == 201
    body = {"capacity": {"cores": 2, "cpu_memory_bytes": 1e9},
            "models": {"a": {"resident": True, "size_bytes": 1000,
                             "arrivals": [[1.0, 5.0, 50]],
                             "batches": {"1": {"count": 50, "seconds": 0.5}}}},
            "peer": {"url": "http://127.0.0.1:18000"}, "routing": {"version": None}}
    assert co.request("POST", "/v1/nodes/n1/report", body)[0] == 200
    status, plan = co.request("POST", "/v1/plan")
    assert status == 200 and plan["assignment"]["n1"]["a"] >= 1

    def table():
        answer = co.request("POST", "/v1/nodes/n1/report", body)[1]
        return answer.get("routing")
    got = wait_for(table, 10, "the routing table in the answer")
    assert got["models"] == {"a": {"n1": plan["assignment"]["n1"]["a"]}}
    assert got["nodes"]["n1"]["url"] == "http://127.0.0.1:18000"
    known = {**body, "routing": {"version": got["version"]}}
    answer = co.request("POST", "/v1/nodes/n1/report", known)[1]
    assert answer["routing_version"] == got["version"] and "routing" not in answer
    model = co.request("GET", "/v1/models/a")[1]
    assert model["routed"] == {} or set(model["routed"]) == {"n1"}


def test_the_reactive_loop_scales_up_on_routed_latency(planner_setup):
    """n1 serves a; n2 only forwards it (not in its repository) and measures what its
    clients wait, hop included: that latency breaking the SLO adds a replica."""
    from agent.coordinator.catalog import ModelSLO
    from tests.helpers import feed, node_report

    store, planner, clock = planner_setup
    store.put_model(ModelSLO("a", slo_ms=100), 0)
    fast = {"a": {"batches": {"1": {"count": 100, "seconds": 1.0}}}}
    feed(store, clock, "n1", {"a": 10.0}, fast, cores=4)
    start = planner.plan_now().plan["models"]["a"]["replicas"]

    def tick(routed_ms):
        clock.t += 10
        store.record_report("n1", node_report({"a": {**fast["a"],
                                                     "latency_ms": {"p99": 20.0}}}), {},
                            clock.t, keep_s=120)
        forwarder = {**node_report({}, cores=4),
                     "routing": {"models": {"a": {"forwarded": 50,
                                                  "latency_ms": {"p99": routed_ms}}}}}
        store.record_report("n2", forwarder, {}, clock.t, keep_s=120)
        return planner.reactive_tick()

    assert tick(500) is None and tick(500) is None
    grown = tick(500)
    assert grown is not None and grown.plan["models"]["a"]["replicas"] == start + 1


def test_coordinators_sharing_a_store_route_by_the_plans_addresses():
    """Nodes that reported to another coordinator: their addresses come with the plan
    (made from the store), so every coordinator makes the same table; one this
    coordinator knows to be silent is left out."""
    plan = StoredPlan(1, 0.0, "long-term", {**PLAN, "addresses": {
        "n1": ["http://10.0.0.1:8000", "10.0.0.1:8001"],
        "n2": ["http://10.0.0.2:8000", None]}})
    here, there = RoutingBook(), RoutingBook()
    here.update(plan, {}, 60.0)
    there.update(StoredPlan(1, 0.0, "long-term", plan.plan), {}, 60.0)
    assert here.version == there.version
    assert orjson.loads(here.table)["nodes"]["n2"] == {"url": "http://10.0.0.2:8000",
                                                        "grpc": None}
    # a newer address reported here wins; a node known to be silent leaves
    assert here.update(plan, {"n1": ("http://10.0.0.9:8000", None)}, 60.0,
                       frozenset({"n2"}))
    table = orjson.loads(here.table)
    assert table["models"] == {"a": {"n1": 2}} and \
        table["nodes"]["n1"]["url"] == "http://10.0.0.9:8000"


def test_a_lease_is_answered_anew_after_anything_its_answer_depends_on_changed():
    """A lease's answer is remembered per node (issue 36: thousands a second): after a
    new plan, routing table, version table or full report the next lease gets the
    new answer, the one a fleet that remembered nothing gives, then the few bytes."""
    from agent.coordinator.versions import VersionTable
    from agent.wire import NodeLease

    fleet = fleet_of("n1", "n2", "n3")
    fleet.routing.update(fleet.plan, fleet.addresses(0.0), 60.0)
    first = json.loads(fleet.answer("n1", report("n1", report_id=7))[1])
    held = {"answer": first["answer"], "routing_version": first["routing_version"]}

    def lease(report_id=7):
        asked = NodeLease(report=report_id, answer=held["answer"],
                          routing=held["routing_version"])
        answer, changed = fleet.answer_lease("n1", asked)
        fleet._renewals.clear()  # what a fleet that remembers nothing answers
        assert fleet.answer_lease("n1", asked) == (answer, changed)
        held.update((k, v) for k, v in json.loads(answer).items() if k in held)
        return answer, changed

    assert lease() == (b'{"answer":%d}\n' % held["answer"], False)
    assert lease()[1] is False  # remembered: the same few bytes
    plan = {"models": {"a": {"replicas": 1, "placement": {"n1": 1}}},
            "assignment": {"n1": {"a": 1}}}
    fleet.adopt(StoredPlan(2, 0.0, "long-term", plan))  # a new plan: new directives
    before = held["answer"]
    answer, changed = lease()
    assert changed and json.loads(answer)["workers"] == {"a": 1} and held["answer"] != before
    assert lease()[1] is False
    fleet.routing.update(fleet.plan, fleet.addresses(0.0), 60.0)  # a new routing table
    answer, changed = lease()
    assert changed and json.loads(answer)["routing"]["models"] == {"a": {"n1": 1}}
    assert lease()[1] is False
    fleet.set_versions(VersionTable(id=5))  # a new version table, nothing pinned
    assert lease()[1] is False
    fleet.answer("n1", report("n1", models=("a", "b"), report_id=8))  # a new basis
    assert fleet.answer_lease("n1", NodeLease(report=7, answer=held["answer"]))[0] \
        == b'{"report":true}\n'
    assert lease(8)[1] is False
