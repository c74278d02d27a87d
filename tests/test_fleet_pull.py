"""The plan moves models, end to end on loopback (issue 26 item 5): real agents that hold
no model at start, a real coordinator whose catalog names where each model comes from
(an S3-compatible server, an OCI registry, a directory), pull directives that make the
agents pull and serve what the plan assigns them, drop directives that take it away
again, and a new version rolled out under a steady client with no failed request.

Every model is a real ONNX MLP written here; the S3 server is moto's, the registry
Debian's docker-registry (``tests.servers``; those tests skip naming what is missing)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.config import AgentConfig, CoordinatorLink
from agent.modelzoo import write_mlp
from agent.sources import open_source
from tests.helpers import TINY_MLP, AgentServer, SteadyClient, v2_body, wait_for

ROW = v2_body([1.0, 2.0, 3.0, 4.0])
FAST = dict(directive_ttl_s=30, rate_step_s=0.5, plan_window_s=2, history_s=30,
            node_timeout_s=30, plan_interval_s=3600, reactive_interval_s=3600)


def publish_dir(root: Path, name: str, version: int, hidden: int = 16) -> Path:
    """``root/name/version/model.onnx``: a ``file://`` source's layout."""
    write_mlp(root / name / str(version) / "model.onnx", **{**TINY_MLP, "hidden": hidden})
    return root / name


@pytest.fixture
def agents(tmp_path):
    """agents(co, names, **config) -> {name: AgentServer} with empty repositories,
    reporting to ``co`` every 0.2 s; stopped after the test."""
    started = []

    def start(co, names, cores=2, budget=200_000_000, **config):
        out = {}
        for name in names:
            repo = tmp_path / name / "repo"
            repo.mkdir(parents=True)
            link = CoordinatorLink(url=co.url, report_interval_s=0.2, node_name=name,
                                   cores=cores if isinstance(cores, (int, float))
                                   else cores[name])
            cfg = AgentConfig(repository=repo, data_dir=tmp_path / name / "data",
                              cpu_budget=budget, infer_threads=2, coordinator=link, **config)
            out[name] = AgentServer(cfg, budgets={"cpu": budget})
            started.append(out[name])
        return out

    yield start
    for server in started:
        server.close()


def infer(agent, model):
    return agent.request("POST", f"/v2/models/{model}/infer", ROW)


def reported(co, names):
    nodes = {n["name"]: n for n in co.request("GET", "/v1/nodes")[1]}
    return set(names) <= set(nodes) and nodes


def assigned_nodes(plan, model):
    return sorted(n for n, row in plan["assignment"].items() if row.get(model))


def assign_error(agent, model, timeout=20):
    """``model``'s error under ``assign_errors`` in the agent's /v1/coordinator, once
    there."""
    status = wait_for(lambda: (lambda s: s if model in s["assign_errors"] else None)(
        agent.request("GET", "/v1/coordinator")[2]), timeout, f"{model}'s pull error")
    return status["assign_errors"][model]


def serving(agent, model):
    status, _, body = agent.request("GET", f"/v1/cache/{model}")
    return status == 200 and body.get("state") == "ready"


