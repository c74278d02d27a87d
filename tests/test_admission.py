"""Admission control: deadlines, the bouncer's completion estimate, tail drop, cold
models, client timeouts, and explicit answers on shutdown — as pure functions, in
process, and over HTTP on a real agent (3× overload: 503 + Retry-After, nothing hangs)."""

import asyncio
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.config import SloOptions
from agent.node.admission import Deadline, QueueState, Shed, admit, deadline_for, predict_finish
from tests.helpers import (add_mlp, add_synthetic, call_model, http_open_loop, start_serving,
                           stop_serving, without_stalls)

pytestmark = pytest.mark.usefixtures("settled_gc")  # as in the agent (see the fixture)


def linear(base, per_item):
    return lambda b: base + per_item * b


def queue(**kw):
    state = dict(queued_rows=0, queued_requests=0, limit=10, workers=1, running_left=(),
                 arrival_rate=0.0)
    state.update(kw)
    return QueueState(**state)


def test_deadline_is_the_slo_or_a_tighter_client_timeout():
    assert deadline_for(10.0, 0.1, None) == Deadline(10.1, False)
    assert deadline_for(10.0, 0.1, 0.05) == Deadline(10.05, True)
    assert deadline_for(10.0, 0.1, 5.0) == Deadline(10.1, False)


def test_completion_estimate():
    t = linear(0.01, 0.001)
    assert predict_finish(0, 1, queue(), t) == pytest.approx(0.011)
    # busy for 20 ms more, then its own batch
    assert predict_finish(0, 1, queue(running_left=(0.02,)), t) == pytest.approx(0.031)
    # 25 rows ahead with limit 10: two full batches, then 5 + 1 rows
    assert predict_finish(0, 1, queue(queued_rows=25), t) == pytest.approx(
        2 * 0.02 + 0.016)
    # two workers share the full batches
    assert predict_finish(0, 1, queue(queued_rows=25, workers=2), t) == pytest.approx(
        0.02 + 0.016)
    # rows arriving while it waits for a worker make its own batch bigger
    assert predict_finish(0, 1, queue(running_left=(0.05,), arrival_rate=100), t) == \
        pytest.approx(0.05 + 0.01 + 0.006)
    assert predict_finish(0, 1, queue(queued_rows=3), lambda b: None) == 0.0
    # the SLO percentile's excess counts once for the path, as excess x sqrt(batches):
    # two full batches ahead and its own (independent noise adds up in variance)
    assert predict_finish(0, 1, queue(queued_rows=25, excess=0.005), t) == pytest.approx(
        2 * 0.02 + 0.016 + 0.005 * 3 ** 0.5)
    assert predict_finish(0, 1, queue(excess=0.005), t) == pytest.approx(0.011 + 0.005)


def test_nothing_ahead_is_never_shed_whatever_the_excess():
    t = linear(0.01, 0.001)
    idle = queue(excess=0.5)  # a stall made the percentile's excess huge
    assert admit(0.0, Deadline(0.1, False), 1, idle, 50, t, margin=0.005) == \
        pytest.approx(0.011 + 0.5)  # served (late), not refused: it has no one ahead
    with pytest.raises(Shed):  # with a queue ahead the excess does count
        admit(0.0, Deadline(0.1, False), 1, queue(queued_rows=30, queued_requests=30,
                                                  excess=0.5), 50, t, margin=0.005)


def test_completion_estimate_follows_the_aimd_limit_ramping_up():
    t = linear(0.02, 0.002)  # the model: 20 ms + 2 ms/row
    # 31 queued behind a limit of 3 that AIMD grows by 2 per full batch, up to 32:
    # batches of 3, 5, 7, 9 (24 rows), then the last 7 + 1 rows together.
    ramp = queue(queued_rows=31, queued_requests=31, limit=3, limit_step=2, limit_cap=32)
    expected = sum(t(b) for b in (3, 5, 7, 9)) + t(8)
    assert predict_finish(0, 1, ramp, t) == pytest.approx(expected)
    assert expected < 0.2 - 0.01  # served within the SLO: admitted
    admit(0.0, Deadline(0.2, False), 1, ramp, 50, t, margin=0.01)
    flat = queue(queued_rows=31, queued_requests=31, limit=3)  # with today's limit only
    with pytest.raises(Shed):
        admit(0.0, Deadline(0.2, False), 1, flat, 50, t, margin=0.01)


