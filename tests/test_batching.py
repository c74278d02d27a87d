"""Per-model queues, batchers and workers with the synthetic backend (latency = base +
per_item × batch), driven through ``Serving`` in-process: batches are formed, split back
and isolated by shape; AIMD settles near n*; a high fixed cost opens a batch window;
a load the model can sustain is batched; overload is shed at once; a request queued
past its expiry (a selection app's cut) is dropped, never run.

Timing-based tests assert behaviour with margins that hold on a loaded box; latency and
throughput against the SLO are measured by bench/serving_slo.py."""

import asyncio
import threading
import time

import numpy as np
import pytest

from agent.backends.base import Backend, InvalidInput, TensorSpec
from agent.backends.synthetic import SyntheticBackend
from tests.helpers import (Recorder, add_synthetic, call_model, closed_loop, open_loop,
                           start_serving, stop_serving, without_stalls)

pytestmark = pytest.mark.usefixtures("settled_gc")  # as in the agent (see the fixture)


async def test_batches_concatenate_requests_and_split_results(repo):
    add_synthetic(repo, "m", base_ms=30, per_item_ms=0.1, max_batch_size=64)
    recorder = Recorder()
    cache, serving = await start_serving(repo, recorder)
    await cache.ensure_loaded("m")
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(24)]
    outs = await asyncio.gather(*(call_model(serving, "m", x) for x in xs))
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, x.sum(axis=1, keepdims=True), rtol=1e-6)
    assert len(recorder.calls) < len(xs)  # batched: fewer backend calls than requests
    info = serving.describe(cache.entry("m"))
    assert info["mean_batch_size"] > 1.5 and info["requests_served"] == 24
    assert info["batch_limit"] >= 1 and set(info["batch_ms_by_size"])
    await stop_serving(cache, serving)


async def test_requests_with_different_shapes_go_to_different_batches(repo):
    add_synthetic(repo, "m", base_ms=20, max_batch_size=64)
    recorder = Recorder()
    cache, serving = await start_serving(repo, recorder)
    await cache.ensure_loaded("m")
    xs = [np.full((1, 3 + (i % 2) * 2), i, np.float32) for i in range(20)]
    outs = await asyncio.gather(*(call_model(serving, "m", x) for x in xs))
    for x, y in zip(xs, outs):
        assert y.tolist() == [[float(x.sum())]]
    widths = {shape["X"][1] for _, shape in recorder.calls}
    assert widths == {3, 5}
    assert sum(shape["X"][0] for _, shape in recorder.calls) == 20
    await stop_serving(cache, serving)


class NoBatchDim(SyntheticBackend):
    """A model whose input has a fixed first dimension: no batch dimension."""

    def load(self):
        super().load()
        self.inputs = [TensorSpec("X", "FP32", (1, -1))]
        self.outputs = [TensorSpec("Y", "FP32", (1, 1))]


async def test_model_without_a_batch_dimension_is_not_batched(repo):
    add_synthetic(repo, "m", base_ms=10, max_batch_size=64)
    recorder = Recorder(NoBatchDim)
    cache, serving = await start_serving(repo, recorder)
    await cache.ensure_loaded("m")
    outs = await asyncio.gather(*(call_model(serving, "m", np.full((1, 2), i, np.float32))
                                  for i in range(8)))
    assert [y.item() for y in outs] == [2.0 * i for i in range(8)]
    assert len(recorder.calls) == 8 and all(s["X"][0] == 1 for _, s in recorder.calls)
    info = serving.describe(cache.entry("m"))
    assert info["batching"] is False and info["batch_limit"] == 1
    await stop_serving(cache, serving)


class Picky(SyntheticBackend):
    """Fails a whole batch when any row holds a NaN (the request's fault)."""

    async def infer_async(self, inputs, parameters, executor):
        await asyncio.sleep(0.01)
        if np.isnan(inputs["X"]).any():
            raise InvalidInput("NaN in the input")
        return {"Y": inputs["X"].sum(axis=1, keepdims=True)}


async def test_a_failing_batch_fails_only_the_request_at_fault(repo):
    add_synthetic(repo, "m", max_batch_size=64)
    cache, serving = await start_serving(repo, Recorder(Picky))
    await cache.ensure_loaded("m")
    xs = [np.full((1, 2), np.nan if i == 5 else i, np.float32) for i in range(12)]
    results = await asyncio.gather(*(call_model(serving, "m", x) for x in xs),
                                   return_exceptions=True)
    assert isinstance(results[5], InvalidInput)
    assert [r.item() for i, r in enumerate(results) if i != 5] == \
        [2.0 * i for i in range(12) if i != 5]
    await stop_serving(cache, serving)