def test_a_fleet_serves_a_catalog_none_of_its_nodes_held(start_coordinator, agents, tmp_path,
                                                         monkeypatch):
    """The headline floor: three agents with empty repositories, one coordinator, one
    S3-compatible server and one OCI registry; after a plan every request for every
    model is answered 200 by a node the plan assigned, no file copied by hand."""
    from tests.servers import oci_registry, s3_server

    with s3_server(tmp_path / "aws") as s3, oci_registry(tmp_path / "registry") as reg:
        for key, value in s3.env.items():  # the agents' own credentials: their environment
            monkeypatch.setenv(key, value)
        client = s3.client()
        client.create_bucket(Bucket="models")
        catalog = {}
        for i, name in enumerate(("s3-a", "s3-b")):
            path = write_mlp(tmp_path / "push" / name / "1" / "model.onnx",
                             **{**TINY_MLP, "seed": i})
            client.put_object(Bucket="models", Key=f"zoo/{name}/1/model.onnx",
                              Body=path.read_bytes())
            catalog[name] = {"source": f"s3://models/zoo/{name}",
                             "source_options": {"endpoint_url": s3.endpoint_url}}
        for i, name in enumerate(("oci-a", "oci-b")):
            d = tmp_path / "push" / name / "1"
            write_mlp(d / "model.onnx", **{**TINY_MLP, "seed": 10 + i})
            open_source(f"oci://{reg.host}/models/{name}").push(d, "1")
            catalog[name] = {"source": f"oci://{reg.host}/models/{name}"}

        co = start_coordinator(**FAST)
        fleet = agents(co, ["edge-1", "edge-2", "edge-3"])
        for name, entry in catalog.items():
            status, doc = co.request("PUT", f"/v1/models/{name}",
                                     {"slo_ms": 200, "proc_ms": 5, **entry})
            assert status == 201, doc
        wait_for(lambda: reported(co, fleet), 20, "three nodes report")
        for agent in fleet.values():  # nothing held at start
            assert agent.request("GET", "/v1/cache")[2] == [] and not agent.node.cache.specs
        status, plan = co.request("POST", "/v1/plan")
        assert status == 200, plan
        assert plan["excluded"] == []
        where = {m: assigned_nodes(plan, m) for m in catalog}
        assert all(where.values()), where
        assert len({n for nodes in where.values() for n in nodes}) >= 2  # spread out

        def all_served():
            return all(serving(fleet[n], m) for m, nodes in where.items() for n in nodes)
        wait_for(all_served, 60, f"every assigned node serves its models: {where}")
        answers = [(m, n, infer(fleet[n], m)) for m, nodes in where.items()
                   for n in nodes for _ in range(5)]
        assert [(m, n) for m, n, (status, _, _) in answers if status != 200] == []
        for m, nodes in where.items():  # pulled only where assigned
            for n, agent in fleet.items():
                held = {h["model"] for h in agent.node.disk.holdings()}
                assert (m in held) == (n in nodes), (m, n, held)
        # the coordinator sees the disk holdings in the reports, where the plan put them
        def on_disk():
            nodes = reported(co, fleet) or {}
            return {(h["model"], n) for n, node in nodes.items() for h in node["disk"]}
        wanted = {(m, n) for m, nodes in where.items() for n in nodes}
        wait_for(lambda: on_disk() == wanted, 10, "disk holdings reported")


def test_a_model_the_plan_moves_is_dropped_where_it_was(start_coordinator, agents, tmp_path):
    """A sourced model placed on edge-1 (the most free memory) moves to edge-2 when its
    replicas need more cores than edge-1 has: edge-2 pulls and serves it, edge-1 unloads
    it, removes its assigned directory and its files."""
    src = publish_dir(tmp_path / "src", "m", 1)
    co = start_coordinator(**FAST)
    fleet = agents(co, ["edge-1", "edge-2"], cores={"edge-1": 1, "edge-2": 2})
    one, two = fleet["edge-1"], fleet["edge-2"]
    entry = {"slo_ms": 200, "proc_ms": 5, "source": f"file://{src}"}
    assert co.request("PUT", "/v1/models/m", entry)[0] == 201
    wait_for(lambda: reported(co, fleet), 20, "two nodes report")
    plan = co.request("POST", "/v1/plan")[1]
    first = assigned_nodes(plan, "m")
    assert len(first) == 1, plan["assignment"]
    here, there = (one, two) if first == ["edge-1"] else (two, one)
    wait_for(lambda: serving(here, "m"), 30, "the assigned node serves m")
    assert infer(here, "m")[0] == 200
    # never assigned there: unknown there, and with the plan's routing table it answers
    # by forwarding to where the plan runs it (issue 34), pulling nothing
    home = "edge-1" if here is one else "edge-2"
    wait_for(lambda: infer(there, "m")[1].get("edgeagent-served-by") == home, 20,
             "the other node forwards m")
    assert "m" not in there.node.cache.specs and not there.node.disk.holdings()
    # m now needs 2 cores a replica: only edge-2 has them
    assert co.request("PUT", "/v1/models/m", {**entry, "cpu_per_replica": 2})[0] == 200
    plan = co.request("POST", "/v1/plan")[1]
    assert assigned_nodes(plan, "m") == ["edge-2"], plan["assignment"]
    wait_for(lambda: serving(two, "m"), 30, "edge-2 serves m")
    assert infer(two, "m")[0] == 200
    if here is one:  # it was on edge-1: dropped there
        data = tmp_path / "edge-1" / "data"
        wait_for(lambda: not (data / "assigned" / "m").exists()
                 and not one.node.disk.holdings(), 30, "edge-1 drops m")
        assert "m" not in one.node.cache.specs
        status, headers, _ = infer(one, "m")  # forwarded to where it runs now
        assert status == 200 and headers["edgeagent-served-by"] == "edge-2"


