"""The batching and admission layers against their SLO targets: the synthetic backend
(latency = base + per_item × rows, asyncio sleeps) driven in process through ``Serving``,
and a real agent over HTTP in this process. Prints each figure beside its target and
whether it is met; not a test. Run it on an otherwise idle machine: these are the
figures tests/test_batching.py and tests/test_admission.py asserted until a loaded box
broke them (the tests keep the behaviour: every request answered, reasons, batches).

Targets (the tests' former bounds):

- sustained, half of what batches of n* serve (10 ms + 4 ms a row, SLO 120 ms,
  100 req/s for 3 s): p99 <= 120 ms, the agent's own p99 <= 132 ms, shed <= 1 %;
- overload, ~3x (600 req/s for 2 s): 503s median <= 20 ms after arrival, p99 of the
  served <= 138 ms, >= 120 served per second;
- AIMD at ~1.5x n*'s capacity (320 req/s, n* = 12): the batch limit's median in 10-14,
  >= 80 % of samples in 10-14, never above 16;
- delayed batching (16 closed-loop clients): a high fixed cost (20 ms + 1 ms a row)
  >= 1.12x the rate without a window; a low one (0.2 ms + 2 ms a row) keeps the window
  shut and >= 0.85x the rate without one;
- HTTP overload, ~3x (40 ms + 8 ms a row, SLO 200 ms, 220 req/s for 2 s): 503s median
  < 50 ms, p99 of the 200s <= 260 ms.

    .venv/bin/python bench/serving_slo.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.http.eventloop import settle_gc  # noqa: E402
from tests.helpers import (AgentServer, add_synthetic, closed_loop,  # noqa: E402
                           http_open_loop, open_loop, start_serving, stop_serving,
                           without_stalls)

ROWS: list[tuple[str, float, str, bool]] = []


def check(what: str, value: float, target: str, met: bool) -> None:
    ROWS.append((what, value, target, met))
    print(f"{what:<52} {value:>10.3f}  {target:<14} {'ok' if met else 'MISSED'}",
          flush=True)


async def sustained(repo: Path) -> None:
    add_synthetic(repo, "m", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120})
    cache, serving = await start_serving(repo)
    entry = await cache.ensure_loaded("m")
    latencies, shed, total = await without_stalls(
        lambda: open_loop(serving, "m", 100, 3.0, record_after=0.5))
    p99 = float(np.percentile(latencies, 99)) * 1000
    check("sustained: p99 ms", p99, "<= 120", p99 <= 120)
    own = serving.describe(entry)["latency_ms"]["p99"]
    check("sustained: the agent's own p99 ms", own, "<= 132", own <= 132)
    check("sustained: shed %", 100 * len(shed) / total, "<= 1", len(shed) <= 0.01 * total)
    await stop_serving(cache, serving)


async def overload(repo: Path) -> None:
    add_synthetic(repo, "o", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120})
    cache, serving = await start_serving(repo)
    await cache.ensure_loaded("o")
    await open_loop(serving, "o", 200, 0.8)  # learn the profile first
    latencies, shed, _ = await without_stalls(
        lambda: open_loop(serving, "o", 600, 2.0, seed=5))
    median = float(np.median([t for t, _ in shed])) * 1000
    check("overload 3x: 503 median ms", median, "<= 20", median <= 20)
    p99 = float(np.percentile(latencies, 99)) * 1000
    check("overload 3x: p99 of the served ms", p99, "<= 138", p99 <= 138)
    check("overload 3x: served per second", len(latencies) / 2.0, ">= 120",
          len(latencies) / 2.0 >= 120)
    await stop_serving(cache, serving)


async def aimd(repo: Path) -> None:
    add_synthetic(repo, "a", base_ms=10, per_item_ms=4, max_batch_size=64,
                  slo={"latency_ms": 120}, batching={"aimd_step": 2})
    cache, serving = await start_serving(repo)
    runtime = serving.runtime(await cache.ensure_loaded("a"))
    samples: list[int] = []

    async def sample():
        while True:
            await asyncio.sleep(0.05)
            samples.append(runtime.tuner.limit)
    sampler = asyncio.ensure_future(sample())
    await open_loop(serving, "a", 320, 1.2)

    async def steady():
        samples.clear()
        await open_loop(serving, "a", 320, 1.2, seed=2)
    await without_stalls(steady)
    sampler.cancel()
    median = sorted(samples)[len(samples) // 2]
    check("AIMD: median batch limit (n* = 12)", median, "10-14", 10 <= median <= 14)
    share = 100 * sum(10 <= s <= 14 for s in samples) / len(samples)
    check("AIMD: samples in 10-14 %", share, ">= 80", share >= 80)
    check("AIMD: largest limit", max(samples), "<= 16", max(samples) <= 16)
    await stop_serving(cache, serving)


async def delayed(repo: Path) -> None:
    for name, base, per_item in (("high", 20, 1), ("low", 0.2, 2)):
        add_synthetic(repo, name, base_ms=base, per_item_ms=per_item, max_batch_size=64,
                      slo={"latency_ms": 200})
        add_synthetic(repo, name + "-greedy", base_ms=base, per_item_ms=per_item,
                      max_batch_size=64, slo={"latency_ms": 200},
                      batching={"window_ms_max": 0})
    cache, serving = await start_serving(repo)
    rate = {}
    for name in ("high", "high-greedy", "low", "low-greedy"):
        await cache.ensure_loaded(name)
        await closed_loop(serving, name, 16, 0.8)  # warm-up: limit and window
        rate[name] = await without_stalls(lambda: closed_loop(serving, name, 16, 1.5))
    ratio = rate["high"] / rate["high-greedy"]
    check("delayed batching, high base: rate / greedy", ratio, ">= 1.12", ratio >= 1.12)
    window = serving.describe(cache.entry("low"))["batch_window_ms"]
    check("delayed batching, low base: window ms", window, "== 0", window == 0)
    ratio = rate["low"] / rate["low-greedy"]
    check("delayed batching, low base: rate / greedy", ratio, ">= 0.85", ratio >= 0.85)
    await stop_serving(cache, serving)


async def http_overload(agent) -> None:
    url = f"{agent.url}/v2/models/h/infer"
    await http_open_loop(url, 60, 1.0)  # learn the profile
    results, _ = await without_stalls(lambda: http_open_loop(url, 220, 2.0, seed=1))
    shed = [t for status, t, _, _ in results if status == 503]
    ok = [t for status, t, _, _ in results if status == 200]
    median = float(np.median(shed)) * 1000
    check("HTTP overload 3x: 503 median ms", median, "< 50", median < 50)
    p99 = float(np.percentile(ok, 99)) * 1000
    check("HTTP overload 3x: p99 of the 200s ms", p99, "<= 260", p99 <= 260)


def main() -> None:
    from agent.config import AgentConfig

    settle_gc()  # as a serving agent does
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, scenario in enumerate((sustained, overload, aimd, delayed)):
            asyncio.run(scenario(work / f"repo{i}"))
        repo = work / "http"
        add_synthetic(repo, "h", base_ms=40, per_item_ms=8, max_batch_size=32,
                      slo={"latency_ms": 200})
        agent = AgentServer(AgentConfig(repository=repo, data_dir=work / "data",
                                        cpu_budget=200_000_000, infer_threads=2),
                            budgets={"cpu": 200_000_000})
        try:
            asyncio.run(http_overload(agent))
        finally:
            agent.close()
    missed = [what for what, _, _, met in ROWS if not met]
    print(f"{len(ROWS) - len(missed)} of {len(ROWS)} targets met"
          + (f"; missed: {', '.join(missed)}" if missed else ""))


if __name__ == "__main__":
    main()
