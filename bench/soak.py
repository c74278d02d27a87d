"""Soak (issue 13): a real agent (``edgeagent serve``, a subprocess on loopback) with
``--models`` real ONNX MLPs on a budget that holds about ``--hold`` of them, driven for
``--minutes`` by 8 closed-loop clients: Zipf popularity (s = 1) over the models, and a
share (``--hostile``) of hostile requests from ``bench/reliability.py``'s generator.
Prints figures; not a test.

Counts: requests sent, answered by status, lost (no HTTP answer: connection error or
client timeout of 60 s; must be 0), 5xx other than 503/507 (must be 0); the agent's RSS
(process and children) sampled every second: after warm-up (the first fifth of the run)
its minimum, maximum and last value, and the last against the first sample after warm-up
(flat within +-10 % is the goal).

    .venv/bin/python bench/soak.py                 # 3 minutes
    .venv/bin/python bench/soak.py --minutes 30 --json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pressure import (RssSampler, get_json,  # noqa: E402
                            start_agent_process, stop_process, wait_http)
from bench.reliability import FAMILIES, hostile_request  # noqa: E402


def write_models(repo: Path, n: int) -> int:
    """``n`` seeded MLPs (64 inputs; hidden width varies): their file bytes in all."""
    from agent.modelzoo import write_mlp

    rng = np.random.default_rng(13)
    total = 0
    for i in range(n):
        path = repo / f"m{i:03d}" / "1" / "model.onnx"
        write_mlp(path, inputs=64, hidden=int(rng.integers(96, 320)), layers=2, outputs=8,
                  seed=i)
        total += path.stat().st_size
    return total


def body(rows: int = 1) -> bytes:
    return json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [rows, 64],
                                   "data": [0.5] * (64 * rows)}]}).encode()


async def drive(base: str, models: int, seconds: float, hostile: float, seed: int) -> dict:
    import aiohttp

    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(models)]
    statuses: collections.Counter = collections.Counter()
    lost: list[str] = []
    errors: collections.Counter = collections.Counter()
    end = time.monotonic() + seconds
    valid = body()
    timeout = aiohttp.ClientTimeout(total=60)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def client() -> None:
            while time.monotonic() < end:
                if rng.random() < hostile:
                    method, path, data, headers = hostile_request(
                        rng, rng.choice(list(FAMILIES)))
                else:
                    i = rng.choices(range(models), weights)[0]
                    method, path, data, headers = "POST", f"/v2/models/m{i:03d}/infer", valid, {}
                try:
                    async with session.request(method, base + path, data=data,
                                               headers=headers) as resp:
                        payload = await resp.read()
                        statuses[resp.status] += 1
                        if resp.status >= 500 and resp.status not in (503, 507):
                            errors[payload[:120].decode(errors="replace")] += 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    lost.append(f"{method} {path}: {exc!r}")

        await asyncio.gather(*(client() for _ in range(8)))
    return {"statuses": dict(sorted(statuses.items())), "sent": sum(statuses.values())
            + len(lost), "lost": len(lost), "lost_examples": lost[:5],
            "server_errors": sum(errors.values()), "server_error_examples": dict(errors)}


#: The soak's request record (``record_requests``): small, so the soak wraps it many times.
RECORD_REQUESTS = 2000


def run_soak(minutes: float, models: int = 200, hold: int = 10, hostile: float = 0.1,
             seed: int = 13) -> dict:
    """Run the soak (module docstring) and return its figures: what ``drive`` counts,
    ``rss`` (MiB after warm-up, drift and spread in %), ``loads``, ``agent_alive``, and
    ``record`` (the twin's request record at the end: requests held, bytes, rows of
    ``GET /v1/trace``, against its cap ``RECORD_REQUESTS``)."""
    seconds = minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "models"
        file_bytes = write_models(repo, models)
        budget = int(file_bytes / models * hold * 1.6)  # ~1.6x a file resident
        log = work / "agent.log"
        proc, base = start_agent_process(work, {
            "repository": str(repo), "data_dir": str(work / "data"),
            "cpu_budget": budget, "log_level": "warning", "slo": {"latency_ms": 30000},
            "grpc_port": 0, "record_requests": RECORD_REQUESTS}, log)
        samples: list[tuple[float, int]] = []
        stop = threading.Event()
        try:
            wait_http(base + "/v2/health/ready", proc, 120, log)
            sampler = RssSampler(proc.pid)
            started = time.monotonic()

            def sample() -> None:
                while not stop.is_set():
                    samples.append((time.monotonic() - started, sampler.rss()))
                    stop.wait(1.0)

            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
            result = asyncio.run(drive(base, models, seconds, hostile, seed))
            stop.set()
            thread.join()
            cache = get_json(base + "/v1/cache")
            record = record_size(base)
            alive = proc.poll() is None
        finally:
            stop.set()
            stop_process(proc)
    mib = 1 / 2**20
    warm = [rss for t, rss in samples if t >= seconds / 5]
    rss = {"budget_mib": round(budget * mib), "after_warmup_first_mib": round(warm[0] * mib),
           "min_mib": round(min(warm) * mib), "max_mib": round(max(warm) * mib),
           "last_mib": round(warm[-1] * mib),
           "drift_pct": round((warm[-1] / warm[0] - 1) * 100, 1),
           "spread_pct": round((max(warm) / min(warm) - 1) * 100, 1)}
    loads = sum(e.get("loads", 0) for e in cache) if isinstance(cache, list) else None
    return {"minutes": minutes, "models": models, **result, "rss": rss, "loads": loads,
            "agent_alive": alive, "record": record}


def record_size(base: str) -> dict:
    """The request record's size as ``/metrics`` and ``GET /v1/trace?since=0`` show it."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    gauges = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith(("edgeagent_record_requests ", "edgeagent_record_bytes "))}
    with urllib.request.urlopen(base + "/v1/trace?since=0", timeout=30) as resp:
        rows = resp.read().decode().count("\n") - 1  # less the CSV header
    return {"cap": RECORD_REQUESTS, "requests": int(gauges["edgeagent_record_requests"]),
            "bytes": int(gauges["edgeagent_record_bytes"]), "trace_rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--hold", type=int, default=10, help="models the budget holds, about")
    ap.add_argument("--hostile", type=float, default=0.1, help="share of hostile requests")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run_soak(args.minutes, args.models, args.hold, args.hostile, args.seed)
    rss, loads, alive = out["rss"], out["loads"], out["agent_alive"]
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"soak: {args.minutes:g} min, {args.models} ONNX MLPs, budget "
          f"{rss['budget_mib']} MiB (~{args.hold} models), 8 clients, Zipf s=1, "
          f"{args.hostile:.0%} hostile")
    print(f"  sent {out['sent']}, statuses {out['statuses']}")
    print(f"  request record at the end: {out['record']}")
    print(f"  lost (no answer): {out['lost']}  5xx other than 503/507: {out['server_errors']}"
          f"  loads: {loads}")
    for ex in out["lost_examples"]:
        print(f"      {ex}")
    for ex, n in out["server_error_examples"].items():
        print(f"      {n} x {ex}")
    print(f"  RSS after warm-up: first {rss['after_warmup_first_mib']} MiB, min "
          f"{rss['min_mib']}, max {rss['max_mib']}, last {rss['last_mib']} MiB "
          f"(last vs first {rss['drift_pct']:+.1f} %, max vs min {rss['spread_pct']:.1f} %)")
    print(f"agent still running: {alive}")


if __name__ == "__main__":
    main()
