"""The prediction cache (Clipper §4.2): CLOCK eviction under a byte bound, single flight
for identical inputs, invalidation, and hits that skip the backend on a real agent."""

import asyncio

import numpy as np
import pytest

from agent.node.prediction_cache import ENTRY_OVERHEAD, PredictionCache, input_digest
from tests.helpers import Recorder, add_synthetic, call_model, start_serving, stop_serving


def value(n_floats):
    return {"Y": np.zeros(n_floats, np.float32)}


def slot(n_floats):
    return ENTRY_OVERHEAD + 4 * n_floats


def test_clock_gives_referenced_entries_a_second_chance():
    cache = PredictionCache(max_bytes=3 * slot(10))
    for key in (b"a", b"b", b"c"):
        assert cache.put(key, value(10))
    assert cache.get(b"a") is not None          # a referenced
    cache.put(b"d", value(10))                  # hand: a (clear bit, skip), evict b
    assert b"b" not in cache and {b"a", b"c", b"d"} <= set(cache._ring)
    cache.put(b"e", value(10))                  # hand: c (unreferenced) goes
    assert b"c" not in cache and b"a" in cache
    cache.put(b"f", value(10))                  # a's bit was cleared: now it goes
    assert b"a" not in cache
    assert cache.evictions == 3 and cache.bytes == 3 * slot(10)


def test_byte_bound_and_oversized_entries():
    cache = PredictionCache(max_bytes=1000)
    assert not cache.put(b"big", value(1000))   # larger than the whole bound: not cached
    assert len(cache) == 0 and cache.bytes == 0
    for i in range(50):
        cache.put(bytes([i]), value(i))
        assert cache.bytes <= 1000
    big = cache.put(b"x", value((1000 - ENTRY_OVERHEAD) // 4))  # exactly the bound
    assert big and len(cache) == 1
    stored = cache.get(b"x")["Y"]
    with pytest.raises(ValueError):
        stored[0] = 1                           # cached outputs are read-only


def test_digest_covers_values_dtype_shape_and_parameters():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    same = input_digest({"X": x.copy()})
    assert input_digest({"X": x}) == same
    assert input_digest({"X": x.reshape(3, 2)}) != same
    assert input_digest({"X": x.astype(np.float64)}) != same
    assert input_digest({"X": x + 1}) != same
    assert input_digest({"X": x}, {"p": 1}) != same
    assert input_digest({"S": np.array([b"ab", b"c"], dtype=object)}) != \
        input_digest({"S": np.array([b"a", b"bc"], dtype=object)})


async def test_identical_concurrent_requests_share_one_computation():
    cache, calls = PredictionCache(10**6), []

    async def compute():
        calls.append(1)
        await asyncio.sleep(0.05)
        return value(4)
    results = await asyncio.gather(*(cache.get_or_compute(b"k", compute) for _ in range(10)))
    assert len(calls) == 1 and cache.misses == 1 and cache.hits == 9
    assert sum(shared for _, shared in results) == 9
    _, shared = await cache.get_or_compute(b"k", compute)
    assert shared and len(calls) == 1 and cache.hits == 10


async def test_a_failed_computation_is_shared_and_not_cached():
    cache, calls = PredictionCache(10**6), []

    async def fail():
        calls.append(1)
        await asyncio.sleep(0.02)
        raise RuntimeError("boom")
    results = await asyncio.gather(*(cache.get_or_compute(b"k", fail) for _ in range(4)),
                                   return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and len(calls) == 1
    assert b"k" not in cache


async def test_a_cancelled_leader_hands_over_to_a_waiter():
    cache, calls = PredictionCache(10**6), []

    async def compute():
        calls.append(1)
        await asyncio.sleep(0.05)
        return value(4)
    leader = asyncio.ensure_future(cache.get_or_compute(b"k", compute))
    await asyncio.sleep(0.01)
    waiter = asyncio.ensure_future(cache.get_or_compute(b"k", compute))
    await asyncio.sleep(0.01)
    leader.cancel()
    out, shared = await waiter
    assert not shared and len(calls) == 2 and out["Y"].shape == (4,)


async def test_invalidation_while_computing_is_not_stored():
    cache = PredictionCache(10**6)

    async def compute():
        await asyncio.sleep(0.02)
        return value(4)
    task = asyncio.ensure_future(cache.get_or_compute(b"k", compute))
    await asyncio.sleep(0.005)
    cache.clear()
    await task
    assert b"k" not in cache


async def test_hits_skip_the_backend_and_unload_invalidates(repo):
    add_synthetic(repo, "m", base_ms=20, prediction_cache={"enabled": True,
                                                           "max_bytes": "1MB"})
    add_synthetic(repo, "plain", base_ms=5)
    recorder = Recorder()
    cache, serving = await start_serving(repo, recorder)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    first = await call_model(serving, "m", x)
    again = await asyncio.gather(*(call_model(serving, "m", x) for _ in range(5)))
    assert len(recorder.calls) == 1                     # five hits, no backend call
    assert all(np.array_equal(a, first) for a in again)
    await call_model(serving, "m", x + 1)                     # another input: computed
    assert len(recorder.calls) == 2
    await call_model(serving, "m", x, parameters={"timeout": 10**7})  # not a backend parameter
    assert len(recorder.calls) == 2
    info = serving.describe(cache.entry("m"))["prediction_cache"]
    assert (info["hits"], info["misses"], info["entries"]) == (6, 2, 2)
    await cache.evict("m")                              # unload: invalidated
    assert serving.runtime(cache.entry("m")).prediction_cache.describe()["entries"] == 0
    await call_model(serving, "m", x)
    assert len(recorder.calls) == 3
    await call_model(serving, "plain", x)
    await call_model(serving, "plain", x)
    assert sum(name == "plain" for name, _ in recorder.calls) == 2  # off by default
    assert serving.describe(cache.entry("plain"))["prediction_cache"] is None
    await stop_serving(cache, serving)


def test_prediction_cache_counters_in_metrics(repo, start_agent):
    add_synthetic(repo, "m", prediction_cache={"enabled": True})
    agent = start_agent(repo)
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    for _ in range(3):
        status, _, body = agent.request("POST", "/v2/models/m/infer", doc)
        assert status == 200 and body["outputs"][0]["data"] == [3.0]
    text = agent.request("GET", "/metrics")[2].decode()
    assert 'edgeagent_prediction_cache_hits_total{device="cpu",model="m",version="1"} 2.0' in text
    assert 'edgeagent_prediction_cache_misses_total{device="cpu",model="m",version="1"} 1.0' in text
    info = agent.request("GET", "/v1/cache/m")[2]
    assert info["prediction_cache"]["hits"] == 2
