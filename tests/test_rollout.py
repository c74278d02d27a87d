"""Version rollout on one agent (issue 26 item 5, TF Serving's availability-preserving
order): a new version found by a rescan (a version directory added to the repository)
or by polling a model's source (``source_poll_s``) is loaded beside the serving one, the
switch comes once it is ready, the old one is unloaded after; a client at 50 req/s sees
no failed request. A new version that cannot load leaves the old one serving."""

from __future__ import annotations

import time

import pytest
import yaml

from agent.config import AgentConfig
from agent.node.cache.lifecycle import State
from agent.node.cache.rollout import Action, next_action
from agent.modelzoo import write_mlp
from tests.helpers import (BODY, TINY_MLP, AgentServer, SteadyClient, add_synthetic, v2_body,
                           wait_for)

ROW = v2_body([1.0, 2.0, 3.0, 4.0])

R, L, F, U, G = State.READY, State.LOADING, State.FAILED, State.UNLOADED, State.UNLOADING


@pytest.mark.parametrize("old, new, listed, states, action", [
    (1, 2, (1, 2), {1: R}, Action.LOAD_NEW),            # the new one never loaded
    (1, 2, (1, 2), {1: R, 2: U}, Action.LOAD_NEW),
    (1, 2, (1, 2), {1: R, 2: L}, Action.LOAD_NEW),      # loading: the old one serves
    (1, 2, (1, 2), {1: R, 2: G}, Action.LOAD_NEW),
    (1, 2, (1, 2), {1: R, 2: R}, Action.SWITCH),        # ready beside it: switch
    (1, 2, (1, 2), {1: R, 2: F}, Action.KEEP_OLD),      # failed: the old one stays
    (1, 2, (1, 2), {1: U, 2: U}, Action.SERVE_NEW),     # nothing served: no rollout
    (1, 2, (1, 2), {1: L}, Action.SERVE_NEW),           # the old one is not READY
    (1, 2, (1, 2), {}, Action.SERVE_NEW),
    (1, 2, (2,), {1: R}, Action.SERVE_NEW),             # the old one left the repository
    (2, 2, (1, 2), {2: R}, Action.SERVE_NEW),           # no new version
    (None, 2, (2,), {}, Action.SERVE_NEW),              # a new model
    (1, None, (), {1: R}, Action.SERVE_NEW),            # no version listed any more
    (2, 1, (1, 2), {2: R}, Action.LOAD_NEW),            # a lower default rolls out too
])
def test_the_rollout_decides_from_the_versions_it_sees(old, new, listed, states, action):
    assert next_action(old, new, listed, states) is action


def start_agent(repo, tmp_path, **config):
    cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=200_000_000,
                      infer_threads=2, **config)
    return AgentServer(cfg, budgets={"cpu": 200_000_000})


def rolled(agent, client, model, old, new):
    """Wait until ``new`` serves and ``old`` is unloaded; the client's answers."""
    try:
        wait_for(lambda: client.answers and client.answers[-1][1] == str(new), 30,
                 f"version {new} serves")
        wait_for(lambda: agent.node.cache.entries[(model, old)].state.value == "unloaded",
                 30, f"version {old} is unloaded")
        time.sleep(0.5)
    finally:
        answers = client.stop()
    assert [a for a in answers if a[0] != 200] == []
    versions = [v for _, v in answers]
    assert versions[0] == str(old) and versions[-1] == str(new)
    assert set(versions[versions.index(str(new)):]) == {str(new)}  # no flapping back
    return answers


def test_a_polled_source_rolls_a_new_version_out(repo, tmp_path):
    src = tmp_path / "src" / "m"
    write_mlp(src / "1" / "model.onnx", **TINY_MLP)
    (repo / "m").mkdir()
    (repo / "m" / "config.yaml").write_text(yaml.safe_dump({"source": f"file://{src}"}))
    agent = start_agent(repo, tmp_path, source_poll_s=0.3)
    try:
        client = SteadyClient(agent, "m")
        wait_for(lambda: len(client.answers) > 20, 30, "version 1 serves")
        write_mlp(src / "2" / "model.onnx", **{**TINY_MLP, "hidden": 8})
        rolled(agent, client, "m", 1, 2)
        assert agent.node.cache.rollouts.done == 1
        assert {h["version"] for h in agent.node.disk.holdings()} >= {2}
    finally:
        agent.close()


def test_a_version_added_to_the_repository_rolls_out(repo, tmp_path):
    """A load of 1.5 s: the old version keeps answering while the new one loads (no
    request waits for that load), then the new one takes over."""
    add_synthetic(repo, "m", load_ms=1500, base_ms=1)
    (repo / "m" / "1").mkdir()
    agent = start_agent(repo, tmp_path)
    try:
        client = SteadyClient(agent, "m", body=BODY)
        wait_for(lambda: len(client.answers) > 20, 30, "version 1 serves")
        (repo / "m" / "2").mkdir()
        rescanned = time.monotonic()
        assert agent.request("POST", "/v2/repository/index", {})[0] == 200  # a rescan
        answers = rolled(agent, client, "m", 1, 2)
        during = [v for (_, v), t in zip(answers, client.times) if t > rescanned + 0.2]
        assert during.count("1") >= 20, during[:30]  # version 1 served through the load
    finally:
        agent.close()