class Scalar(SyntheticBackend):
    """Claims a batch dimension but returns one row whatever the batch holds."""

    async def infer_async(self, inputs, parameters, executor):
        await asyncio.sleep(0.01)
        return {"Y": inputs["X"].sum(keepdims=True).reshape(1, 1)}


async def test_outputs_that_ignore_the_batch_turn_batching_off(repo):
    add_synthetic(repo, "m", max_batch_size=64)
    cache, serving = await start_serving(repo, Recorder(Scalar))
    await cache.ensure_loaded("m")
    outs = await asyncio.gather(*(call_model(serving, "m", np.full((1, 2), i, np.float32))
                                  for i in range(6)))
    assert [y.item() for y in outs] == [2.0 * i for i in range(6)]
    assert serving.describe(cache.entry("m"))["batching"] is False
    await stop_serving(cache, serving)


async def test_worker_count_changes_at_runtime(repo):
    add_synthetic(repo, "m", base_ms=150, max_batch_size=0)  # not batched
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    x = np.ones((1, 2), np.float32)

    async def burst():
        t = time.perf_counter()
        await asyncio.gather(*(call_model(serving, "m", x) for _ in range(4)))
        return time.perf_counter() - t
    assert await burst() >= 0.55                      # one worker: 4 × 150 ms in a row
    serving.set_workers(entry, 4)
    assert serving.describe(entry)["workers"] == 4
    assert await burst() < 0.45                       # four at once
    serving.set_workers(entry, 1)
    await asyncio.sleep(0.05)
    assert len(serving.runtime(entry).batcher._workers) == 1
    assert await burst() >= 0.55
    await stop_serving(cache, serving)


async def test_aimd_settles_at_n_star_under_steady_load(repo):
    # budget = 0.5 × 120 ms = 60 ms; n* = floor((60 − 10) / 4) = 12
    add_synthetic(repo, "m", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120}, batching={"aimd_step": 2})
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    rt = serving.runtime(entry)
    samples = []

    async def sample():
        while True:
            await asyncio.sleep(0.05)
            samples.append(rt.tuner.limit)
    sampler = asyncio.ensure_future(sample())
    await open_loop(serving, "m", 320, 1.2)  # ~1.5 × what batches of n* can serve

    async def steady():
        samples.clear()
        await open_loop(serving, "m", 320, 1.2, seed=2)
    await without_stalls(steady)
    sampler.cancel()
    # near n* (a loaded box makes batches look slower: a step or two below it), never
    # far above; bench/serving_slo.py prints the band on an idle machine (10-14)
    assert sorted(samples)[len(samples) // 2] in range(8, 15), samples
    assert sum(8 <= s <= 14 for s in samples) >= 0.8 * len(samples), samples
    assert max(samples) <= 16
    await stop_serving(cache, serving)


async def test_delayed_batching_waits_for_a_batch_where_the_fixed_cost_is_high(repo):
    """A high fixed cost per batch (20 ms + 1 ms a row) under 16 closed-loop clients: the
    tuner opens a batch window (MArk). What it gains over not waiting, and that a low
    fixed cost keeps the window shut, are measured by bench/serving_slo.py (the rule
    itself: test_batching_tuner.py)."""
    add_synthetic(repo, "high", base_ms=20, per_item_ms=1, max_batch_size=64,
                  slo={"latency_ms": 200})
    cache, serving = await start_serving(repo)
    await cache.ensure_loaded("high")
    await closed_loop(serving, "high", 16, 0.8)        # warm-up: limit and window
    assert await closed_loop(serving, "high", 16, 1.5) > 0
    high = serving.describe(cache.entry("high"))
    assert high["batch_window_ms"] > 0, high
    await stop_serving(cache, serving)


async def test_a_load_the_model_sustains_is_batched_and_answered(repo):
    """Half of what batches of n* can serve: every request is answered or shed with a
    reason, and batches form. Its p99 against the SLO: bench/serving_slo.py."""
    # n* = 12 → ~200 req/s at most; offer half of it
    add_synthetic(repo, "m", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120})
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    latencies, shed, total = await open_loop(serving, "m", 100, 3.0)
    assert len(latencies) + len(shed) == total  # everyone answered
    assert {exc.reason for _, exc in shed} <= {"deadline", "queue_full"}
    info = serving.describe(entry)
    assert info["latency_ms"]["p99"] is not None and info["mean_batch_size"] > 1
    await stop_serving(cache, serving)


