"""Rollouts through the coordinator's routes and its store: a catalog version change
that starts a rollout, its waves advancing as nodes report serving the new version,
pause/resume/abort, a rollback that marks the version bad (and the catalog back on the
old one) until an operator clears it, the state surviving a restart (SQLite) and a
failover (two coordinator processes on PostgreSQL), and bad requests answered 4xx.

The nodes here are the test's stand-ins: they report as agents do (``version_stats``)
and switch the moment their answer pins a version, so that the coordinator's side is
judged alone, step by step; real agents pulling real versions are in
tests/test_rollout_fleet.py."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.coordinator.rollout import Rollout, RolloutSettings, new_rollout
from agent.coordinator.catalog import ModelSLO
from agent.coordinator.rolloutstore import RolloutConflict
from agent.coordinator.stores import open_store
from tests.helpers import CoordinatorProcess, request, wait_for

NODES = [f"edge-{i}" for i in range(1, 7)]
BOUNDS = (1.0, 2.5, 5.0, 10.0, 25.0)
#: The coordinator's rollouts here: a canary, two nodes, the rest, each wave baking 0.6 s
#: (its window at once), judged on 5 answers
WAVES = {"waves": [1, 2], "bake_s": 0.6, "settle_s": 0, "gates": {"min_requests": 5}}
FAST = dict(rollout_check_s=0.1, node_timeout_s=30, plan_interval_s=3600,
            reactive_interval_s=3600, rate_step_s=0.5, plan_window_s=2, history_s=30)


def coordinator(start_coordinator, **config):
    """An in-process coordinator with ``FAST`` and ``WAVES``."""
    from agent.schema import load

    return start_coordinator(**FAST, rollout=load(RolloutSettings, WAVES), **config)


@dataclass
class StandIn:
    """A node as its reports show it: it serves the version its last answer pinned
    (unless that one fails to load: ``broken``), at ``latency_ms`` per version."""

    name: str
    serving: int = 1
    broken: set[int] = field(default_factory=set)
    latency_ms: dict[int, float] = field(default_factory=lambda: {1: 2.0, 2: 2.0, 3: 2.0})
    stats: dict[int, dict] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    answer: dict = field(default_factory=dict)

    def traffic(self, n: int) -> None:
        s = self.stats.setdefault(self.serving, {"requests": 0, "ok": 0, "load_failures": 0})
        s["requests"] += n
        s["ok"] += n

    def body(self) -> dict:
        rows = []
        for version, s in sorted(self.stats.items()):
            latency = self.latency_ms[version]
            rows.append({"version": version, "serving": version == self.serving,
                         "state": "ready", "size_bytes": 1e6, "requests": s["requests"],
                         "errors": 0, "ok": s["ok"], "load_failures": s["load_failures"],
                         "latency_buckets": [[b, s["ok"] if latency <= b else 0]
                                             for b in BOUNDS],
                         **({"error": self.errors[version]} if version in self.errors
                            else {})})
        return {"capacity": {"cores": 4, "cpu_memory_bytes": 1e9},
                "models": {"m": {"resident": True, "arrivals": [[0.0, 1.0, 150]]}},
                "version_stats": {"m": rows}}

    def report(self, base_url: str) -> dict:
        status, answer, _ = request(f"{base_url}/v1/nodes/{self.name}/report", "POST",
                                    self.body())
        assert status == 200, answer
        self.answer = answer
        pin = (answer.get("model_versions") or {}).get("m")
        if pin and pin["serve"] is not None and pin["serve"] != self.serving:
            if pin["serve"] in self.broken:
                s = self.stats.setdefault(pin["serve"], {"requests": 0, "ok": 0,
                                                         "load_failures": 0})
                s["load_failures"] = 1
                self.errors[pin["serve"]] = "onnxruntime: Load model failed"
            else:
                self.serving = pin["serve"]
        return answer


def round_of(nodes: list[StandIn], url: str, n: int = 10) -> None:
    for node in nodes:
        node.traffic(n)
        node.report(url)


def entry(src: Path, version: int, **extra) -> dict:
    """m's catalog entry: a replica takes a whole node, so the plan places one on each
    of the six nodes at their rate."""
    return {"slo_ms": 100, "proc_ms": 5, "cpu_per_replica": 4, "source": f"file://{src}",
            "version": version, **extra}


def fleet_with_m(co, url: str, src: Path) -> list[StandIn]:
    """m at version 1 planned on six nodes that report it."""
    body = entry(src, 1)
    assert request(f"{url}/v1/models/m", "PUT", body)[0] == 201
    nodes = [StandIn(n) for n in NODES]

    def planned():
        round_of(nodes, url)
        status, plan, _ = request(f"{url}/v1/plan", "POST" if co is not None else "GET")
        return status == 200 and len(plan["assignment"]) == 6
    wait_for(planned, 60, "m planned on the six nodes", step=0.5)
    round_of(nodes, url)
    return nodes


def get(url: str, path: str):
    status, doc, _ = request(url + path)
    assert status == 200, doc
    return doc


def test_a_catalog_version_change_rolls_out_in_waves(start_coordinator, tmp_path):
    co = coordinator(start_coordinator)
    nodes = fleet_with_m(co, co.url, tmp_path)
    for node in nodes:  # the catalog's version, exactly
        assert node.answer["model_versions"]["m"] == {"serve": 1, "keep": [], "bad": [],
                                                      "rollout": None}
        assert [p["version"] for p in node.answer["pull"] if p["model"] == "m"] in ([1], [])
    status, doc, _ = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 2))
    assert status == 200 and doc["version"] == 2, doc
    rollout_id = doc["rollout_id"]
    assert get(co.url, "/v1/models/m")["version"] == 2  # the catalog names the new one

    seen = []

    def rolled():
        round_of(nodes, co.url)
        r = get(co.url, f"/v1/rollouts/{rollout_id}")
        serving = {n.name for n in nodes if n.serving == 2}
        # only the nodes of the waves started so far serve the new version
        assert serving <= {n for w in r["waves"][:r["wave"]] for n in w}, (serving, r)
        assert not seen or seen[-1] <= serving  # never back
        seen.append(serving)
        return r if r["state"] != "running" else None

    r = wait_for(rolled, 60, "the rollout completes", step=0.1)
    assert r["state"] == "completed", r
    assert [len(w) for w in r["waves"]] == [1, 2, 3]
    assert seen[-1] == set(NODES)
    for wave in r["history"]:
        assert wave["started"] <= wave["serving"] <= wave["completed"]
    round_of(nodes, co.url)
    for node in nodes:  # the old version no longer kept anywhere
        assert node.answer["model_versions"]["m"]["serve"] == 2
        assert node.answer["model_versions"]["m"]["keep"] == []
    listed = get(co.url, "/v1/rollouts")
    assert [x["id"] for x in listed] == [rollout_id] and "baseline" not in listed[0]


def test_pause_resume_and_abort(start_coordinator, tmp_path):
    co = coordinator(start_coordinator)
    nodes = fleet_with_m(co, co.url, tmp_path)
    rollout_id = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 2))[1]["rollout_id"]
    wait_for(lambda: round_of(nodes, co.url) or get(
        co.url, f"/v1/rollouts/{rollout_id}")["wave"] == 2, 30, "wave 2", step=0.1)
    status, paused, _ = request(f"{co.url}/v1/rollouts/{rollout_id}/pause", "POST")
    assert status == 200 and paused["state"] == "paused"
    assert request(f"{co.url}/v1/rollouts/{rollout_id}/pause", "POST")[0] == 409
    for _ in range(15):  # well past the bake: a paused rollout does not move
        round_of(nodes, co.url)
        time.sleep(0.1)
    r = get(co.url, f"/v1/rollouts/{rollout_id}")
    assert (r["state"], r["wave"]) == ("paused", 2)
    assert sum(n.serving == 2 for n in nodes) == 3  # the waves started keep their version
    assert request(f"{co.url}/v1/rollouts/{rollout_id}/resume", "POST")[1]["state"] \
        == "running"
    status, aborted, _ = request(f"{co.url}/v1/rollouts/{rollout_id}/abort", "POST")
    assert status == 200 and aborted["state"] == "aborted"
    round_of(nodes, co.url)
    assert [n.serving for n in nodes] == [1] * 6  # every node back on the old version
    assert get(co.url, "/v1/models/m")["version"] == 1  # and the catalog
    assert get(co.url, "/v1/models/m")["bad_versions"] == []  # aborted, not bad
    assert request(f"{co.url}/v1/rollouts/{rollout_id}/resume", "POST")[0] == 409


def test_a_breach_rolls_back_and_marks_the_version_bad_until_cleared(start_coordinator,
                                                                    tmp_path):
    co = coordinator(start_coordinator)
    nodes = fleet_with_m(co, co.url, tmp_path)
    for node in nodes:
        node.broken.add(2)
    rollout_id = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 2))[1]["rollout_id"]
    r = wait_for(lambda: round_of(nodes, co.url) or (lambda r: r if r["state"] != "running"
                 else None)(get(co.url, f"/v1/rollouts/{rollout_id}")), 30, "rolled back")
    assert r["state"] == "rolled_back" and "failed to load" in r["reason"], r
    assert r["wave"] == 1  # stopped at the canary
    model = get(co.url, "/v1/models/m")
    assert model["version"] == 1
    assert [(b["version"], b["rollout"]) for b in model["bad_versions"]] == [(2, rollout_id)]
    # the rollout is stored rolled back before the coordinator serves the new version
    # table (``FleetRollouts.run``: step, then refresh): a round may come between
    wait_for(lambda: round_of(nodes, co.url) or all(
        n.answer["model_versions"]["m"] == {"serve": 1, "keep": [], "bad": [2],
                                            "rollout": None} for n in nodes),
             5, "every node pinned to 1 with 2 bad", step=0.1)
    # not offered again: neither by the catalog nor by a rollout, until cleared
    status, doc, _ = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 2))
    assert status == 409 and "marked bad" in doc["error"] and "bad-versions/2" in doc["error"]
    status, doc, _ = request(f"{co.url}/v1/rollouts", "POST", {"model": "m", "version": 2})
    assert status == 409
    assert request(f"{co.url}/v1/models/m/bad-versions/2", "DELETE")[0] == 200
    assert request(f"{co.url}/v1/models/m/bad-versions/2", "DELETE")[0] == 404
    status, doc, _ = request(f"{co.url}/v1/rollouts", "POST",
                             {"model": "m", "version": 2, "waves": [6]})
    assert status == 201 and doc["id"] != rollout_id and doc["waves"] == [NODES]


def test_a_restarted_coordinator_resumes_at_the_same_wave(start_coordinator, tmp_path):
    state = tmp_path / "co-state"
    co = coordinator(start_coordinator, state_dir=state)
    nodes = fleet_with_m(co, co.url, tmp_path)
    rollout_id = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 2))[1]["rollout_id"]
    wait_for(lambda: round_of(nodes, co.url) or get(
        co.url, f"/v1/rollouts/{rollout_id}")["wave"] == 2, 30, "wave 2", step=0.1)
    before = get(co.url, f"/v1/rollouts/{rollout_id}")
    co.close()
    co = coordinator(start_coordinator, state_dir=state)
    after = get(co.url, f"/v1/rollouts/{rollout_id}")
    assert (after["state"], after["wave"], after["wave_started"]) == (
        "running", 2, before["wave_started"])
    round_of(nodes, co.url)
    assert sum(n.serving == 2 for n in nodes) == 3  # the nodes' answers: the same wave
    r = wait_for(lambda: round_of(nodes, co.url) or (lambda r: r if r["state"] != "running"
                 else None)(get(co.url, f"/v1/rollouts/{rollout_id}")), 60, "completed",
                 step=0.1)
    assert r["state"] == "completed" and len(r["history"]) == 3


def test_bad_requests_get_4xx_and_change_nothing(start_coordinator, tmp_path):
    co = coordinator(start_coordinator)
    post = lambda body: request(f"{co.url}/v1/rollouts", "POST", body)  # noqa: E731
    assert post({"model": "m", "version": 2})[0] == 404  # not in the catalog
    assert request(f"{co.url}/v1/models/plain", "PUT", {"slo_ms": 10})[0] == 201
    status, doc, _ = post({"model": "plain", "version": 2})
    assert status == 400 and "no source and version" in doc["error"]
    fleet_with_m(co, co.url, tmp_path)
    for body, words in (({"model": "m"}, "field 'version'"),
                        ({"model": "m", "version": "2"}, "field 'version'"),
                        ({"model": "m", "version": 1}, "serves version 1 already"),
                        ({"model": "m", "version": 2, "waves": [0]}, "rollout.waves"),
                        ({"model": "m", "version": 2, "gates": {"max_latency_ratio": -1}},
                         "max_latency_ratio"),
                        ({"model": "m", "version": 2, "colour": 1}, "colour"),
                        ({"model": "m", "version": 2, "digest": "md5:1"}, "digest"),
                        ({"model": "../x", "version": 2}, "model name")):
        status, doc, _ = post(body)
        assert status == 400 and words in doc["error"], (body, doc)
    status, doc, _ = request(f"{co.url}/v1/models/m", "PUT",
                             entry(tmp_path, 1, rollout={"bake_s": "soon"}))
    assert status == 400 and "rollout.bake_s" in doc["error"]
    for path in ("/v1/rollouts/abc", "/v1/rollouts?limit=0", "/v1/rollouts?colour=1",
                 "/v1/models/m/bad-versions/x"):
        method = "DELETE" if "bad-versions" in path else "GET"
        assert request(co.url + path, method)[0] == 400, path
    assert request(f"{co.url}/v1/rollouts/99")[0] == 404
    assert request(f"{co.url}/v1/rollouts/99/abort", "POST")[0] == 404
    assert get(co.url, "/v1/rollouts") == []
    first = post({"model": "m", "version": 2})
    assert first[0] == 201
    status, doc, _ = post({"model": "m", "version": 3})
    assert status == 409 and "under way" in doc["error"]
    status, doc, _ = request(f"{co.url}/v1/models/m", "PUT", entry(tmp_path, 3))
    assert status == 409  # nor through the catalog
    assert [r["id"] for r in get(co.url, "/v1/rollouts?active=1")] == [first[1]["id"]]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = open_store(tmp_path / "co.sqlite3")
    else:
        s = open_store(request.getfixturevalue("postgres").new_database())
    yield s
    s.close()


def test_the_store_keeps_rollouts_and_bad_versions(store):
    slo = ModelSLO("m", slo_ms=100, source="file:///m", version=1)
    store.put_model(slo, 1.0)
    before = store.version_state()

    def make(rollout_id: int) -> Rollout:
        return new_rollout(rollout_id, "m", (1, None), (2, None), RolloutSettings(),
                           ["a", "b"], {}, 99.0, 2.0)

    r = store.start_rollout(make, ModelSLO("m", slo_ms=100, source="file:///m", version=2),
                            2.0)
    assert store.version_state() != before
    assert store.model("m").version == 2 and store.rollout(r.id) == r
    with pytest.raises(RolloutConflict):  # one under way per model: nothing changes
        store.start_rollout(make, ModelSLO("m", slo_ms=1, source="file:///m", version=3), 3.0)
    assert store.model("m").version == 2 and len(store.rollouts()) == 1
    paused = r.paused(4.0)
    assert store.save_rollout(paused, was=r.updated)
    assert not store.save_rollout(r.aborted(5.0, "late"), was=r.updated)  # it changed
    ended = paused.aborted(6.0, "x")
    assert store.save_rollout(ended, was=paused.updated, slo=slo,
                              bad=("m", 2, None, "rollout 1: slow"))
    assert store.model("m").version == 1
    assert [(b["version"], b["reason"]) for b in store.bad_versions("m")] == [
        (2, "rollout 1: slow")]
    assert store.rollouts(active=True) == [] and store.rollouts(model="m") == [ended]
    assert store.clear_bad_version("m", 2) and not store.clear_bad_version("m", 2)
    again = store.start_rollout(make, ModelSLO("m", slo_ms=100, source="file:///m",
                                               version=2), 7.0)
    assert again.id > r.id


@pytest.mark.slow
def test_a_standby_coordinator_goes_on_with_the_rollout(postgres, tmp_path):
    """Two coordinator processes on one PostgreSQL: the planning one is killed mid-
    rollout; the standby takes the planning lock and steps the same rollout from the
    same wave to the end, the nodes reporting to it."""
    db = postgres.new_database()
    cfg = {**FAST, "reactive_interval_s": 1, "rollout_check_s": 0.2,
           "rollout": {**WAVES, "bake_s": 1.5}}
    leader = CoordinatorProcess(db, tmp_path / "a", **cfg)
    standby = CoordinatorProcess(db, tmp_path / "b", **cfg)
    try:
        assert (leader.plans(), standby.plans()) == (True, False)
        nodes = fleet_with_m(None, standby.url, tmp_path)
        status, doc, _ = request(f"{standby.url}/v1/models/m", "PUT", entry(tmp_path, 2))
        rollout_id = doc["rollout_id"]
        wait_for(lambda: round_of(nodes, standby.url) or get(
            standby.url, f"/v1/rollouts/{rollout_id}")["wave"] == 2, 60, "wave 2", step=0.2)
        wave = get(standby.url, f"/v1/rollouts/{rollout_id}")
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        wait_for(standby.plans, 30, "the standby takes the planning lock")
        r = wait_for(lambda: round_of(nodes, standby.url) or (
            lambda r: r if r["state"] != "running" else None)(
                get(standby.url, f"/v1/rollouts/{rollout_id}")), 60, "completed", step=0.2)
        assert r["state"] == "completed"
        assert r["history"][1]["started"] == wave["history"][1]["started"]  # not again
        assert [n.serving for n in nodes] == [2] * 6
    finally:
        standby.stop()
        leader.stop()


def test_a_put_rolls_out_with_the_settings_it_puts(start_coordinator, tmp_path):
    co = coordinator(start_coordinator)
    fleet_with_m(co, co.url, tmp_path)
    status, doc, _ = request(f"{co.url}/v1/models/m", "PUT",
                             entry(tmp_path, 2, rollout={"waves": [3], "bake_s": 5}))
    r = get(co.url, f"/v1/rollouts/{doc['rollout_id']}")
    assert [len(w) for w in r["waves"]] == [3, 3] and r["settings"]["bake_s"] == 5