def test_completion_estimate_groups_the_queue_as_the_batcher_does():
    t = linear(0.01, 2e-6)  # 10 ms + 2 µs/row: 60,000 rows take 130 ms
    # one queued request of 60,000 rows (limit 32) runs as ONE batch, alone (not 1,875
    # batches of 32 rows); then the new one, also over the limit, alone
    big = queue(queued_rows=60_000, queued_requests=1, limit=32, sizes=(60_000,),
                running_left=(0.1,), limit_step=2, limit_cap=32)
    assert predict_finish(0, 60_000, big, t) == pytest.approx(0.1 + 2 * t(60_000))
    # a small request behind it gets a batch of its own, with the rows arriving meanwhile
    arriving = queue(queued_rows=60_000, queued_requests=1, limit=32, sizes=(60_000,),
                     arrival_rate=100.0)
    assert predict_finish(0, 1, arriving, t) == pytest.approx(
        t(60_000) + t(1 + int(100 * t(60_000))))
    # queued 5, 40, 3 rows with limit 10: 5 alone (40 does not fit), 40 alone (over the
    # limit), then 3 rows open, which the new 4 rows join
    mixed = queue(queued_rows=48, queued_requests=3, sizes=(5, 40, 3))
    assert predict_finish(0, 4, mixed, t) == pytest.approx(t(5) + t(40) + t(7))
    # the open batch (8 rows) cannot take 5 more: it runs first, then the new request
    assert predict_finish(0, 5, queue(queued_rows=8, queued_requests=1, sizes=(8,)), t) \
        == pytest.approx(t(8) + t(5))
    # the excess counts each batch waited for once: the oversized one and its own
    assert predict_finish(0, 60_000, queue(queued_rows=60_000, queued_requests=1, limit=32,
                                           sizes=(60_000,), excess=0.01), t) == \
        pytest.approx(2 * t(60_000) + 0.01 * 2 ** 0.5)
    # not batched (limit 1): each queued request alone, at its own rows
    assert predict_finish(0, 3, queue(queued_rows=6, queued_requests=2, limit=1,
                                      sizes=(3, 3)), t) == pytest.approx(3 * t(3))


def test_the_bouncer_admits_a_request_behind_an_oversized_one():
    # the reported case: 60,000-row requests, limit 32, 1 s SLO, one running, one queued
    t = linear(0.01, 2e-6)
    q = queue(queued_rows=60_000, queued_requests=1, limit=32, sizes=(60_000,),
              running_left=(0.1,), limit_step=2, limit_cap=32)
    finish = admit(0.0, Deadline(1.0, False), 60_000, q, 50, t, margin=0.05)
    assert finish == pytest.approx(0.1 + 2 * t(60_000))
    three = queue(queued_rows=180_000, queued_requests=3, limit=32, sizes=(60_000,) * 3,
                  running_left=(0.1,))  # four batches of 130 ms ahead: really late
    with pytest.raises(Shed) as err:
        admit(0.0, Deadline(0.5, False), 60_000, three, 50, t, margin=0.05)
    assert err.value.reason == "deadline" and "late behind 3 queued" in str(err.value)
    late_ms = float(str(err.value).split("predicted ")[1].split(" ms")[0])
    assert late_ms == pytest.approx((0.1 + 4 * t(60_000) - 0.5 + 0.05) * 1000, abs=1)


