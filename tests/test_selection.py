"""Selection apps served by a live agent (issue 24): members called through the
ordinary serving path, answers with id/confidence/models_used/missing, feedback that
teaches the policy (and a failed member losing weight then regaining it), contexts,
stragglers cut at the deadline, persistence across a restart, inspection, bad input."""

import concurrent.futures
import json

import numpy as np
import pytest
from tests.helpers import add_app, add_classifier

#: Five classifier members: m0 the best, the rest worse.
ERRORS = (0.05, 0.2, 0.25, 0.3, 0.35)


def add_members(repo, errors=ERRORS, base_ms=1.0, size_bytes=10_000_000, seed=7,
                **per_member):
    for i, err in enumerate(errors):
        options = {"classes": 10, "seed": seed, "error": err, **per_member.get(f"m{i}", {})}
        add_classifier(repo, f"m{i}", base_ms=base_ms, size_bytes=size_bytes, **options)
    return [f"m{i}" for i in range(len(errors))]


def rows(ids, truth, group=0):
    ids = np.asarray(ids, np.float32)
    return np.stack([ids, np.asarray(truth, np.float32) % 10,
                     np.full_like(ids, group)], 1)


def infer_body(x, **params):
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                        "data": x.reshape(-1).tolist()}]}
    if params:
        body["parameters"] = params
    return body


def ask(agent, app, ids, truth, rid=None, **params):
    body = infer_body(rows(ids, truth), **params)
    if rid is not None:
        body["id"] = rid
    status, _, doc = agent.request("POST", f"/v2/models/{app}/infer", body)
    return status, doc


def test_app_answers_through_members_and_learns_from_feedback(repo, start_agent):
    add_members(repo)
    add_app(repo, "vote", [f"m{i}" for i in range(5)])
    agent = start_agent(repo)
    status, _, index = agent.request("POST", "/v2/repository/index")
    assert {"name": "vote", "version": "1", "state": "READY"} in index
    status, _, meta = agent.request("GET", "/v2/models/vote")
    assert status == 200 and meta["platform"] == "selection"
    assert meta["outputs"] == [{"name": "Y", "datatype": "INT64", "shape": [-1, 1]}]
    rng = np.random.default_rng(1)

    def one(q):
        truth = int(rng.integers(0, 10))
        status, doc = ask(agent, "vote", [q], [truth], rid=f"q{q}")
        assert status == 200, doc
        fb = agent.request("POST", "/v2/models/vote/feedback",
                           {"id": doc["id"], "labels": [truth]})
        assert fb[0] == 200 and fb[2] == {"accepted": 1, "unknown_ids": []}, fb
        return doc, truth

    doc, truth = one(0)
    assert doc["id"] == "q0" and doc["model_name"] == "vote"
    out = doc["outputs"][0]
    assert out["name"] == "Y" and out["datatype"] == "INT64" and out["shape"] == [1, 1]
    p = doc["parameters"]
    assert p["models_used"] == "m0:1,m1:1,m2:1,m3:1,m4:1" and p["missing"] == ""
    assert 0 < p["confidence"] <= 1 and p["default"] is False
    for q in range(1, 300):
        one(q)
    status, _, shown = agent.request("GET", "/v1/selection/vote")
    weights = [m["weight"] for m in shown["members"]]
    assert weights[0] == max(weights) and weights[0] > 0.5, weights
    assert shown["feedback"]["accepted"] == 300
    # members were served by the ordinary path: counted as accesses in the cache
    _, _, cache = agent.request("GET", "/v1/cache/m3")
    assert cache["requests_served"] >= 300
    _, _, text = agent.request("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                 if line.startswith("edgeagent_selection") or (
                     line.startswith("edgeagent_requests_total") and 'model="vote"' in line))
    assert float(lines['edgeagent_selection_member_selected_total{app="vote",member="m0:1"}']
                 ) == 300
    assert float(lines['edgeagent_selection_feedback_total{app="vote",outcome="accepted"}']
                 ) == 300
    assert float(lines['edgeagent_selection_confidence_count{app="vote"}']) == 300
    assert 0.5 < float(lines['edgeagent_selection_member_weight{app="vote",member="m0:1"}'])
    assert any("endpoint=\"v2\"" in k and "code=\"200\"" in k for k in lines)


