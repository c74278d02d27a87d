"""The synthetic backend and concurrency of loads and inference."""

import asyncio
from pathlib import Path

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


def _classifier(name, **options):
    cfg = parse_model_config({"backend": "synthetic", "synthetic": {
        "base_ms": 0, "classifier": {"classes": 10, "seed": 1, **options}}})
    b = SyntheticBackend(name, 1, Path("."), cfg, FootprintModel())
    b.load()
    return b


def _rows(ids, label=3, group=0):
    ids = np.asarray(ids, dtype=np.float32)
    return np.stack([ids, np.full_like(ids, label), np.full_like(ids, group)], axis=1)


def test_synthetic_classifier_errs_at_its_rates_deterministically():
    b = _classifier("m", error=0.2, schedule=[[5000, 10000, 0.9]], groups={3: 0.5},
                    scores=True)
    assert [s.as_json() for s in b.outputs] == [
        {"name": "Y", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "SCORES", "datatype": "FP32", "shape": [-1, 10]}]
    base = b.infer({"X": _rows(range(5000))}, {})
    y = base["Y"]
    assert y.dtype == np.int64 and y.shape == (5000, 1)
    assert 0.17 < (y[:, 0] != 3).mean() < 0.23
    assert ((0 <= y) & (y < 10)).all()
    assert (base["SCORES"].argmax(axis=1) == y[:, 0]).all()
    failing = b.infer({"X": _rows(range(5000, 10000))}, {})["Y"]
    assert 0.87 < (failing[:, 0] != 3).mean() < 0.93
    group = b.infer({"X": _rows(range(5000), group=3)}, {})["Y"]
    assert 0.46 < (group[:, 0] != 3).mean() < 0.54
    # the same rows answer the same way; another model (or seed) errs on other rows
    assert (b.infer({"X": _rows(range(5000))}, {})["Y"] == y).all()
    other = _classifier("n", error=0.2).infer({"X": _rows(range(5000))}, {})["Y"]
    wrong_m, wrong_n = y[:, 0] != 3, other[:, 0] != 3
    assert 0.02 < (wrong_m & wrong_n).mean() < 0.06  # independent: about 0.2 × 0.2


def test_synthetic_classifier_answers_the_same_one_row_at_a_time():
    """Small batches take the Python path (cheap in the event loop), large ones numpy:
    the same answers, rows with groups, schedules and negative ids included."""
    b = _classifier("m", error=0.3, schedule=[[10, 50, 0.9], [40, 60, 0.0]],
                    groups={1: 0.6, 2: 0.05})
    rng = np.random.default_rng(1)
    x = np.stack([rng.integers(-100, 200, 3000), rng.integers(0, 30, 3000),
                  rng.integers(0, 4, 3000)], 1).astype(np.float32)
    whole = b.infer({"X": x}, {})["Y"]
    one_by_one = np.concatenate([b.infer({"X": x[i:i + 1]}, {})["Y"] for i in range(3000)])
    assert whole.dtype == one_by_one.dtype == np.int64
    assert (whole == one_by_one).all()


def test_synthetic_classifier_jitter_makes_stragglers():
    cfg = parse_model_config({"backend": "synthetic", "synthetic": {
        "base_ms": 2, "jitter": {"lognormal_sigma": 0.6, "outlier_p": 0.1,
                                 "outlier_ms": 50}}})
    b = SyntheticBackend("j", 1, Path("."), cfg, FootprintModel())
    b.load()
    times = [b._seconds({"X": _rows([1])}) for _ in range(2000)]
    assert min(times) < 0.002 < max(times)
    assert 0.05 < sum(t > 0.05 for t in times) / len(times) < 0.15
