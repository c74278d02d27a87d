"""A pinned digest is checked, and a model deleted from the catalog leaves the nodes
(issue 26, follow-up): real agents, a real coordinator, Debian's docker-registry and a
Range-capable HTTP server on loopback (``tests.servers``), real ONNX models."""

from __future__ import annotations

import hashlib

import yaml

from agent.config import AgentConfig
from agent.modelzoo import write_mlp
from agent.sources import open_source
from tests.helpers import TINY_MLP, AgentServer, wait_for
from tests.test_fleet_pull import (FAST, agents, assign_error, assigned_nodes,  # noqa: F401
                                   infer, reported, serving)


def test_a_wrong_pinned_digest_is_refused_and_the_right_one_served(start_coordinator, agents,
                                                                    tmp_path):
    """Two catalog entries pull version 1 of one OCI repository: the one pinning v1's
    manifest digest is served; the one pinning v2's is refused naming the model and both
    digests (in /v1/coordinator's assign_errors, /v1/disk and the answer), nothing of
    it loaded or kept on disk."""
    from tests.servers import oci_registry

    with oci_registry(tmp_path / "registry") as reg:
        url = f"oci://{reg.host}/models/m"
        digests = {}
        for version in (1, 2):
            d = tmp_path / "push" / str(version)
            write_mlp(d / "model.onnx", **{**TINY_MLP, "seed": version})
            digests[version] = open_source(url).push(d, str(version))
        co = start_coordinator(**FAST)
        [agent] = agents(co, ["edge-1"]).values()
        for name, digest in (("right", digests[1]), ("wrong", digests[2])):
            body = {"slo_ms": 200, "proc_ms": 5, "cpu_per_replica": 0.5, "source": url,
                    "version": 1, "digest": digest}
            assert co.request("PUT", f"/v1/models/{name}", body)[0] == 201
        wait_for(lambda: reported(co, ["edge-1"]), 20, "the node reports")
        plan = co.request("POST", "/v1/plan")[1]
        assert assigned_nodes(plan, "wrong") == ["edge-1"], plan
        wait_for(lambda: serving(agent, "right"), 30, "right is served")
        error = assign_error(agent, "wrong", 30)
        assert "wrong" in error and digests[1] in error and digests[2] in error, error
        disk = agent.request("GET", "/v1/disk")[2]
        assert [(h["model"], h["version"], h["digest"]) for h in disk["holdings"]] == [
            ("right", 1, digests[1])]
        [refused] = [e for e in disk["pull_errors"] if e["model"] == "wrong"]
        assert digests[2] in refused["error"] and digests[1] in refused["error"]
        data = agent.node.config.data_dir / "models"
        assert not (data / "wrong" / "1").exists()
        status, _, body = infer(agent, "wrong")
        assert status == 502 and digests[2] in body["error"], (status, body)
        assert agent.request("GET", "/v1/cache/wrong")[2]["state"] != "ready"
        assert infer(agent, "right")[0] == 200
        # the catalog corrected: the node pulls and serves it
        body = {"slo_ms": 200, "proc_ms": 5, "cpu_per_replica": 0.5, "source": url,
                "version": 1, "digest": digests[1]}
        assert co.request("PUT", "/v1/models/wrong", body)[0] == 200
        co.request("POST", "/v1/plan")
        wait_for(lambda: serving(agent, "wrong"), 30, "wrong, corrected, is served")
        assert infer(agent, "wrong")[0] == 200