def test_a_new_version_that_does_not_load_leaves_the_old_one_serving(repo, tmp_path):
    write_mlp(repo / "m" / "1" / "model.onnx", **TINY_MLP)
    agent = start_agent(repo, tmp_path, load_retry_s=60)
    try:
        assert agent.request("POST", "/v2/models/m/infer", ROW)[0] == 200
        (repo / "m" / "2").mkdir()
        (repo / "m" / "2" / "model.onnx").write_bytes(b"not an onnx model")
        agent.request("POST", "/v2/repository/index", {})
        wait_for(lambda: agent.node.cache.entries[("m", 2)].state.value == "failed", 30,
                 "version 2 fails to load")
        for _ in range(10):
            status, _, body = agent.request("POST", "/v2/models/m/infer", ROW)
            assert status == 200 and body["model_version"] == "1", body
        assert agent.node.cache.catalog.held == {"m": 1}
        assert agent.node.cache.rollouts.done == 0
    finally:
        agent.close()


def test_the_coordinators_version_pins_move_the_served_version_both_ways(repo, tmp_path):
    """``model_versions`` in an answer pin the version served (down as well as up) with
    a client at 50 req/s and no failed request; the version kept stays loaded and is
    switched back to at once; a bad version is not served though it is the newest; the
    reports carry each version's cumulative figures, a broken version's failed load
    among them; the pins outlive a restart."""
    from agent.config import CoordinatorLink
    from agent.node.reporter import REPORTER
    from agent.wire import Directives

    for version in (1, 2, 3):
        write_mlp(repo / "m" / str(version) / "model.onnx", **{**TINY_MLP, "seed": version})
    (repo / "m" / "4").mkdir()
    (repo / "m" / "4" / "model.onnx").write_bytes(b"not an onnx model")
    link = CoordinatorLink(url="http://127.0.0.1:9", report_interval_s=3600, node_name="n")

    def start():
        return start_agent(repo, tmp_path, coordinator=link, load_retry_s=60)

    def pin(agent, **versions):
        async def apply():
            agent.app[REPORTER].apply(Directives.from_json(
                {"ttl_s": 60, "model_versions": {"m": {"rollout": 1, **versions}}}))
        agent.call(apply())

    def entries(agent):
        return {v: e.state.value for (n, v), e in agent.node.cache.entries.items()}

    agent = start()
    try:
        pin(agent, serve=3, bad=[4])  # the newest is bad: 3 serves
        client = SteadyClient(agent, "m")
        wait_for(lambda: len(client.answers) > 10 and client.answers[-1][1] == "3", 30,
                 "version 3 serves")
        pin(agent, serve=1)  # down: loaded beside, switched, 3 unloaded
        wait_for(lambda: client.answers[-1][1] == "1" and entries(agent)[3] == "unloaded",
                 30, "version 1 serves, 3 unloaded")
        pin(agent, serve=2, keep=[1])  # up, 1 kept at hand
        wait_for(lambda: client.answers[-1][1] == "2", 30, "version 2 serves")
        time.sleep(0.5)
        assert entries(agent)[1] == "ready"  # kept
        switched = time.monotonic()
        pin(agent, serve=1, bad=[2, 4])  # a rollback: 1 is loaded, the switch is at once
        wait_for(lambda: client.answers[-1][1] == "1", 5, "version 1 serves again")
        assert time.monotonic() - switched < 2.0
        wait_for(lambda: entries(agent)[2] == "unloaded", 30, "version 2 unloaded")
        pin(agent, serve=4, keep=[1])  # a version that does not load: 1 goes on
        wait_for(lambda: entries(agent).get(4) == "failed", 30, "version 4 fails")
        time.sleep(0.5)
        answers = client.stop()
        assert [a for a in answers if a[0] != 200] == []
        assert answers[-1][1] == "1"
        stats = {s["version"]: s for s in agent.app[REPORTER].build_report()
                 ["version_stats"]["m"]}
        served = {v: sum(1 for _, x in answers if x == str(v)) for v in (1, 2, 3)}
        for version in (1, 2, 3):  # cumulative, each version's own (a request without
            # a version is labelled with the one serving when it ends: those in flight at
            # a switch may count for the other)
            assert stats[version]["requests"] == stats[version]["ok"]
            assert abs(stats[version]["requests"] - served[version]) <= 3, (stats, served)
            assert stats[version]["latency_buckets"][-1][1] <= stats[version]["ok"]
        assert stats[1]["serving"] and not stats[4]["serving"]
        assert stats[4]["load_failures"] == 1 and "4" in stats[4]["error"]
        pin(agent, serve=1, bad=[2, 4])  # rolled back
    finally:
        agent.close()
    agent = start()  # a restart starts from the pins (they do not lapse)
    try:
        status, _, body = agent.request("POST", "/v2/models/m/infer", ROW)
        assert status == 200 and body["model_version"] == "1"
    finally:
        agent.close()