def test_admit_rules():
    t = linear(0.01, 0.001)
    soft, hard = Deadline(0.1, False), Deadline(0.1, True)
    assert admit(0, soft, 1, queue(queued_rows=30), 50, t) == pytest.approx(0.071)
    with pytest.raises(Shed) as err:
        admit(0, soft, 1, queue(queued_rows=50, queued_requests=50), 50, t)
    assert err.value.reason == "queue_full" and err.value.retry_after >= 1
    with pytest.raises(Shed) as err:
        admit(0, soft, 1, queue(queued_rows=90, queued_requests=40), 50, t)
    assert err.value.reason == "deadline" and err.value.status == 503
    slow = linear(0.5, 0.0)  # slower than its SLO even when idle
    assert admit(0, soft, 1, queue(), 50, slow) == 0.5  # served (and counted late)
    with pytest.raises(Shed):
        admit(0, hard, 1, queue(), 50, slow)  # the client said it will not wait
    with pytest.raises(Shed) as err:
        admit(0, soft, 1, queue(), 50, t, load_left=0.3)
    assert err.value.reason == "cold"
    busy = queue(queued_rows=10)  # finishes at 31 ms
    assert admit(0, soft, 1, busy, 50, t, margin=0.065) == pytest.approx(0.031)
    with pytest.raises(Shed):  # predictions are means: keep a margin before the deadline
        admit(0, soft, 1, busy, 50, t, margin=0.075)


async def test_shutdown_answers_every_queued_request(repo):
    add_synthetic(repo, "m", base_ms=200, max_batch_size=0, slo={"latency_ms": 60000})
    cache, serving = await start_serving(repo)
    await cache.ensure_loaded("m")
    x = np.ones((1, 2), np.float32)
    tasks = [asyncio.ensure_future(call_model(serving, "m", x)) for _ in range(6)]
    await asyncio.sleep(0.05)
    await stop_serving(cache, serving)
    done, pending = await asyncio.wait(tasks, timeout=5)
    assert not pending
    results = [t.exception() or t.result() for t in tasks]
    assert isinstance(results[0], np.ndarray)  # the running batch finished
    assert all(isinstance(r, Shed) and r.reason == "shutdown" for r in results[1:])
    assert serving.runtimes[("m", 1)].drops == {"shutdown": 5}


async def test_the_batch_window_never_makes_a_request_late(repo):
    # static batching: wait up to 2 s for 64 rows; the SLO (150 ms) cuts the wait short
    add_synthetic(repo, "m", base_ms=10, max_batch_size=64, slo={"latency_ms": 150},
                  batching={"adaptive": False, "window_ms_max": 2000})
    cache, serving = await start_serving(repo)
    await cache.ensure_loaded("m")
    x = np.ones((1, 2), np.float32)
    t = time.perf_counter()
    await asyncio.gather(*(call_model(serving, "m", x) for _ in range(3)))
    assert time.perf_counter() - t < 0.5
    await stop_serving(cache, serving)


async def test_unload_closes_the_batcher_and_client_timeout_expires_in_queue(repo):
    add_synthetic(repo, "m", base_ms=100, max_batch_size=0, slo={"latency_ms": 60000})
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    x = np.ones((1, 2), np.float32)
    await call_model(serving, "m", x)
    # second request must wait 100 ms behind the first: a 50 ms timeout cannot be met
    first = asyncio.ensure_future(call_model(serving, "m", x))
    await asyncio.sleep(0.01)
    with pytest.raises(Shed) as err:
        await call_model(serving, "m", x, timeout=0.05)
    assert err.value.reason == "deadline"
    await first
    await cache.evict("m")
    assert serving.runtime(entry).batcher is None
    await asyncio.sleep(0.05)
    assert await call_model(serving, "m", x) is not None  # reloaded, a new batcher
    await stop_serving(cache, serving)


# -- over HTTP ---------------------------------------------------------------------------


def v2(x, **parameters):
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                       "data": x.ravel().tolist()}]}
    if parameters:
        doc["parameters"] = parameters
    return doc