def test_concurrent_clients_get_their_own_ids(repo, start_agent):
    add_members(repo, base_ms=2)
    add_app(repo, "vote", [f"m{i}" for i in range(5)])
    agent = start_agent(repo)

    def client(c):
        got = []
        for q in range(20):
            status, doc = ask(agent, "vote", [c * 100 + q], [q], rid=f"c{c}-{q}")
            got.append((status, doc.get("id"), doc["outputs"][0]["data"]))
        return got

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(client, range(8)) for r in rs]
    assert all(status == 200 for status, _, _ in results)
    assert len({rid for _, rid, _ in results}) == 160
    _, _, shown = agent.request("GET", "/v1/selection/vote")
    assert shown["feedback"]["pending"] == 160 and shown["requests"] == 160


def _train(agent, app, queries, start=0, seed=3, context=None, group=0):
    """Ask and give feedback for ``queries`` one-row queries; the members' weights
    after each (from inspection, every 10th query)."""
    rng = np.random.default_rng(seed)
    history = []
    params = {"context": context} if context else {}
    for q in range(start, start + queries):
        truth = int(rng.integers(0, 10))
        body = infer_body(rows([q], [truth], group), **params)
        status, _, doc = agent.request("POST", f"/v2/models/{app}/infer", body)
        assert status == 200, doc
        fb = {"id": doc["id"], "labels": [truth]}
        status, _, ok = agent.request("POST", f"/v2/models/{app}/feedback", fb)
        assert status == 200 and ok["accepted"] == 1, ok
        if q % 10 == 9:
            path = f"/v1/selection/{app}" + (f"/contexts/{context}" if context else "")
            shown = agent.request("GET", path)[2]
            history.append((q, [m["weight"] for m in shown["members"]]))
    return history


@pytest.mark.parametrize("policy", ["exp4", "exp3"])
def test_a_failed_member_loses_weight_and_regains_it_after_healing(repo, start_agent,
                                                                   policy):
    # exp3 picks at random (unseeded): with these spans, 5,000 simulated runs of the
    # policy on these members all passed; with 100 queries each side, 0.6 % failed
    add_members(repo, errors=(0.05, 0.3, 0.35), m0={"schedule": [[150, 300, 1.0]]})
    add_app(repo, "app", ["m0", "m1", "m2"], policy=policy)
    agent = start_agent(repo)
    history = _train(agent, "app", 600)

    def leader(q):
        return max((w, i) for i, w in enumerate(dict(history)[q]))[1]

    assert leader(149) == 0                       # learned the best member
    assert leader(299) != 0                       # moved off it while it failed
    assert leader(599) == 0                       # and came back once it healed


