"""The plan moves models, coordinator side (issue 26 item 5): catalog entries with a
source (checked, credential-free), reports of what nodes hold on disk, placement of a
sourced model on any live node (preferring those that hold its files) and the pull and
drop directives a plan implies."""

from __future__ import annotations

import json
import re

import pytest

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.ingest import Fleet
from agent.coordinator.store import StoredPlan
from agent.coordinator.summary import expand, summarize
from agent.wire import Directives, parse_report
from tests.helpers import feed, node_report

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
DIGEST = "sha256:" + "0123456789abcdef" * 4
SOURCED = {"slo_ms": 100, "source": "s3://models/resnet",
           "source_options": {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-1"},
           "version": 2, "digest": DIGEST,
           "config": {"backend": "onnx", "max_batch_size": 8, "slo": {"latency_ms": 100}}}


def test_a_sourced_entry_round_trips(start_coordinator):
    co = start_coordinator()
    status, doc = co.request("PUT", "/v1/models/resnet", SOURCED)
    assert status == 201, doc
    for key in ("source", "source_options", "version", "digest", "config"):
        assert doc[key] == SOURCED[key]
    status, doc = co.request("GET", "/v1/models/resnet")
    assert status == 200 and doc["source"] == "s3://models/resnet" and doc["version"] == 2
    # a PUT replaces the whole entry: without a source it is a local model again
    status, doc = co.request("PUT", "/v1/models/resnet", {"slo_ms": 100})
    assert status == 200 and doc["source"] is None and doc["config"] is None


@pytest.mark.parametrize("change, words", [
    ({"source": "ftp://host/resnet"}, "unknown scheme 'ftp'"),
    ({"source": "resnet"}, "unknown scheme ''"),
    ({"source": "https://host/m.onnx", "source_options": {}}, "sha256"),
    ({"source_options": {"colour": "red"}}, "unknown option(s) colour for s3://"),
    ({"source_options": {"timeout_s": "soon"}}, "source_options.timeout_s"),
    ({"source": f"https://admin:{SECRET}@host/m.onnx"}, "may not hold a user or password"),
    ({"source": f"https://host/m.onnx?X-Amz-Signature={SECRET}"}, "may not hold a query"),
    ({"source": "s3:///prefix"}, "expected s3://bucket/prefix"),
    ({"source": 7}, "source must be a URL"),
    ({"source_options": {"aws_secret_access_key": SECRET, "region": "eu"}},
     "'aws_secret_access_key' look like credentials"),
    ({"source_options": {"token": SECRET, "password": SECRET}},
     "'password', 'token' look like credentials"),
    ({"source_options": {"AWS_SESSION_TOKEN": SECRET}}, "'AWS_SESSION_TOKEN' look like"),
    ({"source_options": {"endpoint_url": f"http://u:{SECRET}@127.0.0.1:9000"}},
     "'endpoint_url' may not hold a URL with a user or password"),
    ({"source_options": {"nested": {"a": 1}}}, "'nested' must be a string, number"),
    ({"source_options": [1]}, "source_options must be an object"),
    ({"version": 0}, "'version' must be a whole number >= 1"),
    ({"version": "2"}, "'version' must be a whole number >= 1"),
    ({"digest": "md5:abc"}, "'digest' must be sha256:<64 lowercase hex digits>"),
    ({"config": {"backend": "pytorch"}}, "'config.backend' must be one of onnx"),
    ({"config": {"colour": "red"}}, "'config.colour' unknown key"),
    ({"config": {"max_batch_size": -1}}, "'config.max_batch_size' must be an integer >= 0"),
    ({"config": {"source": "s3://other/x"}}, "'config' may not hold 'source'"),
    ({"config": {"pin": True}}, "'config' may not hold 'pin': the plan's directives"),
    ({"config": [1]}, "'config' must be an object"),
    ({"source": None}, "field 'config' needs field 'source'"),
])
def test_bad_sources_are_refused_naming_the_field(start_coordinator, change, words):
    co = start_coordinator()
    status, doc = co.request("PUT", "/v1/models/resnet", {**SOURCED, **change})
    assert status == 400 and words in doc["error"], doc
    assert SECRET not in doc["error"]  # a secret is never echoed
    assert co.request("GET", "/v1/models") == (200, [])  # nothing stored


def test_reports_without_disk_still_parse_and_summaries_keep_holdings():
    old = parse_report("n1", json.dumps(node_report({"a": {"resident": True}})))
    assert old.disk == () and old.pulling == () and old.held() == {"a"}
    body = {**node_report({}), "disk": [{"model": "b", "version": 2, "bytes": 1e6}],
            "pulling": [{"model": "c", "version": 1, "bytes": 10, "total": 100}]}
    report = parse_report("n1", json.dumps(body))
    assert report.held() == {"b", "c"}
    again = expand(summarize(report))
    assert again.disk == report.disk and again.pulling[0].model == "c"
    # a summary written before holdings (four items) expands with none
    legacy = json.loads(summarize(old))[:4]
    assert expand(json.dumps(legacy)).disk == ()
    with pytest.raises(ValueError, match="disk"):
        parse_report("n1", json.dumps({**node_report({}), "disk": [{"model": "../x"}]}))


def _sourced(name: str, **kw) -> ModelSLO:
    return ModelSLO(name, slo_ms=200, proc_ms=20, source=f"s3://models/{name}",
                    source_options={"endpoint_url": "http://127.0.0.1:9000"}, **kw)


def _report(store, clock, node, models=None, disk=(), cores=4, memory=1e9):
    body = {**node_report(models or {}, cores, memory),
            "disk": [{"model": m, "version": 1, "bytes": 1e6} for m in disk]}
    store.record_report(node, body, {}, clock.t, keep_s=120)


def test_a_sourced_model_is_placed_on_nodes_that_never_held_it(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(_sourced("s"), 0)
    store.put_model(ModelSLO("local", slo_ms=200), 0)  # no source, no node has it
    for node in ("n1", "n2", "n3"):
        _report(store, clock, node)
    plan = planner.plan_now().plan
    assert plan["models"]["s"]["replicas"] >= 1 and plan["models"]["s"]["unplaced"] == 0
    assert sum(row.get("s", 0) for row in plan["assignment"].values()) == \
        plan["models"]["s"]["replicas"]
    assert plan["models"]["s"]["source"]["source"] == "s3://models/s"
    assert plan["excluded"] == [{"model": "local", "reason": "no live node holds it and "
                                 "it has no source to pull it from"}]


def test_placement_prefers_nodes_holding_the_files(planner_setup):
    """Three empty nodes alike but for n2 holding s's files on disk (and n3 having
    more free memory): s goes to n2; without the holding it goes to n3."""
    store, planner, clock = planner_setup
    store.put_model(_sourced("s"), 0)
    _report(store, clock, "n1")
    _report(store, clock, "n2", disk=["s"])
    _report(store, clock, "n3", memory=2e9)
    plan = planner.plan_now().plan
    assert plan["models"]["s"]["replicas"] == 1, plan["models"]["s"]
    assert plan["assignment"]["n2"] == {"s": 1}
    store.put_model(_sourced("s", version=2), 0)  # a new plan is stable: n2 still
    clock.t += 1
    assert planner.plan_now().plan["assignment"]["n2"] == {"s": 1}


def test_placement_without_holders_spreads_by_free_memory(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(_sourced("s"), 0)
    _report(store, clock, "n1")
    _report(store, clock, "n2", disk=["other"])
    _report(store, clock, "n3", memory=2e9)
    assert planner.plan_now().plan["assignment"]["n3"] == {"s": 1}


def test_directives_pull_what_the_plan_assigns_and_drop_what_it_moved(planner_setup):
    store, planner, clock = planner_setup
    store.put_model(_sourced("s", version=3, config={"max_batch_size": 4}), 0)
    _report(store, clock, "n1", disk=["s"])
    _report(store, clock, "n2", memory=2e9)
    stored = planner.plan_now()
    assert stored.plan["assignment"]["n1"] == {"s": 1}
    fleet = Fleet(ttl_s=30)
    fleet.adopt(StoredPlan(stored.id, stored.created, stored.kind, text=stored.text))
    on_n1 = parse_report("n1", json.dumps(node_report({})))
    d, raw = fleet.answer("n1", on_n1)
    [pull] = d.pull
    assert (pull.model, pull.source, pull.version, pull.load) == ("s", "s3://models/s", 3, True)
    assert pull.config == {"max_batch_size": 4}
    assert pull.source_options == {"endpoint_url": "http://127.0.0.1:9000"}
    assert d.drop == () and Directives.from_json(raw) == d
    # n2 holds s's files but the plan runs s on n1: n2 is told to drop it
    n2_holding = parse_report("n2", json.dumps({**node_report({}), "disk": [
        {"model": "s", "version": 2, "bytes": 5}]}))
    d2, _ = fleet.answer("n2", n2_holding)
    assert d2.pull == () and d2.drop == ("s",)
    # once it no longer holds them, no drop (the cached answer is not reused)
    d3, _ = fleet.answer("n2", parse_report("n2", json.dumps(node_report({}))))
    assert d3.drop == ()
    d4, _ = fleet.answer("n2", n2_holding)
    assert d4.drop == ("s",)


@pytest.mark.parametrize("pull, words", [
    ({"model": "../../etc", "source": "file:///m"}, "pull[0].model"),
    ({"model": "m", "source": ""}, "pull[0].source"),
    ({"model": "m", "source": "file:///m", "version": -1}, "pull[0].version"),
])
def test_hostile_pull_directives_do_not_parse(pull, words):
    """A node takes a pull only in the wire's shape: no path in a model name."""
    with pytest.raises(ValueError, match=re.escape(words)):
        Directives.from_json({"ttl_s": 5, "pull": [pull]})


def test_old_plan_rows_still_answer():
    """A row of a plan made before pulls ([workers, drop_rate]) gives no pull or drop."""
    fleet = Fleet(ttl_s=30)
    fleet.adopt(StoredPlan(1, 0.0, "manual", rows={"n1": b'[{"a": 2}, {}]'}))
    d, _ = fleet.answer("n1", parse_report("n1", json.dumps(node_report({"a": {}}))))
    assert d.workers == {"a": 2} and d.pull == () and d.drop == ()


def test_a_sourced_model_grows_onto_more_nodes(planner_setup):
    """Demand beyond one node's cores: the replicas spread over nodes that never held
    the model, each told to pull it."""
    store, planner, clock = planner_setup
    store.put_model(ModelSLO("busy", slo_ms=100, source="oci://127.0.0.1:5000/m/busy",
                             proc_ms=50), 0)
    feed(store, clock, "n1", {"busy": 150.0}, {"busy": {"resident": True}}, cores=2,
         also=[("n2", {}, {}), ("n3", {}, {})])
    plan = planner.plan_now().plan
    on = {n for n, row in plan["assignment"].items() if row.get("busy")}
    assert plan["models"]["busy"]["replicas"] > 4 and len(on) >= 2, plan["assignment"]


def test_a_node_token_reads_only_its_own_directives_and_pulls_carry_no_secret(
        start_coordinator, tmp_path):
    """With tokens: edge-1's report token gets edge-1's pull directives (the source and
    its options, no credential) and nothing of edge-2's: not its report's answer, not
    the node list, the plan or the catalog. A credential offered to the catalog was
    refused and shows in no answer."""
    import yaml

    from agent.security.authconfig import AuthSettings
    from agent.security.credentials import new_token, token_hash

    admin, tokens = new_token(), {n: new_token() for n in ("edge-1", "edge-2")}
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(
        [{"name": "ops", "sha256": token_hash(admin), "scopes": ["admin"]}]
        + [{"name": n, "sha256": token_hash(t), "scopes": ["report"], "node": n}
           for n, t in tokens.items()]))
    co = start_coordinator(auth=AuthSettings(token_file=path))
    refused = co.request("PUT", "/v1/models/s", {**SOURCED, "source_options": {
        "aws_secret_access_key": SECRET}}, token=admin)
    assert refused[0] == 400 and "look like credentials" in refused[1]["error"]
    assert co.request("PUT", "/v1/models/s", {**SOURCED, "version": None,
                                              "digest": None}, token=admin)[0] == 201
    for node, token in tokens.items():
        assert co.request("POST", f"/v1/nodes/{node}/report", node_report({}),
                          token=token)[0] == 200
    assert co.request("POST", "/v1/plan", token=admin)[0] == 200
    answers = {n: co.request("POST", f"/v1/nodes/{n}/report", node_report({}), token=t)[1]
               for n, t in tokens.items()}
    pulls = [p for d in answers.values() for p in d["pull"]]
    assert len(pulls) == 1 and pulls[0]["source_options"] == SOURCED["source_options"]
    mine = "edge-1" if answers["edge-1"]["pull"] else "edge-2"
    other = "edge-2" if mine == "edge-1" else "edge-1"
    assert answers[other]["pull"] == []
    # the other node's token: its own report only
    status, doc = co.request("POST", f"/v1/nodes/{mine}/report", node_report({}),
                             token=tokens[other])
    assert status == 403 and "only its own report" in doc["error"]
    for path_ in ("/v1/nodes", f"/v1/nodes/{mine}", "/v1/plan", "/v1/models"):
        assert co.request("GET", path_, token=tokens[other])[0] == 403, path_
    # nothing anywhere holds the refused secret or a credential-like option
    seen = json.dumps([answers, co.request("GET", "/v1/nodes", token=admin)[1],
                       co.request("GET", "/v1/plan", token=admin)[1],
                       co.request("GET", "/v1/models", token=admin)[1]])
    assert SECRET not in seen and "secret" not in seen.lower()


def test_models_set_names_a_source_from_the_command_line(start_coordinator, tmp_path):
    from click.testing import CliRunner

    from agent.cli import main

    co = start_coordinator()
    config = tmp_path / "config.yaml"
    config.write_text("max_batch_size: 8\nslo: {latency_ms: 100}\n")

    def run(*args):
        result = CliRunner().invoke(main, ["coordinator", "models", "set", "resnet",
                                           "--slo-ms", "100", *args, "--url", co.url])
        return result.exit_code, result.output

    code, out = run("--source", "s3://models/resnet", "--source-option",
                    "endpoint_url=http://127.0.0.1:9000", "--source-option", "timeout_s=5",
                    "--version", "2", "--digest", DIGEST, "--config", str(config))
    assert code == 0 and "from s3://models/resnet" in out, out
    doc = co.request("GET", "/v1/models/resnet")[1]
    assert doc["source_options"] == {"endpoint_url": "http://127.0.0.1:9000", "timeout_s": 5}
    assert (doc["version"], doc["digest"]) == (2, DIGEST)
    assert doc["config"] == {"max_batch_size": 8, "slo": {"latency_ms": 100}}
    listing = CliRunner().invoke(main, ["coordinator", "models", "ls", "--url", co.url])
    head, row = listing.output.splitlines()
    assert head.split()[-1] == "SOURCE" and row.split()[-1] == "s3://models/resnet"
    code, out = run("--source", "s3://models/resnet", "--source-option", f"token={SECRET}")
    assert code == 1 and "'token' look like credentials" in out and SECRET not in out
    code, out = run("--source", "s3://models/resnet", "--source-option", "region")
    assert code == 2 and "expected KEY=VALUE" in out