def test_a_config_digest_is_checked_and_kept_across_a_restart(tmp_path):
    """An operator's config.yaml pinning ``digest:`` over an http source: a wrong one is
    a 502 naming both digests with nothing on disk; the right one is served, and after
    a restart the tier still knows the version's digest and serves it without a pull."""
    from tests.servers import range_http_server

    model = write_mlp(tmp_path / "www" / "model.onnx", **TINY_MLP)
    right = "sha256:" + hashlib.sha256(model.read_bytes()).hexdigest()
    wrong = "sha256:" + "ab" * 32
    repo, data = tmp_path / "repo", tmp_path / "data"
    (repo / "m").mkdir(parents=True)
    with range_http_server(tmp_path / "www") as www:
        def configure(digest):
            (repo / "m" / "config.yaml").write_text(yaml.safe_dump({
                "source": f"{www.url}/model.onnx#sha256={right[7:]}", "digest": digest}))

        def start():
            return AgentServer(AgentConfig(repository=repo, data_dir=data,
                                           cpu_budget=100_000_000, infer_threads=1),
                               budgets={"cpu": 100_000_000})

        configure(wrong)
        agent = start()
        try:
            status, _, body = infer(agent, "m")
            assert status == 502, body
            assert "m:1" in body["error"] and wrong in body["error"] and right in body["error"]
            assert not (data / "models" / "m" / "1").exists()
            assert agent.node.disk.holdings() == []
            configure(right)
            assert agent.request("POST", "/v2/repository/index", {})[0] == 200
            wait_for(lambda: infer(agent, "m")[0] == 200, 20, "the right digest is served")
            assert [h["digest"] for h in agent.node.disk.holdings()] == [right]
        finally:
            agent.close()
        gets = len(www.served)
        agent = start()
        try:
            assert [h["digest"] for h in agent.node.disk.holdings()] == [right]
            assert infer(agent, "m")[0] == 200
            assert len(www.served) == gets  # served from disk: no pull
        finally:
            agent.close()


def test_a_model_deleted_from_the_catalog_is_dropped_by_its_nodes(start_coordinator, agents,
                                                                  tmp_path):
    """Deleting a sourced model from the catalog plans at once (a coordinator that plans
    by itself), and the plan's directives drop it: the node unloads it, removes its
    assigned directory and its files; the operator's own model of another name,
    deleted from the catalog too, is untouched."""
    src = tmp_path / "src"
    for name in ("gone", "keep"):
        write_mlp(src / name / "1" / "model.onnx", **TINY_MLP)
    co = start_coordinator(start_loops=True, **FAST)
    [agent] = agents(co, ["edge-1"]).values()
    repo = agent.node.config.repository
    write_mlp(repo / "own" / "1" / "model.onnx", **TINY_MLP)
    agent.node.rescan()
    for name in ("gone", "keep", "own"):
        body = {"slo_ms": 200, "proc_ms": 5, "cpu_per_replica": 0.5,
                "source": f"file://{src / ('keep' if name == 'own' else name)}"}
        assert co.request("PUT", f"/v1/models/{name}", body)[0] == 201
    wait_for(lambda: reported(co, ["edge-1"]), 20, "the node reports")
    co.request("POST", "/v1/plan")
    wait_for(lambda: all(serving(agent, m) for m in ("gone", "keep", "own")), 30,
             "all three served")
    assigned = agent.node.config.assigned_dir
    assert (assigned / "gone").is_dir() and not (assigned / "own").exists()
    for name in ("gone", "own"):
        assert co.request("DELETE", f"/v1/models/{name}")[0] == 200
    wait_for(lambda: co.request("GET", "/v1/plan")[1].get("retired") == ["gone", "own"],
             20, "a plan made by the deletes retires both")
    data = agent.node.config.data_dir / "models"
    wait_for(lambda: not (assigned / "gone").exists() and not (data / "gone" / "1").exists()
             and "gone" not in agent.node.cache.specs, 30, "the node drops gone")
    assert infer(agent, "gone")[0] == 404
    assert agent.node.cache.specs["own"].path == repo / "own"  # the operator's: kept
    assert (repo / "own" / "1" / "model.onnx").is_file()
    assert infer(agent, "own")[0] == 200 and infer(agent, "keep")[0] == 200


def test_a_directory_digest_is_what_a_pull_of_it_reports(tmp_path):
    """``tree_digest`` (what ``model push`` prints for s3://, and what to pin for
    file://) equals the digest a pull reports, and changes with one byte."""
    from agent.sources.transfer import tree_digest

    version = tmp_path / "src" / "m" / "1"
    write_mlp(version / "model.onnx", **TINY_MLP)
    (version / "sub").mkdir()
    (version / "sub" / "labels.txt").write_text("cat\ndog\n")
    pulled = open_source(f"file://{tmp_path / 'src' / 'm'}").pull(1, tmp_path / "dest")
    assert pulled.digest == tree_digest(version) == tree_digest(tmp_path / "dest")
    (version / "sub" / "labels.txt").write_text("cat\ndoe\n")
    assert tree_digest(version) != pulled.digest
