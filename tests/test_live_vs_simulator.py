"""One miss path: the live agent and ``simulate --queueing`` make the same decisions.

A trace (Zipf over 12 models, Poisson arrivals) is replayed against a real agent over
HTTP, in real time, with synthetic models that carry the profiles' load and exec times
and sizes; the same trace goes through the simulator's queueing replay with the same
policy, budget and enough workers that none waits for one (the agent has no global
worker limit). Loads (misses), hits, evictions agree within 5 %, mean response time
within 15 %. The agent counts a request that waits for a load already under way as a
miss of its own; the simulator counts it a hit that waits (single flight), so misses
are compared as loads.
"""

import asyncio
import time

import numpy as np
import pytest

from cachepolicies.simulator import simulate
from cachepolicies.traces import make_profiles, make_trace
from tests.helpers import add_synthetic

MB = 1_000_000


def workload(seed=5, models=12, requests=240, rate=12.0):
    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(models)]
    sizes = rng.integers(10, 40, models) * MB
    loads = rng.uniform(0.2, 0.5, models)
    execs = rng.uniform(0.06, 0.12, models)  # well above the HTTP round trip
    weights = 1 / np.arange(1, models + 1) ** 0.9
    picks = rng.choice(models, requests, p=weights / weights.sum())
    times = np.cumsum(rng.exponential(1 / rate, requests))
    profiles = make_profiles(names, sizes, loads, execs)
    trace = make_trace(times - times[0], [names[i] for i in picks], profiles)
    return names, sizes, loads, execs, trace, profiles


async def replay_live(url, trace, names):
    """Send each request at its trace time (open loop); (response seconds, status)."""
    import aiohttp

    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def one(at, model):
            await asyncio.sleep(max(at - (time.perf_counter() - start), 0))
            sent = time.perf_counter()
            payload = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                                   "data": [1.0, 2.0]}]}
            async with session.post(f"{url}/v2/models/{model}/infer", json=payload) as r:
                await r.read()
                results.append((time.perf_counter() - sent, r.status))

        await asyncio.gather(*(one(float(t), names[m]) for t, m in
                               zip(trace.timestamps, trace.model_ids)))
    return results


@pytest.mark.parametrize("policy", ["cremebrulee", "lru"])
def test_live_agent_and_simulator_agree(repo, start_agent, policy):
    names, sizes, loads, execs, trace, profiles = workload()
    for name, size, load, exe in zip(names, sizes, loads, execs):
        add_synthetic(repo, name, size_bytes=int(size), load_ms=float(load) * 1000,
                      base_ms=float(exe) * 1000, max_batch_size=0, slo={"latency_ms": 60000},
                      batching={"workers": 64})
    budget = int(sizes.sum() * 0.35)
    agent = start_agent(repo, budget=budget, policy=policy, load_concurrency=32)
    results = asyncio.run(asyncio.wait_for(replay_live(agent.url, trace, names), 120))
    assert all(status == 200 for _, status in results)
    listing = agent.request("GET", "/v1/cache")[2]
    live_loads = sum(m["loads"] for m in listing)
    live_evictions = sum(m["evictions"] for m in listing)
    live_mean = float(np.mean([seconds for seconds, _ in results]))

    sim = simulate(trace, profiles, budget, policy, queueing=256)
    requests = len(trace)
    assert sim.misses > 20 and sim.evictions > 10  # the budget does bite
    assert live_loads == pytest.approx(sim.misses, rel=0.05)
    assert requests - live_loads == pytest.approx(sim.hits, rel=0.05)
    assert live_evictions == pytest.approx(sim.evictions, rel=0.05)
    assert live_mean == pytest.approx(sim.mean_response_seconds, rel=0.15)
