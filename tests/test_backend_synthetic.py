"""The synthetic backend and concurrency of loads and inference."""

import asyncio

import numpy as np

from agent.backends.synthetic import SyntheticBackend
from agent.config import parse_model_config
from agent.node.cache import ModelCache, State
from agent.memory import FootprintModel
from agent.node.repository import scan_repository
from tests.helpers import add_synthetic


async def test_synthetic_infer_does_not_hold_the_event_loop(repo):
    cfg = parse_model_config({"backend": "synthetic", "synthetic": {
        "base_ms": 200, "per_item_ms": 10, "size_bytes": "1MB"}})
    b = SyntheticBackend("s", 1, repo, cfg, FootprintModel())
    assert b.estimate() == 1_000_000
    b.load()
    assert b.measured_bytes() == 1_000_000
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    t = asyncio.create_task(ticker())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = await b.infer_async({"X": x}, {}, None)
    t.cancel()
    assert out["Y"].tolist() == [[1.0], [5.0], [9.0]] and out["Y"].dtype == np.float32
    assert ticks >= 10  # the loop kept running during the ~230 ms batch


async def test_unrelated_models_load_concurrently(repo):
    add_synthetic(repo, "a", load_ms=300)
    add_synthetic(repo, "b", load_ms=300)
    cache = ModelCache(scan_repository(repo), {"cpu": 10**9}, load_concurrency=2)
    tasks = [asyncio.create_task(cache.ensure_loaded(n)) for n in "ab"]
    await asyncio.sleep(0.15)
    assert cache.entry("a").state is State.LOADING and cache.entry("b").state is State.LOADING
    assert cache.pools["cpu"].reserved == 2 * 10_000_000
    await asyncio.gather(*tasks)
    assert cache.pools["cpu"].reserved == 0 and cache.pools["cpu"].used == 2 * 10_000_000
    await cache.close()
