"""Cache admin API and cache behaviour seen over HTTP, on a real server."""

import concurrent.futures as cf

import numpy as np

from agent.modelzoo import mlp_forward
from tests.helpers import add_mlp, add_synthetic

FIELDS = {"name", "version", "backend", "device", "state", "size_bytes", "size_estimated",
          "load_seconds", "loads", "hits", "misses", "evictions", "last_used",
          "request_rate", "utility", "pinned", "in_flight"}
ZOO = {f"m{i}": dict(inputs=32, hidden=512, layers=2, outputs=4, seed=i) for i in range(4)}


def infer(agent, name, x):
    return agent.request("POST", f"/v2/models/{name}/infer", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]})


def test_eviction_under_a_budget_smaller_than_the_zoo(repo, start_agent):
    for name, shape in ZOO.items():
        add_mlp(repo, name, **shape)
    # Room for ~2 of the 4 models at their (tight) estimates.
    from agent.backends import make_backend
    from agent.config import parse_model_config
    from agent.memory import FootprintModel
    m0 = make_backend("onnx", "m0", 1, repo / "m0", parse_model_config({}), FootprintModel())
    budget = int(m0.estimate() * 2.5)
    agent = start_agent(repo, budget=budget)
    x = np.ones((2, 32), np.float32)
    for _ in range(2):
        for name, shape in ZOO.items():
            status, _, body = infer(agent, name, x)
            assert status == 200, body
            np.testing.assert_allclose(body["outputs"][0]["data"],
                                       mlp_forward(x, **shape).ravel(), rtol=1e-4, atol=1e-5)
    _, _, listing = agent.request("GET", "/v1/cache")
    assert {m["name"] for m in listing} == set(ZOO) and FIELDS <= set(listing[0])
    ready = [m for m in listing if m["state"] == "ready"]
    assert all(not m["size_estimated"] for m in ready)
    assert sum(m["size_bytes"] for m in ready) <= budget
    assert 1 <= len(ready) < len(ZOO)
    assert sum(m["evictions"] for m in listing) >= 3
    assert sum(m["loads"] for m in listing) > len(ZOO)  # some were evicted and reloaded
    memory = agent.node.cache.memory()["cpu"]
    assert memory["used_bytes"] == sum(m["size_bytes"] for m in ready)


def test_concurrent_requests_for_a_cold_model_cause_one_load(repo, start_agent):
    add_synthetic(repo, "cold", load_ms=300, base_ms=1)
    agent = start_agent(repo)
    x = np.ones((1, 3), np.float32)
    with cf.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda _: infer(agent, "cold", x), range(16)))
    assert all(r[0] == 200 for r in replies)
    _, _, info = agent.request("GET", "/v1/cache/cold")
    assert info["loads"] == 1 and info["misses"] + info["hits"] == 16 and info["misses"] >= 1


def test_pin_unpin_evict_and_in_use(repo, start_agent):
    add_synthetic(repo, "slow", base_ms=2000, size_bytes=60_000_000)  # in flight long enough on a loaded box
    add_synthetic(repo, "other", size_bytes=60_000_000)
    add_synthetic(repo, "third", size_bytes=60_000_000)
    agent = start_agent(repo, budget=130_000_000)
    x = np.ones((1, 2), np.float32)
    assert infer(agent, "slow", x)[0] == 200
    status, _, body = agent.request("POST", "/v1/cache/slow/pin")
    assert status == 200 and body["pinned"] is True
    assert infer(agent, "other", x)[0] == 200
    assert infer(agent, "third", x)[0] == 200  # evicts "other", never the pinned "slow"
    _, _, listing = agent.request("GET", "/v1/cache")
    states = {m["name"]: m["state"] for m in listing}
    assert states == {"slow": "ready", "other": "unloaded", "third": "ready"}
    status, _, body = agent.request("POST", "/v1/cache/slow/evict")
    assert status == 409 and "pinned" in body["error"]
    assert agent.request("POST", "/v1/cache/slow/unpin")[2]["pinned"] is False
    with cf.ThreadPoolExecutor(1) as pool:  # a request in flight on "slow"
        pending = pool.submit(infer, agent, "slow", x)
        import time
        time.sleep(0.3)
        _, _, info = agent.request("GET", "/v1/cache/slow")
        assert info["in_flight"] == 1
        status, _, body = agent.request("POST", "/v1/cache/slow/evict")
        assert status == 409 and "in flight" in body["error"]
        # and the cache will not evict it for another model either: "other" waits for
        # the request on "slow" to end, then takes its room
        agent.request("POST", "/v1/cache/third/pin")
        status, headers, body = infer(agent, "other", x)
        assert status == 200, body
        # the request on "slow" was answered before "other" took its room; its client
        # thread may still be reading that answer, hence the wait
        assert pending.result(timeout=10)[0] == 200
    status, _, body = agent.request("POST", "/v1/cache/slow/evict")
    assert status == 200 and body["state"] == "unloaded" and body["evictions"] == 1
    assert agent.request("POST", "/v1/cache/nope/evict")[0] == 404
    assert agent.request("POST", "/v1/cache/slow/explode")[0] == 404


def test_model_that_can_never_fit(repo, start_agent):
    add_synthetic(repo, "whale", size_bytes=300_000_000)
    agent = start_agent(repo, budget=100_000_000)
    status, _, body = infer(agent, "whale", np.ones((1, 1), np.float32))
    assert status == 507 and "whole cpu budget" in body["error"]
    _, _, info = agent.request("GET", "/v1/cache/whale")
    assert info["state"] == "failed" and "budget" in info["error"]


def test_admin_token_is_enforced(repo, start_agent, tmp_path):
    add_synthetic(repo, "s")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-0123456789abcdef0123456789abcdef\n")
    agent = start_agent(repo, admin_token_file=token_file)
    for method, path in [("GET", "/v1/cache"), ("GET", "/v1/cache/s"),
                         ("POST", "/v1/cache/s/pin"), ("POST", "/v2/repository/index"),
                         ("POST", "/v2/repository/models/s/load")]:
        status, headers, body = agent.request(method, path)
        assert status == 401 and "Bearer" in body["error"], path
        status, _, _ = agent.request(method, path, headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, _, _ = agent.request(method, path, headers={"Authorization": "Bearer s3cret-0123456789abcdef0123456789abcdef"})
        assert status == 200, path
    # health stays open; inference needs the token too (auth.protect's default)
    assert agent.request("GET", "/v2/health/ready")[0] == 200
    assert infer(agent, "s", np.ones((1, 1), np.float32))[0] == 401