def test_stragglers_are_cut_at_the_deadline_and_renormalised(repo, start_agent):
    add_members(repo, errors=(0.1, 0.1, 0.1))
    add_classifier(repo, "slow", base_ms=800, classes=10, seed=7, error=0.1)
    add_app(repo, "fast", ["m0", "m1", "m2", "slow"], slo_ms=100)
    agent = start_agent(repo)
    assert agent.request("POST", "/v2/repository/models/fast/load")[0] == 200
    import time
    started = time.perf_counter()
    status, doc = ask(agent, "fast", [1], [4])
    elapsed = time.perf_counter() - started
    assert status == 200 and elapsed < 0.6, (elapsed, doc)  # never waited for "slow"
    p = doc["parameters"]
    assert p["missing"] == "slow:1:deadline" and p["models_used"] == "m0:1,m1:1,m2:1"
    assert p["confidence"] <= 0.75
    # the app's own answer time (arrival to answer): it waited for the stragglers until
    # shortly before the deadline (the cut's margin is at most a tenth of the SLO)
    for q in range(2, 5):
        assert ask(agent, "fast", [q], [4])[1]["parameters"]["missing"] == "slow:1:deadline"
    answer_ms = agent.request("GET", "/v1/selection/fast")[2]["answer_ms"]
    assert answer_ms["of"] == 4 and 90 <= answer_ms["p50"] <= answer_ms["max"] < 600, answer_ms
    # the cut calls were stopped (their answers were not needed), not run out behind
    # the next request's: "slow" never finished one, well after its 800 ms
    time.sleep(1.0)
    stats = agent.request("GET", "/v2/models/slow/stats")[2]["model_stats"][0]
    assert stats["execution_count"] == 0, stats
    # a client's tighter timeout (microseconds) cuts sooner still; rows all default
    # when no member can answer in time (slow alone)
    add_app(repo, "lonely", ["slow"], slo_ms=50, default_output=[-1])
    agent.request("POST", "/v2/repository/index")  # rescan: the new app is served
    status, doc = ask(agent, "lonely", [1], [4], timeout=20_000)
    assert status == 200 and doc["outputs"][0]["data"] == [-1], doc
    assert doc["parameters"]["default"] is True
    assert doc["parameters"]["missing"] == "slow:1:deadline"


def test_min_confidence_answers_the_default_flagged(repo, start_agent):
    add_members(repo, errors=(0.0, 1.0, 1.0), seed=1)
    add_app(repo, "sure", ["m0", "m1", "m2"], min_confidence=0.6, default_output=[-7])
    agent = start_agent(repo)
    status, doc = ask(agent, "sure", [1, 2, 3], [1, 2, 3])
    assert status == 200
    # one member right, two wrong (and rarely agreeing): nobody holds 60 %
    assert doc["outputs"][0]["data"] == [-7, -7, -7] and doc["parameters"]["default"]


def test_cold_members_count_missing_and_the_budget_holds_the_ones_worth_it(repo,
                                                                         start_agent):
    add_members(repo, errors=(0.05, 0.25, 0.3, 0.35, 0.4), size_bytes=10_000_000)
    add_app(repo, "app", [f"m{i}" for i in range(5)])
    agent = start_agent(repo, budget=25_000_000)  # room for 2 of the 5
    _train(agent, "app", 300)
    loads_before = sum(agent.request("GET", f"/v1/cache/m{i}")[2]["loads"] for i in range(5))
    # members are seen one after another, not a load per answer (5 read signatures first)
    assert loads_before <= 20, loads_before
    _, _, shown = agent.request("GET", "/v1/selection/app")
    assert shown["members"][0]["weight"] > 0.5
    missing = {m["member"]: m["missing"].get("cold", 0) for m in shown["members"]}
    assert sum(missing.values()) > 0  # some members were not resident and not waited for
    _train(agent, "app", 300, start=300, seed=4)
    loads_after = sum(agent.request("GET", f"/v1/cache/m{i}")[2]["loads"] for i in range(5))
    assert loads_after - loads_before <= 1
    assert agent.request("GET", "/v1/cache/m0")[2]["state"] == "ready"


def test_contexts_learn_apart_and_start_from_the_global_state(repo, start_agent):
    # m0 fails on group 1, m1 on group 2: each user's best member is the other one
    add_members(repo, errors=(0.1, 0.1), m0={"groups": {1: 0.9}}, m1={"groups": {2: 0.9}})
    add_app(repo, "app", ["m0", "m1"], max_contexts=2, write_every_s=0.2)
    agent = start_agent(repo)
    _train(agent, "app", 60)  # global: both good on group 0
    global_weights = [m["weight"] for m in agent.request("GET", "/v1/selection/app")[2][
        "members"]]
    _train(agent, "app", 100, start=1000, context="alice", group=1)
    _train(agent, "app", 100, start=2000, context="bob", group=2)
    alice = agent.request("GET", "/v1/selection/app/contexts/alice")[2]["members"]
    bob = agent.request("GET", "/v1/selection/app/contexts/bob")[2]["members"]
    assert alice[1]["weight"] > 0.8 and bob[0]["weight"] > 0.8
    # a new user starts from the global state (not from another user's)
    status, doc = ask(agent, "app", [5000], [1], context="carol")
    assert status == 200
    carol = agent.request("GET", "/v1/selection/app/contexts/carol")[2]
    assert [m["weight"] for m in carol["members"]] == global_weights
    # the users' feedback taught their own states, not the global one
    assert [m["weight"] for m in agent.request("GET", "/v1/selection/app")[2][
        "members"]] == global_weights
    # three contexts, room for two in memory: the oldest left memory, not the store
    shown = agent.request("GET", "/v1/selection/app")[2]
    assert shown["contexts_in_memory"] == 2
    assert set(shown["contexts"]) >= {"alice", "bob"}
    again = agent.request("GET", "/v1/selection/app/contexts/alice")[2]["members"]
    assert [m["weight"] for m in again] == [m["weight"] for m in alice]


