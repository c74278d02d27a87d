"""A fleet of three agents and a coordinator on loopback, serving 12 real ONNX models of
different sizes and load times, each agent's budget about a third of the models' total,
Zipf clients spread round-robin over the three nodes (as an ordinary load balancer
would): the fleet's loads, failures and mean response before a plan and under it.

    .venv/bin/python bench/fleet_routing.py [--requests 900] [--rate 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.modelzoo import write_mlp  # noqa: E402
from tests.helpers import Agent, CoordinatorProcess, request, wait_for  # noqa: E402

#: (hidden width, hidden layers) of each model: file sizes from under 1 MB to 22 MB
SHAPES = [(256, 2), (384, 3), (512, 3), (640, 3), (768, 3), (896, 3), (1024, 3),
          (1152, 3), (1280, 3), (1408, 3), (1536, 3), (1664, 3)]
NODES = 3
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                    "data": [0.5, -1.0, 2.0, 0.25]}]}


def write_repository(repo: Path) -> list[str]:
    names = []
    for i, (hidden, layers) in enumerate(SHAPES):
        name = f"m{i:02d}"
        write_mlp(repo / name / "1" / "model.onnx", inputs=4, hidden=hidden, layers=layers,
                  outputs=4, seed=i)
        (repo / name / "config.yaml").write_text(yaml.safe_dump(
            {"backend": "onnx", "max_batch_size": 0, "slo": {"latency_ms": 500}}))
        names.append(name)
    return names


def zipf_trace(names: list[str], requests: int, rate: float, seed: int
               ) -> list[tuple[float, str, int]]:
    """(at seconds, model, node index): Zipf (s = 0.9) popularity in a seeded order,
    Poisson arrivals, request i to node i mod NODES."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(names) + 1) ** 0.9
    order = rng.permutation(len(names))
    picks = order[rng.choice(len(names), requests, p=weights / weights.sum())]
    times = np.cumsum(rng.exponential(1 / rate, requests))
    return [(float(t - times[0]), names[m], i % NODES) for i, (t, m) in
            enumerate(zip(times, picks))]


async def replay(urls: list[str], trace) -> list[tuple[float, int, str]]:
    """Send ``trace`` open loop; [(seconds, status, model)]."""
    import aiohttp

    results = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        start = time.perf_counter()

        async def one(at, model, node):
            await asyncio.sleep(max(at - (time.perf_counter() - start), 0))
            sent = time.perf_counter()
            try:
                async with session.post(f"{urls[node]}/v2/models/{model}/infer",
                                        json=BODY) as r:
                    await r.read()
                    status = r.status
            except aiohttp.ClientError:
                status = 0
            results.append((time.perf_counter() - sent, status, model))

        await asyncio.gather(*(one(*item) for item in trace))
    return results


def loads(agents) -> int:
    return sum(m["loads"] for a in agents for m in a.get("/v1/cache"))


def summary(label: str, results, before: int, after: int) -> dict:
    statuses: dict[int, int] = {}
    for _, status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    ok = [s for s, status, _ in results if status == 200]
    out = {"label": label, "requests": len(results), "loads": after - before,
           "failed": len(results) - len(ok), "statuses": statuses,
           "mean_ms": round(1000 * float(np.mean([s for s, _, _ in results])), 1)}
    print(json.dumps(out), flush=True)
    return out


def run(args: argparse.Namespace, work: Path) -> None:
    repo = work / "models"
    names = write_repository(repo)
    total = sum((repo / n / "1" / "model.onnx").stat().st_size for n in names)
    co = CoordinatorProcess(None, work / "coordinator", reactive_interval_s=3600,
                            plan_interval_s=3600, rate_step_s=1, plan_window_s=10,
                            history_s=120, node_timeout_s=10)
    agents = []
    try:
        for n in names:
            request(f"{co.url}/v1/models/{n}", "PUT",
                    {"slo_ms": 500, "cpu_per_replica": 0.25})
        budget = int(total * args.budget_share * args.footprint)
        for i in range(NODES):
            cfg = work / f"agent{i}.yaml"
            cfg.write_text(yaml.safe_dump({
                "infer_threads": 2,
                "coordinator": {"url": co.url, "report_interval_s": 0.5,
                                "node_name": f"edge-{i}", "cores": 4}}))
            agents.append(Agent(repo, work / f"edge-{i}", "--config", str(cfg),
                                "--cpu-budget", str(budget)))
        urls = [a.url for a in agents]
        print(f"models {total / 1e6:.1f} MB of files; budget {budget / 1e6:.1f} MB per node",
              flush=True)
        trace = zipf_trace(names, args.requests, args.rate, args.seed)
        before = loads(agents)
        results = asyncio.run(replay(urls, trace))
        summary("before any plan", results, before, loads(agents))
        status, plan = co.post("/v1/plan")[:2]
        assert status == 200, plan
        print("plan:", json.dumps(plan["assignment"]), flush=True)
        wait_for(lambda: all(a.get("/v1/coordinator")["directives"]
                             and a.get("/v1/coordinator")["directives"]["plan_id"] == plan["id"]
                             and not a.get("/v1/coordinator")["prefetching"]
                             for a in agents), 60)
        before = loads(agents)
        trace = zipf_trace(names, args.requests, args.rate, args.seed + 1)
        results = asyncio.run(replay(urls, trace))
        summary("after POST /v1/plan", results, before, loads(agents))
    finally:
        for a in agents:
            a.stop()
        co.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=900)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--budget-share", type=float, default=1 / 3)
    ap.add_argument("--footprint", type=float, default=1.3,
                    help="memory per file byte the budget allows for")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, Path(tmp))


if __name__ == "__main__":
    main()