async def test_http_overload_gets_503_with_retry_after_and_nothing_hangs(repo, start_agent):
    # budget 100 ms → n* = floor((100 − 40) / 8) = 7 → ~70 req/s at most
    add_synthetic(repo, "m", base_ms=40, per_item_ms=8, max_batch_size=32,
                  slo={"latency_ms": 200})
    agent = start_agent(repo)
    url = f"{agent.url}/v2/models/m/infer"
    await http_open_loop(url, 60, 1.0)                        # learn the profile
    results, sent = await without_stalls(lambda: http_open_loop(url, 220, 2.0, seed=1))  # 3×
    assert len(results) == sent                               # every request answered
    ok = [r for r in results if r[0] == 200]
    shed = [r for r in results if r[0] == 503]
    assert len(ok) + len(shed) == sent and len(shed) >= 0.3 * sent
    assert all(int(h["Retry-After"]) >= 1 and "error" in b for _, _, h, b in shed)
    # how soon the 503s come and the p99 of the 200s: bench/serving_slo.py
    status, _, info = agent.request("GET", "/v1/cache/m")
    for key in ("batch_limit", "batch_window_ms", "mean_batch_size", "queue_length",
                "arrival_rate", "batch_ms_by_size", "latency_ms", "slo_violations",
                "drops", "workers"):
        assert key in info, key
    assert info["drops_total"] >= len(shed) and 1 <= info["batch_limit"] <= 32
    assert info["latency_ms"]["p99"] is not None and info["arrival_rate"] > 0
    text = agent.request("GET", "/metrics")[2].decode()
    m = 'device="cpu",model="m",version="1"'
    for metric in (f'edgeagent_batch_limit{{{m}}}',
                   f'edgeagent_batch_window_seconds{{{m}}}',
                   f'edgeagent_mean_batch_size{{{m}}}',
                   f'edgeagent_queue_length{{{m}}}',
                   f'edgeagent_arrival_rate{{{m}}}',
                   'edgeagent_request_duration_seconds_bucket{device="cpu",endpoint="v2",'
                   'le="0.2",model="m",version="1"}',
                   'edgeagent_slo_latency_seconds{device="cpu",model="m",percentile="99",'
                   'version="1"} 0.2',
                   f'edgeagent_slo_violations_total{{{m}}}',
                   'edgeagent_drops_total{device="cpu",model="m",reason="deadline",'
                   'version="1"}',
                   f'edgeagent_batch_processing_seconds{{batch_size="1",{m}}}'):
        assert metric in text, metric


async def test_http_tail_drop(repo, start_agent):
    add_synthetic(repo, "m", base_ms=100, max_batch_size=0, max_queue=5,
                  slo={"latency_ms": 60000})
    agent = start_agent(repo)
    url = f"{agent.url}/v2/models/m/infer"
    agent.request("POST", "/v2/models/m/infer", v2(np.ones((1, 2), np.float32)))
    results, sent = await http_open_loop(url, 400, 0.05)
    assert sent >= 10
    full = [b for s, _, _, b in results if s == 503]
    assert full and all("queue full" in b["error"] for b in full)
    assert sum(s == 200 for s, _, _, _ in results) >= 5


def test_http_cold_model_is_served_late_by_default(repo, start_agent):
    add_synthetic(repo, "m", load_ms=400, slo={"latency_ms": 100})
    agent = start_agent(repo)
    x = np.ones((1, 2), np.float32)
    for _ in range(2):  # the second time the load time is known: still served
        started = time.monotonic()
        status, _, body = agent.request("POST", "/v2/models/m/infer", v2(x))
        assert status == 200, body
        assert time.monotonic() - started >= 0.4  # it waited for the load
        assert agent.request("POST", "/v1/cache/m/evict")[0] == 200
    info = agent.request("GET", "/v1/cache/m")[2]
    assert info["drops"] == {} and info["slo_violations"] == 2 and info["loads"] == 2


def test_http_cold_start_reject_counts_the_load_against_the_deadline(repo, start_agent):
    add_synthetic(repo, "m", load_ms=400, slo={"latency_ms": 100}, cold_start="reject")
    agent = start_agent(repo)
    x = np.ones((1, 2), np.float32)
    status, _, _ = agent.request("POST", "/v2/models/m/infer", v2(x))
    assert status == 200  # load time unknown before the first load: served, late
    assert agent.request("POST", "/v1/cache/m/evict")[0] == 200
    status, headers, body = agent.request("POST", "/v2/models/m/infer", v2(x))
    assert status == 503 and "load" in body["error"] and int(headers["Retry-After"]) >= 1
    deadline = time.time() + 10  # the rejected request started the load
    while agent.request("GET", "/v1/cache/m")[2]["state"] != "ready":
        assert time.time() < deadline
        time.sleep(0.05)
    assert agent.request("POST", "/v2/models/m/infer", v2(x))[0] == 200
    assert agent.request("GET", "/v1/cache/m")[2]["drops"] == {"cold": 1}