def test_bad_input_gets_a_4xx_naming_the_problem_and_loses_nothing(repo, start_agent):
    add_members(repo, errors=(0.1, 0.2))
    (repo / "odd").mkdir()
    (repo / "odd" / "config.yaml").write_text(
        "backend: synthetic\nsynthetic: {base_ms: 0}\n")  # X [N, k] -> Y FP32 [N, 1]
    add_app(repo, "app", ["m0", "m1"])
    add_app(repo, "ghost", ["m0", "nowhere"])
    add_app(repo, "mixed", ["m0", "odd"])
    add_app(repo, "nested", ["m0", "app"])
    agent = start_agent(repo)
    status, doc = ask(agent, "app", [1, 2], [3, 4], rid="two-rows")
    assert status == 200
    bad = [({"id": "two-rows", "labels": [3]}, "one per row"),
           ({"id": "two-rows", "labels": [3, -1]}, "class ids"),
           ({"id": "two-rows", "labels": [3, 1.5]}, "class ids"),
           ({"id": "two-rows", "labels": "3,4"}, "list of numbers"),
           ({"id": "two-rows", "losses": [0, 1]}, "labels"),
           ({"id": "two-rows"}, "either 'labels'"),
           ({"id": 7, "labels": [1, 2]}, "'id'"),
           ({"id": "two-rows", "labels": [3, 4], "context": "x" * 300}, "characters"),
           ({"id": "two-rows", "labels": [3, 4], "extra": 1}, "unknown field"),
           ({"feedback": [{"id": "two-rows", "labels": [3, 4]}, {"id": "z"}]},
            "feedback[1]"),
           ([1, 2], "JSON object")]
    for body, words in bad:
        status, _, reply = agent.request("POST", "/v2/models/app/feedback", body)
        assert status == 400 and words in reply["error"], (body, reply)
    status, _, reply = agent.request("POST", "/v2/models/app/feedback", b"{not json")
    assert status == 400
    # nothing was learned or lost by the bad bodies: the prediction still takes feedback
    status, _, reply = agent.request("POST", "/v2/models/app/feedback",
                                     {"feedback": [{"id": "two-rows", "labels": [3, 4]},
                                                   {"id": "never-made", "labels": [1]}]})
    assert status == 200 and reply == {"accepted": 1, "unknown_ids": ["never-made"]}
    shown = agent.request("GET", "/v1/selection/app")[2]
    assert shown["feedback"]["accepted"] == 1 and shown["feedback"]["unmatched"] == 1
    # a context over the limit, a non-app, apps naming a missing model, another app, or
    # members that disagree
    status, doc = ask(agent, "app", [1], [3], context="y" * 300)
    assert status == 400 and "context" in doc["error"]
    status, doc = ask(agent, "app", [], [])
    assert status == 400 and "at least one row" in doc["error"], doc
    status, _, reply = agent.request("POST", "/v2/models/m0/feedback",
                                     {"id": "a", "labels": [1]})
    assert status == 404
    for app, words in (("ghost", "'nowhere' is not in the repository"),
                       ("nested", "is a selection app"),
                       ("mixed", "m0:1 and odd:1 take different inputs")):
        status, doc = ask(agent, app, [1], [3])
        assert status == 400 and words in doc["error"], doc
    index = agent.request("POST", "/v2/repository/index")[2]
    ghost = next(m for m in index if m["name"] == "ghost")
    assert ghost["state"] == "UNAVAILABLE" and "nowhere" in ghost["reason"]
    status, _, reply = agent.request("POST", "/v1/selection/app/weights",
                                     {"weights": {"m9:1": 1}})
    assert status == 400 and "unknown member" in reply["error"]


