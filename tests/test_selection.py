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
