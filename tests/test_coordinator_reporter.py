"""The agent's reporter: stats from the metrics registry, failures that never reach
serving, tokens, and pins from before a restart."""

from __future__ import annotations

import json
import math
import time

import pytest

from agent.config import AgentConfig, CoordinatorLink
from agent.percentiles import histogram_quantile
from tests.helpers import BODY, AgentServer, add_synthetic, wait_for

UNREACHABLE = "http://127.0.0.1:9"


def start(tmp_path, repo, url, **link):
    link.setdefault("report_interval_s", 0.1)
    cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=50_000_000,
                      infer_threads=2,
                      coordinator=CoordinatorLink(url=url, node_name="n1", **link))
    return AgentServer(cfg, budgets={"cpu": 50_000_000})


def test_histogram_quantile():
    buckets = [(0.01, 0.0), (0.02, 50.0), (0.05, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == 0.02
    assert histogram_quantile(0.25, buckets) == 0.015
    assert histogram_quantile(0.99, buckets) == 0.02 + 0.03 * 49 / 50
    assert histogram_quantile(0.999, [(0.1, 0.0), (math.inf, 4.0)]) == 0.1
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_unreachable_coordinator_never_stops_serving(tmp_path, repo):
    add_synthetic(repo, "m")
    agent = start(tmp_path, repo, UNREACHABLE)
    try:
        status = wait_for(lambda: (lambda s: s["failures"] >= 2 and s)(
            agent.request("GET", "/v1/coordinator")[2]))
        assert status["reports"] == 0 and "Error" in status["last_error"]
        assert status["directives"] is None
        assert agent.request("POST", "/v2/models/m/infer", BODY)[0] == 200
        assert agent.request("GET", "/v2/health/ready")[0] == 200
    finally:
        agent.close()


def test_the_node_name_comes_from_the_environment_where_the_config_has_none(
        tmp_path, repo, monkeypatch):
    """A pod's host name is the pod's (new at each restart): in Kubernetes the DaemonSet
    gives the node's name in EDGEAGENT_NODE_NAME; the config's node_name still wins."""
    add_synthetic(repo, "m")
    monkeypatch.setenv("EDGEAGENT_NODE_NAME", "k8s-node-7")
    agent = start(tmp_path, repo, UNREACHABLE)
    try:
        assert agent.request("GET", "/v1/coordinator")[2]["node"] == "n1"
    finally:
        agent.close()
    cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data2", cpu_budget=50_000_000,
                      infer_threads=2, coordinator=CoordinatorLink(url=UNREACHABLE))
    agent = AgentServer(cfg, budgets={"cpu": 50_000_000})
    try:
        assert agent.request("GET", "/v1/coordinator")[2]["node"] == "k8s-node-7"
    finally:
        agent.close()


def test_no_section_no_reporter(repo, start_agent):
    add_synthetic(repo, "m")
    agent = start_agent(repo)
    assert agent.request("GET", "/v1/coordinator")[2] == {"configured": False}


def test_token_and_stats(tmp_path, repo, start_coordinator):
    add_synthetic(repo, "m", base_ms=5)
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef\n")
    co = start_coordinator(admin_token_file=token)
    agent = start(tmp_path, repo, co.url)  # no token: refused, and says why
    try:
        status = wait_for(lambda: (lambda s: s["failures"] and s)(
            agent.request("GET", "/v1/coordinator")[2]))
        assert "401" in status["last_error"]
    finally:
        agent.close()
    agent = start(tmp_path, repo, co.url, token_file=token, cores=3)
    try:
        for _ in range(20):
            assert agent.request("POST", "/v2/models/m/infer", BODY)[0] == 200

        def all_in():
            status, node = co.request("GET", "/v1/nodes/n1", token="tok-0123456789abcdef0123456789abcdef")
            batches = node.get("models", {}).get("m", {}).get("batches") if status == 200 \
                else None
            return batches and batches["1"]["count"] == 20 and node
        node = wait_for(all_in)
        m = node["models"]["m"]
        assert node["capacity"]["cores"] == 3 and m["resident"] and m["device"] == "cpu"
        assert m["batches"]["1"]["seconds"] >= 0.1  # 20 requests of >= 5 ms
        assert m["batch_ms"]["1"] >= 5  # the batching layer's profile
        co.co.writer.flush()
        seen = sum(c for _, c in co.co.store.rate_bins("m"))
        assert seen == pytest.approx(20)  # every request counted once, across reports
    finally:
        agent.close()


def test_pins_from_before_a_restart_are_reverted(tmp_path, repo):
    add_synthetic(repo, "m")
    add_synthetic(repo, "mine")
    data = tmp_path / "data"
    data.mkdir()
    # the state file restores both pins; only "m" was the coordinator's
    (data / "resident.json").write_text(json.dumps(
        {"format": 1, "resident": [], "pins": {"m": True, "mine": True}}))
    (data / "coordinator-pins.json").write_text(json.dumps({"format": 1, "pins": ["m"]}))
    agent = start(tmp_path, repo, UNREACHABLE)
    try:
        assert agent.request("GET", "/v1/cache/m")[2]["pinned"] is False
        assert agent.request("GET", "/v1/cache/mine")[2]["pinned"] is True
        time.sleep(0.1)
        assert json.loads((data / "coordinator-pins.json").read_text())["pins"] == []
    finally:
        agent.close()


def test_join_once_then_report_with_the_node_credential(tmp_path, repo, start_coordinator):
    """A used-up join token: the reporter says why and writes nothing; a fresh one: the
    agent joins once, keeps its credential (0600) and reports with it, also after a
    restart (the join token is gone by then)."""
    import yaml

    from agent.security.authconfig import AuthSettings
    from agent.security.credentials import new_token, token_hash

    add_synthetic(repo, "m")
    admin = new_token()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "ops", "sha256": token_hash(admin),
                                       "scopes": ["admin"]}]))
    co = start_coordinator(auth=AuthSettings(token_file=tokens))
    join_file, cred = tmp_path / "join", tmp_path / "state" / "node-token"
    join_file.write_text(new_token())  # never made by the coordinator
    agent = start(tmp_path, repo, co.url, join_token_file=join_file, credential_file=cred)
    try:
        status = wait_for(lambda: (lambda s: s["failures"] and s)(
            agent.request("GET", "/v1/coordinator")[2]))
        assert "joining the coordinator failed: 401" in status["last_error"]
        assert not cred.exists()
    finally:
        agent.close()
    made = co.request("POST", "/v1/join-tokens", {"node": "n1"}, token=admin)[1]
    join_file.write_text(made["token"])
    agent = start(tmp_path, repo, co.url, join_token_file=join_file, credential_file=cred)
    try:
        wait_for(lambda: agent.request("GET", "/v1/coordinator")[2]["reports"] >= 2)
        assert cred.stat().st_mode & 0o777 == 0o600
        assert co.co.store.node_credentials() == [("n1", token_hash(cred.read_text().strip()))]
    finally:
        agent.close()
    agent = start(tmp_path, repo, co.url, join_token_file=join_file, credential_file=cred)
    try:  # the join token is used up: the kept credential is what reports carry
        wait_for(lambda: agent.request("GET", "/v1/coordinator")[2]["reports"] >= 2)
    finally:
        agent.close()