def _train_http(url, app, queries, start=0, context=None):
    from tests.helpers import request

    rng = np.random.default_rng(start)
    for q in range(start, start + queries):
        truth = int(rng.integers(0, 10))
        params = {"context": context} if context else {}
        status, doc, _ = request(f"{url}/v2/models/{app}/infer",
                                 "POST", infer_body(rows([q], [truth]), **params))
        assert status == 200, doc
        status, ok, _ = request(f"{url}/v2/models/{app}/feedback", "POST",
                                {"id": doc["id"], "labels": [truth]})
        assert ok["accepted"] == 1


def _weights(agent, path):
    return [m["weight"] for m in agent.get(path)["members"]]


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_restart_keeps_what_was_learned(repo, tmp_path, signal_name):
    import signal
    import time

    from tests.helpers import Agent

    add_members(repo, errors=(0.05, 0.4, 0.45))
    add_app(repo, "app", ["m0", "m1", "m2"], write_every_s=0.3)
    agent = Agent(repo, tmp_path / "data")
    try:
        _train_http(agent.url, "app", 40)
        _train_http(agent.url, "app", 40, start=100, context="alice")
        before = {p: _weights(agent, p) for p in ("/v1/selection/app",
                                                  "/v1/selection/app/contexts/alice")}
        assert before["/v1/selection/app"][0] > 0.5
        if signal_name == "SIGTERM":
            assert agent.stop() == 0
        else:
            time.sleep(1.0)  # past the write-behind interval
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait(30)
    finally:
        if agent.proc.poll() is None:
            agent.stop()
    again = Agent(repo, tmp_path / "data")
    try:
        after = {p: _weights(again, p) for p in before}
        assert after == before
    finally:
        again.stop()


def test_tritonclient_grpc_and_tf_rest_read_an_apps_answer(repo, start_agent):
    import tritonclient.http as httpclient

    add_members(repo, errors=(0.1, 0.2, 0.3))
    add_app(repo, "app", ["m0", "m1", "m2"])
    agent = start_agent(repo)
    x = rows([1, 2], [3, 4])
    client = httpclient.InferenceServerClient(agent.url.removeprefix("http://"))
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer("app", [inp], request_id="tc-1", parameters={"context": "u7"})
    y = result.as_numpy("Y")
    assert y.dtype == np.int64 and y.shape == (2, 1)
    response = result.get_response()
    assert response["id"] == "tc-1" and response["parameters"]["models_used"]
    assert client.is_model_ready("app")
    # TF Serving REST: the predictions, with the app's answer beside them
    status, _, doc = agent.request("POST", "/v1/models/app:predict",
                                   {"instances": x.tolist()})
    assert status == 200 and np.asarray(doc["predictions"]).shape == (2, 1), doc
    assert doc["parameters"]["confidence"] > 0 and doc["id"]