def test_pulls_of_bad_or_shadowed_models_leave_the_node_serving(start_coordinator, agents,
                                                                 tmp_path):
    """A pull whose model the operator's repository already has is served from the
    repository (the operator wins); a pull of a version the source lacks is an error
    shown in /v1/coordinator, and other models are still pulled and served."""
    src = tmp_path / "src"
    publish_dir(src, "good", 1)
    publish_dir(src, "own", 1)
    co = start_coordinator(**FAST)
    [agent] = agents(co, ["edge-1"]).values()
    repo = agent.node.config.repository
    write_mlp(repo / "own" / "3" / "model.onnx", **TINY_MLP)
    agent.node.rescan()
    for name, extra in (("good", {}), ("own", {}), ("missing", {"version": 9})):
        body = {"slo_ms": 200, "proc_ms": 5, "cpu_per_replica": 0.5,
                "source": f"file://{src / 'good'}", **extra}
        assert co.request("PUT", f"/v1/models/{name}", body)[0] == 201
    wait_for(lambda: reported(co, ["edge-1"]), 20, "the node reports")
    plan = co.request("POST", "/v1/plan")[1]
    assert assigned_nodes(plan, "good") == ["edge-1"], plan
    wait_for(lambda: serving(agent, "good"), 30, "good is served")
    assert "no version 9" in assign_error(agent, "missing")
    assert agent.node.cache.specs["own"].path == repo / "own"  # the operator's entry
    assert not (agent.node.config.assigned_dir / "own").exists()
    assert infer(agent, "own")[0] == 200 and infer(agent, "good")[0] == 200


def test_a_published_version_rolls_out_with_no_failed_request(start_coordinator, agents,
                                                                tmp_path):
    """A client at 50 req/s throughout; version 2 is published in the source and the
    catalog entry names it: the node pulls it, loads it beside version 1, switches when
    it is ready and unloads version 1 once the rollout (one wave, a second's bake)
    completes. 0 failed requests; version 2 serves after."""
    from agent.coordinator.rollout import RolloutSettings

    src = publish_dir(tmp_path / "src", "m", 1)
    co = start_coordinator(**FAST, rollout=RolloutSettings(bake_s=1.0))
    [agent] = agents(co, ["edge-1"]).values()
    entry = {"slo_ms": 200, "proc_ms": 5, "source": f"file://{src}", "version": 1}
    assert co.request("PUT", "/v1/models/m", entry)[0] == 201
    wait_for(lambda: reported(co, ["edge-1"]), 20, "the node reports")
    assert assigned_nodes(co.request("POST", "/v1/plan")[1], "m") == ["edge-1"]
    wait_for(lambda: serving(agent, "m"), 30, "version 1 serves")
    client = SteadyClient(agent, "m", rate=50)
    try:
        time.sleep(1.0)
        publish_dir(tmp_path / "src", "m", 2, hidden=8)
        status, doc = co.request("PUT", "/v1/models/m", {**entry, "version": 2})
        assert status == 200 and doc["rollout_id"] >= 1, doc
        wait_for(lambda: client.answers and client.answers[-1][1] == "2", 30,
                 "version 2 serves")
        wait_for(lambda: co.request("GET", f"/v1/rollouts/{doc['rollout_id']}")[1][
            "state"] == "completed", 30, "the rollout completes")
        wait_for(lambda: agent.node.cache.entries[("m", 1)].state.value == "unloaded", 30,
                 "version 1 is unloaded")
        time.sleep(1.0)
    finally:
        answers = client.stop()
    failed = [a for a in answers if a[0] != 200]
    assert failed == [], failed[:5]
    versions = [v for _, v in answers]
    assert versions[0] == "1" and versions[-1] == "2" and len(answers) > 100
    switch = versions.index("2")
    assert set(versions[switch:]) == {"2"}  # no flapping back once switched
    assert agent.node.cache.rollouts.done == 1


def test_a_node_refuses_a_pull_that_carries_a_credential(start_coordinator, agents, tmp_path):
    """Defence in depth: were a coordinator to send a credential in a pull (its catalog
    refuses them), the node writes nothing and says why, naming the key, not the value."""
    from agent.node.reporter import REPORTER
    from agent.wire import Directives

    src = publish_dir(tmp_path / "src", "m", 1)
    co = start_coordinator(**FAST)
    [agent] = agents(co, ["edge-1"]).values()
    reporter = agent.app[REPORTER]
    secret = "SENTINEL-d7e1"
    directives = Directives.from_json({"ttl_s": 60, "pull": [
        {"model": "m", "source": f"file://{src}", "source_options": {"api_key": secret}},
        {"model": "n", "source": f"file://u:{secret}@localhost{src}"}]})

    async def apply():
        reporter.apply(directives)
    agent.call(apply())
    errors = wait_for(lambda: (lambda e: e if {"m", "n"} <= set(e) else None)(
        agent.request("GET", "/v1/coordinator")[2]["assign_errors"]), 10, "both refused")
    assert "'api_key' look like credentials" in errors["m"]
    assert "may not hold a user or password" in errors["n"]
    assert secret not in str(errors)
    assert not agent.node.config.assigned_dir.exists() and not agent.node.cache.specs
