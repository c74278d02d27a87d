"""Serving overhead: latency and throughput through the agent vs the same ONNX Runtime
session called directly in-process, small model, several client concurrencies.

The agent runs as its own process (``edgeagent serve``); the load generator is another
process (aiohttp client, keep-alive, pre-encoded OIP v2 JSON bodies). Both share this
machine's cores, so client cost is inside the agent figures; ``health`` (GET
/v2/health/live) shows the HTTP round-trip floor. Targets: p50 overhead <= 0.3 ms,
>= 3,000 req/s.

    .venv/bin/python bench/serving_overhead.py [--seconds 5] [--concurrency 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.modelzoo import write_mlp  # noqa: E402

SHAPE = dict(inputs=16, hidden=64, layers=2, outputs=4, seed=0)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def direct(path: Path, seconds: float, concurrency: int) -> dict:
    """The same session options the agent uses, called from ``concurrency`` threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = {"X": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)}
    sess.run(None, x)
    end = time.perf_counter() + seconds

    def worker() -> list[float]:
        lat = []
        while time.perf_counter() < end:
            t = time.perf_counter()
            sess.run(None, x)
            lat.append(time.perf_counter() - t)
        return lat

    with ThreadPoolExecutor(concurrency) as pool:
        lats = [v for f in [pool.submit(worker) for _ in range(concurrency)] for v in f.result()]
    return {"p50_ms": pct(lats, 50), "p99_ms": pct(lats, 99), "rps": len(lats) / seconds}


CLIENT = r"""
import asyncio, json, sys, time, aiohttp
url, seconds, conc, method, body = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5].encode()
async def main():
    lats = []
    conn = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one():
            t = time.perf_counter()
            if method == "GET":
                async with s.get(url) as r: await r.read(); assert r.status == 200
            else:
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read(); assert r.status == 200, await r.text()
            return time.perf_counter() - t
        for _ in range(50): await one()
        end = time.perf_counter() + seconds
        async def worker():
            while time.perf_counter() < end: lats.append(await one())
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        took = time.perf_counter() - start
    print(json.dumps({"lats": lats, "seconds": took}))
asyncio.run(main())
"""


def through_agent(url: str, seconds: float, concurrency: int, method: str, body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT, url, str(seconds), str(concurrency),
                          method, body], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    lats = doc["lats"]
    return {"p50_ms": pct(lats, 50), "p99_ms": pct(lats, 99), "rps": len(lats) / doc["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", default="1,4,16")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        path = write_mlp(repo / "small" / "1" / "model.onnx", **SHAPE)
        agent = subprocess.Popen(
            [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository",
             str(repo), "--port", "0", "--data-dir", str(Path(tmp) / "data"),
             "--cpu-budget", "256MB", "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            url = agent.stdout.readline().split()[3]
            x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
            body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 16],
                                           "data": x.ravel().tolist()}]})
            through_agent(url + "/v2/models/small/infer", 0.5, 1, "POST", body)  # load it
            print(f"model: MLP {SHAPE} ({path.stat().st_size} bytes), {os.cpu_count()} cores, "
                  f"{args.seconds:.0f} s per point")
            print(f"{'conc':>4} {'path':8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
            rows = []
            for c in levels:
                d = direct(path, args.seconds, c)
                h = through_agent(url + "/v2/health/live", args.seconds, c, "GET", "")
                a = through_agent(url + "/v2/models/small/infer", args.seconds, c, "POST", body)
                for label, r in (("direct", d), ("health", h), ("agent", a)):
                    print(f"{c:4d} {label:8} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['rps']:8.0f}")
                rows.append((c, d, h, a))
            c, d, h, a = rows[0]
            print(f"p50 overhead at concurrency {c}: agent - direct = "
                  f"{a['p50_ms'] - d['p50_ms']:.3f} ms (target <= 0.3 ms); of which the HTTP "
                  f"round trip with this client (health p50) is {h['p50_ms']:.3f} ms")
            best = max(r[3]["rps"] for r in rows)
            print(f"best agent throughput: {best:.0f} req/s (target >= 3000); direct at the "
                  f"same concurrency: {max(r[1]['rps'] for r in rows):.0f} req/s")
        finally:
            agent.terminate()
            agent.wait(30)


if __name__ == "__main__":
    main()