def test_grpc_serves_an_app_with_its_parameters(repo, start_agent):
    import tritonclient.grpc as grpcclient

    from agent.node.grpc_v2 import start_grpc

    add_members(repo, errors=(0.1, 0.2, 0.3))
    add_app(repo, "app", ["m0", "m1", "m2"])
    agent = start_agent(repo)
    server = agent.call(start_grpc(agent.node, "127.0.0.1", 0))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        x = rows([1], [5])
        inp = grpcclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.infer("app", [inp])  # the members resident (a first call finds them cold)
        result = client.infer("app", [inp], request_id="g-1", parameters={"context": "u1"})
        assert result.as_numpy("Y").shape == (1, 1)
        response = result.get_response()
        assert response.id == "g-1"
        # every member is either used or named missing with its reason (on a loaded box
        # one may miss the deadline)
        used = [m for m in response.parameters["models_used"].string_param.split(",") if m]
        missing = [m for m in response.parameters["missing"].string_param.split(",") if m]
        assert sorted(used + [m.rsplit(":", 1)[0] for m in missing]) == [
            "m0:1", "m1:1", "m2:1"], (used, missing)
        assert all(m.rsplit(":", 1)[1] in ("deadline", "cold", "shed", "error")
                   for m in missing), missing
        assert (0 < response.parameters["confidence"].double_param <= 1) == bool(used)
        assert client.is_model_ready("app")
        feedback = agent.request("POST", "/v2/models/app/feedback",
                                 {"id": "g-1", "labels": [5]})
        assert feedback[2] == {"accepted": 1, "unknown_ids": []}
    finally:
        agent.call(server.stop(0))


def test_cli_lists_shows_and_resets_apps(repo, start_agent):
    from click.testing import CliRunner

    from agent.cli import main

    add_members(repo, errors=(0.05, 0.4))
    add_app(repo, "app", ["m0", "m1"])
    agent = start_agent(repo)
    _train(agent, "app", 30, context="u1")
    runner = CliRunner()
    listed = runner.invoke(main, ["selection", "--url", agent.url, "ls"])
    assert listed.exit_code == 0, listed.output
    assert "app" in listed.output and "exp4" in listed.output and "m0:1" in listed.output
    shown = runner.invoke(main, ["selection", "show", "app", "--context", "u1", "--json",
                                 "--url", agent.url])
    doc = json.loads(shown.output)
    assert doc["context"] == "u1" and doc["members"][0]["weight"] > 0.5
    table = runner.invoke(main, ["selection", "--url", agent.url, "show", "app"])
    assert "MEMBER" in table.output and "m1:1" in table.output
    reset = runner.invoke(main, ["selection", "--url", agent.url, "reset", "app", "--json"])
    assert reset.exit_code == 0
    assert [m["weight"] for m in json.loads(reset.output)["members"]] == [0.5, 0.5]
    cache_ls = runner.invoke(main, ["cache", "--url", agent.url, "ls"])
    assert cache_ls.exit_code == 0 and "APP" in cache_ls.output, cache_ls.output
    assert "m0" in cache_ls.output.split("APP")[0] and "exp4" in cache_ls.output
    missing = runner.invoke(main, ["selection", "--url", agent.url, "show", "nope"])
    assert missing.exit_code != 0 and "nope" in missing.output


def test_weights_set_by_hand_and_frozen_hold_against_feedback(repo, start_agent):
    add_members(repo, errors=(0.05, 0.5))
    add_app(repo, "canary", ["m0", "m1"], policy="static", weights=[0.5, 0.5])
    add_app(repo, "learner", ["m0", "m1"])
    agent = start_agent(repo)
    status, _, doc = agent.request("POST", "/v1/selection/canary/weights",
                                   {"weights": {"m0:1": 9, "m1:1": 1}, "freeze": True})
    assert status == 200 and doc["frozen"] is True
    assert [m["weight"] for m in doc["members"]] == [0.9, 0.1]
    picks = [ask(agent, "canary", [q], [1])[1]["parameters"]["models_used"]
             for q in range(100)]
    assert 0.78 < picks.count("m0:1") / 100 < 0.99  # the split set by hand
    status, _, doc = agent.request("POST", "/v1/selection/canary/reset")
    assert [m["weight"] for m in doc["members"]] == [0.5, 0.5] and doc["frozen"] is False
    # a learning app frozen by hand keeps its weights whatever the feedback says
    agent.request("POST", "/v1/selection/learner/weights", {"weights": [1, 3],
                                                            "freeze": True})
    _train(agent, "learner", 20)
    shown = agent.request("GET", "/v1/selection/learner")[2]
    assert [m["weight"] for m in shown["members"]] == [0.25, 0.75]
    assert shown["feedback"]["accepted"] == 20