def test_http_client_timeout_parameter(repo, start_agent):
    add_synthetic(repo, "m", base_ms=50)
    agent = start_agent(repo)
    x = np.ones((1, 2), np.float32)
    assert agent.request("POST", "/v2/models/m/infer", v2(x, timeout=5_000_000))[0] == 200
    status, headers, body = agent.request("POST", "/v2/models/m/infer", v2(x, timeout=1000))
    assert status == 503 and "deadline" in body["error"] and "Retry-After" in headers
    status, _, body = agent.request("POST", "/v2/models/m/infer", v2(x, timeout="soon"))
    assert status == 400 and "timeout" in body["error"]


def test_queued_requests_hold_the_model(repo, start_agent):
    import concurrent.futures as cf
    add_synthetic(repo, "m", base_ms=300, max_batch_size=0, slo={"latency_ms": 60000})
    agent = start_agent(repo)
    x = np.ones((1, 2), np.float32)
    with cf.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(agent.request, "POST", "/v2/models/m/infer", v2(x))
                   for _ in range(3)]
        time.sleep(0.15)
        info = agent.request("GET", "/v1/cache/m")[2]
        assert info["in_flight"] == 3 and info["queue_length"] >= 1
        status, _, body = agent.request("POST", "/v1/cache/m/evict")
        assert status == 409 and "in flight" in body["error"]
        assert [f.result()[0] for f in futures] == [200, 200, 200]


def test_http_requests_over_the_batch_limit_are_served_not_shed_as_late(repo, start_agent):
    # 4 clients each posting 20,000-row requests to a real ONNX MLP (max_batch_size 32):
    # each runs alone in ~10-50 ms, far within the 5 s SLO. The bouncer used to price a
    # queued one as 625 batches of 32 rows (each at the 20,000-row time): seconds late.
    import concurrent.futures as cf
    add_mlp(repo, "mlp")
    agent = start_agent(repo, slo=SloOptions(5000), max_request_rows=100_000)
    x = np.random.default_rng(0).random((20_000, 4), np.float32)
    body = json.dumps(v2(x)).encode()

    def client():
        return [agent.request("POST", "/v2/models/mlp/infer", body) for _ in range(4)]

    with cf.ThreadPoolExecutor(4) as pool:
        answers = [a for f in [pool.submit(client) for _ in range(4)] for a in f.result()]
    assert [s for s, _, _ in answers] == [200] * 16, [b for s, _, b in answers if s != 200]
    assert all(b["outputs"][0]["shape"] == [20_000, 2] for _, _, b in answers)
    info = agent.request("GET", "/v1/cache/mlp")[2]
    assert info["drops"] == {} and info["batch_limit"] <= 32
    assert set(info["batch_ms_by_size"]) == {"20000"}  # each ran alone, never split


def test_workers_endpoint_and_cli(repo, start_agent, tmp_path):
    add_synthetic(repo, "m")
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef")
    agent = start_agent(repo, admin_token_file=token)
    auth = {"Authorization": "Bearer tok-0123456789abcdef0123456789abcdef"}
    assert agent.request("POST", "/v1/cache/m/workers", {"workers": 3})[0] == 401
    status, _, body = agent.request("POST", "/v1/cache/m/workers", {"workers": 3}, auth)
    assert status == 200 and body["workers"] == 3
    for bad in ({"workers": 0}, {"workers": "2"}, {}, [3]):
        status, _, body = agent.request("POST", "/v1/cache/m/workers", bad, auth)
        assert status == 400 and "workers" in body["error"], bad
    assert agent.request("POST", "/v1/cache/nope/workers", {"workers": 2}, auth)[0] == 404
    agent.request("POST", "/v2/models/m/infer", v2(np.ones((1, 2), np.float32)), auth)
    assert agent.request("GET", "/v1/cache/m", headers=auth)[2]["workers"] == 3
    run = CliRunner().invoke(main, ["cache", "--token-file", str(token), "workers", "m", "2",
                                    "--url", agent.url, "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.output)["workers"] == 2
    batcher = agent.node.serving.runtimes[("m", 1)].batcher
    deadline = time.time() + 5  # surplus workers stop once they wake up
    while len(batcher._workers) != 2:
        assert time.time() < deadline
        time.sleep(0.01)
