"""The coordinator's HTTP API on a real server: catalog, reports, plans, errors, auth."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from agent.coordinator.app import Coordinator
from agent.coordinator.store import StoredPlan
from tests.helpers import REPORT


def test_health_and_empty_state(start_coordinator):
    co = start_coordinator()
    assert co.request("GET", "/v1/health") == (200, {"ok": True, "planner": True})
    assert co.request("GET", "/v1/nodes") == (200, [])
    assert co.request("GET", "/v1/models") == (200, [])
    status, doc = co.request("GET", "/v1/plan")
    assert status == 404 and "no plan yet" in doc["error"]


def test_catalog_round_trip(start_coordinator):
    co = start_coordinator()
    status, doc = co.request("PUT", "/v1/models/a", {"slo_ms": 200, "priority": 2})
    assert status == 201 and doc["slo_ms"] == 200 and doc["percentile"] == 99
    status, doc = co.request("PUT", "/v1/models/a", {"slo_ms": 100, "percentile": 99.9})
    assert status == 200 and doc["priority"] == 1  # a PUT replaces the whole entry
    status, doc = co.request("GET", "/v1/models/a")
    assert status == 200 and doc["slo_ms"] == 100 and doc["nodes"] == []
    assert [m["name"] for m in co.request("GET", "/v1/models")[1]] == ["a"]
    assert co.request("DELETE", "/v1/models/a") == (200, {"deleted": "a"})
    status, doc = co.request("GET", "/v1/models/a")
    assert status == 404 and "not in the catalog" in doc["error"]
    assert co.request("DELETE", "/v1/models/a")[0] == 404


@pytest.mark.parametrize("body, words", [
    ({}, "missing field 'slo_ms'"),
    ({"slo_ms": -1}, "'slo_ms' must be a number > 0"),
    ({"slo_ms": "fast"}, "'slo_ms' must be a number"),
    ({"slo_ms": 10, "percentile": 100}, "'percentile' must be a number > 0 and < 100"),
    ({"slo_ms": 10, "priority": -1}, "'priority' must be a number >= 0"),
    ({"slo_ms": 10, "colour": "red"}, "unknown field 'colour'"),
    ({"slo_ms": 10, "name": "other"}, "URL names 'a'"),
    ([1, 2], "must be a JSON object"),
])
def test_catalog_validation(start_coordinator, body, words):
    co = start_coordinator()
    status, doc = co.request("PUT", "/v1/models/a", body)
    assert status == 400 and words in doc["error"], doc
    assert co.request("GET", "/v1/models") == (200, [])  # nothing changed


def test_bad_json_and_bad_names(start_coordinator):
    co = start_coordinator()
    status, doc = co.request("PUT", "/v1/models/a", raw=b"{nope")
    assert status == 400 and "not valid JSON" in doc["error"]
    status, doc = co.request("PUT", "/v1/models/bad%20name", {"slo_ms": 1})
    assert status == 400 and "model name" in doc["error"]
    status, doc = co.request("GET", "/v1/nowhere")
    assert status == 404 and "error" in doc


@pytest.mark.parametrize("report, words", [
    ({}, "capacity: missing"),
    ({"capacity": {"cores": 0}}, "capacity.cores: must be a number > 0"),
    ({"capacity": {"cores": 2, "disks": 1}}, "capacity.disks: unknown field"),
    ({"capacity": {"cores": 2}, "models": {"a": {"arrivals": [[1, 0, 3]]}}},
     "models.a.arrivals[0]: seconds must be a number > 0"),
    ({"capacity": {"cores": 2}, "models": {"a": {"batches": {"0": {"count": 1, "seconds": 1}}}}},
     "models.a.batches: keys must be batch sizes"),
    ({"capacity": {"cores": 2}, "models": {"a": {"batch_ms": {"4": -1}}}},
     "models.a.batch_ms.4: must be a number >= 0"),
    ({"capacity": {"cores": 2}, "models": {"a": {"latency_ms": {"median": 3}}}},
     "models.a.latency_ms: keys must be percentiles such as p50"),
    ({"capacity": {"cores": 2}, "models": {"a": {"resident": "yes"}}},
     "models.a.resident: must be true or false"),
    ({"capacity": {"cores": 2}, "extra": 1}, "extra: unknown field"),
])
def test_report_validation(start_coordinator, report, words):
    co = start_coordinator()
    status, doc = co.request("POST", "/v1/nodes/n1/report", report)
    assert status == 400 and words in doc["error"] and "'n1'" in doc["error"], doc
    assert co.request("GET", "/v1/nodes") == (200, [])


def test_report_registers_node_and_plan_gives_directives(start_coordinator):
    co = start_coordinator(directive_ttl_s=30)
    status, directives = co.request("POST", "/v1/nodes/n1/report", REPORT)
    assert status == 200 and directives["plan_id"] is None and directives["workers"] == {}
    [node] = co.request("GET", "/v1/nodes")[1]
    assert node["name"] == "n1" and node["alive"] and node["capacity"]["cores"] == 4
    assert "arrivals" not in node["models"]["a"] and node["models"]["a"]["resident"]
    status, doc = co.request("POST", "/v1/plan")
    assert status == 409 and "no catalogued model" in doc["error"]
    co.request("PUT", "/v1/models/a", {"slo_ms": 100})
    co.request("PUT", "/v1/models/b", {"slo_ms": 100})
    co.request("PUT", "/v1/models/elsewhere", {"slo_ms": 100})  # on no node: not planned
    status, plan = co.request("POST", "/v1/plan")
    assert status == 200 and plan["kind"] == "manual" and set(plan["models"]) == {"a", "b"}
    a = plan["models"]["a"]
    assert a["proc_source"] == "measured" and a["proc_ms"] == pytest.approx(20.0)
    assert a["rate"] > 0 and a["utility"] > 0 and a["predicted_latency_ms"] > 0
    assert plan["assignment"]["n1"] == {"a": a["replicas"], "b": 1}
    assert co.request("GET", "/v1/plan") == (200, plan)
    status, directives = co.request("POST", "/v1/nodes/n1/report", REPORT)
    assert directives["plan_id"] == plan["id"] and directives["ttl_s"] == 30
    assert directives["workers"] == {"a": a["replicas"], "b": 1}
    assert directives["pin"] == ["a", "b"] and directives["prefetch"] == ["b"]
    models = {m["name"]: m for m in co.request("GET", "/v1/models")[1]}
    assert models["a"]["replicas"] == a["replicas"] and models["a"]["nodes"] == ["n1"]
    assert models["elsewhere"]["replicas"] is None
    node = co.request("GET", "/v1/nodes/n1")[1]
    assert node["directives"]["pin"] == ["a", "b"] and 0 < node["directives_expire_in_s"] <= 30
    assert co.request("DELETE", "/v1/nodes/n1") == (200, {"deleted": "n1"})
    assert co.request("GET", "/v1/nodes/n1")[0] == 404


def test_admin_token(start_coordinator, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-0123456789abcdef0123456789abcdef\n")
    co = start_coordinator(admin_token_file=token)
    assert co.request("GET", "/v1/health")[0] == 200
    for method, path, body in [("GET", "/v1/nodes", None), ("GET", "/v1/plan", None),
                               ("PUT", "/v1/models/a", {"slo_ms": 5}),
                               ("POST", "/v1/nodes/n/report", REPORT)]:
        status, doc = co.request(method, path, body)
        assert status == 401 and "Bearer" in doc["error"]
    assert co.request("GET", "/v1/nodes", token="wrong")[0] == 401
    assert co.request("GET", "/v1/nodes", token="s3cret-0123456789abcdef0123456789abcdef") == (200, [])
    assert co.request("POST", "/v1/nodes/n/report", REPORT, token="s3cret-0123456789abcdef0123456789abcdef")[0] == 200


def test_a_plan_is_shown_from_its_stored_text_with_its_id():
    """``GET /v1/plan`` splices the id into the plan's text instead of parsing it; a
    plan whose numbers JSON cannot say (json's Infinity) is written as orjson writes
    it (null), valid JSON either way."""
    shown = Coordinator.plan_body(StoredPlan(8, 1.0, "manual", text='{"created":1.0,"x":[2]}'))
    assert json.loads(shown) == {"id": 8, "created": 1.0, "x": [2]}
    odd = StoredPlan(9, 1.0, "manual", {"created": 1.0, "models": {"m": {"rate": float("inf")}}})
    assert "Infinity" in odd.text  # stored as json writes it, read back as inf
    assert json.loads(Coordinator.plan_body(odd)) == {
        "id": 9, "created": 1.0, "models": {"m": {"rate": None}}}


def _get(co, path):
    """(status, parsed JSON, headers) for one GET."""
    try:
        with urllib.request.urlopen(co.url + path, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def test_nodes_come_a_page_at_a_time_while_nodes_keep_reporting(start_coordinator):
    """A fleet of 10,000 is 30 MB in one answer: ``?limit=`` pages by name, the
    ``Link`` header names the next page, ``X-Total-Count`` the fleet. Nodes that report
    while a client pages do not shift the pages: every node there before the first page
    is listed once, in order."""
    import threading

    co = start_coordinator()
    for i in range(60):
        assert co.request("POST", f"/v1/nodes/edge-{i:03d}/report", REPORT)[0] == 200
    stop = threading.Event()

    def newcomers():
        i = 0
        while not stop.is_set():
            co.request("POST", f"/v1/nodes/late-{i:03d}/report", REPORT)
            co.request("POST", f"/v1/nodes/edge-{i % 60:03d}/report", REPORT)  # again
            i += 1
    reporter = threading.Thread(target=newcomers)
    reporter.start()
    try:
        names, path, totals = [], "/v1/nodes?limit=7", []
        while path:
            status, page, headers = _get(co, path)
            assert status == 200 and 1 <= len(page) <= 7, (status, page)
            names += [n["name"] for n in page]
            totals.append(int(headers["X-Total-Count"]))
            link = headers.get("Link")
            path = link[1:link.index(">")] if link else None
            assert link is None or link.endswith('; rel="next"'), link
    finally:
        stop.set()
        reporter.join()
    assert names == sorted(set(names))                     # in order, none twice
    assert {f"edge-{i:03d}" for i in range(60)} <= set(names)
    assert totals[0] >= 60 and totals == sorted(totals) and len(totals) >= 60 // 7
    every = co.request("GET", "/v1/nodes")[1]
    assert [n["name"] for n in every] == sorted(n["name"] for n in every)
    assert len(every) == int(_get(co, "/v1/nodes?limit=1")[2]["X-Total-Count"])
    status, page, headers = _get(co, "/v1/nodes?after=zzz&limit=5")
    assert (status, page, "Link" in headers) == (200, [], False)


@pytest.mark.parametrize("query, words", [
    ("limit=0", "limit must be 1 to 10000, got 0"),
    ("limit=10001", "limit must be 1 to 10000"),
    ("limit=ten", "limit must be a decimal integer"),
    ("limit=-1", "limit must be a decimal integer"),
    ("page=2", "page: unknown query parameter (expected one of: after, limit)"),
])
def test_a_bad_page_of_nodes_is_a_400_naming_it(start_coordinator, query, words):
    co = start_coordinator()
    co.request("POST", "/v1/nodes/n1/report", REPORT)
    status, doc, _ = _get(co, f"/v1/nodes?{query}")
    assert status == 400 and words in doc["error"], doc
    assert [n["name"] for n in co.request("GET", "/v1/nodes")[1]] == ["n1"]


def test_models_show_the_worst_latency_live_nodes_measured_at_their_percentile(
        start_coordinator):
    now = [1000.0]
    co = start_coordinator(clock=lambda: now[0], node_timeout_s=30)
    co.request("PUT", "/v1/models/a", {"slo_ms": 100})                    # p99
    co.request("PUT", "/v1/models/b", {"slo_ms": 250, "percentile": 95})
    co.request("PUT", "/v1/models/c", {"slo_ms": 100, "percentile": 99.9})
    co.request("PUT", "/v1/models/nowhere", {"slo_ms": 100})

    def report(node, models):
        body = {"capacity": REPORT["capacity"],
                "models": {m: {"resident": True, "latency_ms": lat} for m, lat in models.items()}}
        assert co.request("POST", f"/v1/nodes/{node}/report", body)[0] == 200
    report("gone", {"a": {"p99": 900}})                       # silent by the time asked
    now[0] += 40
    report("n1", {"a": {"p50": 20, "p99": 40}, "c": {"p50": 5, "p99": 9}})
    report("n2", {"a": {"p99": 70}, "b": {"p50": 30, "p95": 80, "p99": 120}})
    models = {m["name"]: m for m in co.request("GET", "/v1/models")[1]}
    assert models["a"]["measured_latency_ms"] == 70      # the worst live node
    assert models["b"]["measured_latency_ms"] == 80      # at its SLO's percentile
    assert models["c"]["measured_latency_ms"] == 9       # none that high: the highest
    assert models["nowhere"]["measured_latency_ms"] is None
    assert models["a"]["nodes"] == ["n1", "n2"]
    assert co.request("GET", "/v1/models/b")[1]["measured_latency_ms"] == 80


def test_a_restarted_coordinator_shows_the_nodes_and_latencies_it_stored(start_coordinator,
                                                                         tmp_path):
    """``Fleet.load``: the nodes and each one's reported latencies come back from the
    store, so ``measured_latency_ms`` is there before any node reports again."""
    state = tmp_path / "kept"
    co = start_coordinator(state_dir=state)
    co.request("PUT", "/v1/models/a", {"slo_ms": 100})
    co.request("PUT", "/v1/models/b", {"slo_ms": 100, "percentile": 95})
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200     # a: p99 40
    assert co.request("POST", "/v1/nodes/n2/report", {
        "capacity": REPORT["capacity"],
        "models": {"a": {"latency_ms": {"p99": 55}}, "b": {"latency_ms": {"p95": 80}}}})[0] == 200
    before = {m["name"]: m for m in co.request("GET", "/v1/models")[1]}
    co.close()
    again = start_coordinator(state_dir=state)
    after = {m["name"]: m for m in again.request("GET", "/v1/models")[1]}
    assert [n["name"] for n in again.request("GET", "/v1/nodes")[1]] == ["n1", "n2"]
    assert after["a"]["measured_latency_ms"] == before["a"]["measured_latency_ms"] == 55
    assert after["b"]["measured_latency_ms"] == 80 and after["a"]["nodes"] == ["n1", "n2"]