async def test_overload_is_shed_at_once_and_nothing_hangs(repo):
    add_synthetic(repo, "m", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120})
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    await open_loop(serving, "m", 200, 0.8)  # learn the profile first
    before = []

    async def overload():
        before.append(serving.describe(entry)["drops_total"])
        return await open_loop(serving, "m", 600, 2.0, seed=5)  # ~3×
    latencies, shed, total = await without_stalls(overload)
    assert len(latencies) + len(shed) == total  # everyone answered
    assert len(shed) >= 0.4 * total
    assert {exc.reason for _, exc in shed} <= {"deadline", "queue_full"}
    assert all(exc.retry_after >= 1 for _, exc in shed)
    assert np.median([t for t, _ in shed]) < 0.02  # rejected at once, not after queueing
    info = serving.describe(entry)
    assert info["drops_total"] - before[-1] == len(shed) and info["queue_length"] == 0
    await stop_serving(cache, serving)


async def test_a_request_queued_past_its_expiry_is_dropped_not_run(repo):
    """A selection app's member call cut at the app's deadline (``expires``) is useless:
    still queued then, it is answered ``expired`` and never reaches the backend."""
    from agent.node.admission import Shed

    add_synthetic(repo, "m", base_ms=150, max_batch_size=0)  # one worker, not batched
    recorder = Recorder()
    cache, serving = await start_serving(repo, recorder)
    await cache.ensure_loaded("m")
    x = np.ones((1, 2), np.float32)

    async def cut_call():
        from agent.node.call import Call, Decoded

        return await serving.infer(Call("m", None, "v2", serving.clock(), Decoded({"X": x})),
                                   expires=serving.clock() + 0.05)
    first = asyncio.ensure_future(call_model(serving, "m", x))  # holds the worker 150 ms
    await asyncio.sleep(0.01)
    with pytest.raises(Shed) as err:
        await cut_call()  # queued behind it, past its expiry when the worker frees
    assert err.value.reason == "expired"
    await first
    assert len(recorder.calls) == 1  # only the first ran
    await stop_serving(cache, serving)


class Ticks:
    """A serving clock that moves only when a model runs."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class RunsInPlace(SyntheticBackend):
    """A backend that may run on the event loop (``RUNS_IN_PLACE``): each run takes its
    ``base_ms`` on the test's clock (``TICKS``) and says on which thread it ran."""

    RUNS_IN_PLACE = True
    TICKS: Ticks
    THREADS: list

    def infer(self, inputs, parameters):
        self.THREADS.append((self.name, threading.get_ident()))
        self.TICKS.now += self._seconds(inputs)
        return self._answer(inputs)

    infer_async = Backend.infer_async  # the default: ``infer`` on a thread


async def test_a_batch_measured_quick_runs_on_the_event_loop_a_slow_one_on_a_thread(repo):
    add_synthetic(repo, "quick", base_ms=0.05, max_batch_size=1)  # 50 us a run
    add_synthetic(repo, "slow", base_ms=2, max_batch_size=1)
    RunsInPlace.TICKS, RunsInPlace.THREADS = Ticks(), []
    cache, serving = await start_serving(
        repo, lambda kind, *args: RunsInPlace(*args), clock=RunsInPlace.TICKS)
    x = np.ones((1, 2), np.float32)
    for _ in range(3):
        for name in ("quick", "slow"):
            assert (await call_model(serving, name, x)).tolist() == [[2.0]]
    loop = threading.get_ident()
    ran = {name: [t == loop for n, t in RunsInPlace.THREADS if n == name]
           for name in ("quick", "slow")}
    # quick: its first run measured on a thread, then in place; slow: always a thread
    assert ran == {"quick": [False, True, True], "slow": [False, False, False]}
    info = serving.describe(cache.entry("quick"))
    assert info["requests_served"] == 3 and info["batch_ms_by_size"] == {"1": 0.05}
    await stop_serving(cache, serving)
