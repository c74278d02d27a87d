"""Serving overhead: latency and throughput through the agent vs the same ONNX Runtime
session called directly in-process, small model, several client concurrencies.

The agent runs as its own process (``edgeagent serve``); the load generator is another
process, keep-alive, pre-encoded OIP v2 JSON bodies: ``--client aiohttp`` (default, a
Python client whose own cost, ~0.25 ms a request, is inside the agent figures) or
``--client wrk`` (the C load generator ``wrk`` with a Lua script: one thread, as many
connections as the concurrency; it needs the ``wrk`` binary on PATH). Both share this
machine's cores; ``health`` (GET /v2/health/live through the same client) shows the
HTTP round-trip floor. The overhead is agent p50 - direct ``session.run`` p50. Targets:
p50 overhead <= 0.3 ms, >= 3,000 req/s.

    .venv/bin/python bench/serving_overhead.py [--seconds 5] [--concurrency 1,4,16]
        [--client aiohttp|wrk] [--record-requests N]

``--record-requests 0`` runs the agent without its request record (the twin's ring,
on by default), to see what the record costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


# wrk: latencies from its histogram (microseconds), requests over the run's duration;
# any non-2xx answer or socket error fails the point.
WRK_SCRIPT = r"""
local f = io.open(os.getenv("EDGEAGENT_BENCH_BODY"), "rb")
local body = f:read("*a")
f:close()
if os.getenv("EDGEAGENT_BENCH_METHOD") == "POST" then
  wrk.method = "POST"
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, " ..
    "\"p99_us\": %d, \"errors\": %d, \"non2xx\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def through_wrk(url: str, seconds: float, concurrency: int, method: str, body: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script, data = Path(tmp) / "oip.lua", Path(tmp) / "body"
        script.write_text(WRK_SCRIPT)
        data.write_text(body)
        env = dict(os.environ, EDGEAGENT_BENCH_BODY=str(data), EDGEAGENT_BENCH_METHOD=method)
        out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(seconds, 1):.0f}s",
                              "--timeout", "10s", "-s", str(script), url],
                             capture_output=True, text=True, check=True, env=env)
    line = next(x for x in out.stdout.splitlines() if x.startswith("WRKJSON "))
    doc = json.loads(line[len("WRKJSON "):])
    if doc["errors"] or doc["non2xx"] or not doc["requests"]:
        raise RuntimeError(f"wrk on {url}: {doc}\n{out.stdout}")
    return {"p50_ms": doc["p50_us"] / 1000, "p99_ms": doc["p99_us"] / 1000,
            "rps": doc["requests"] / (doc["duration_us"] / 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--client", choices=("aiohttp", "wrk"), default="aiohttp",
                    help="load generator: the Python aiohttp client or wrk (C, Lua script)")
    ap.add_argument("--record-requests", type=int,
                    help="the agent's record_requests (0: no record) [default: the agent's]")
    args = ap.parse_args()
    if args.client == "wrk" and shutil.which("wrk") is None:
        ap.error("--client wrk needs the wrk binary on PATH (Debian: apt-get install wrk)")
    client = through_wrk if args.client == "wrk" else through_agent
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        path = write_mlp(repo / "small" / "1" / "model.onnx", **SHAPE)
        config = Path(tmp) / "agent.yaml"
        config.write_text("{}\n" if args.record_requests is None
                          else f"record_requests: {args.record_requests}\n")
        agent = subprocess.Popen(
            [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository",
             str(repo), "--port", "0", "--grpc-port", "0", "--data-dir",
             str(Path(tmp) / "data"),
             "--cpu-budget", "256MB", "--log-level", "warning", "--config", str(config)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            url = agent.stdout.readline().split()[3]
            x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
            body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 16],
                                           "data": x.ravel().tolist()}]})
            through_agent(url + "/v2/models/small/infer", 0.5, 1, "POST", body)  # load it
            print(f"model: MLP {SHAPE} ({path.stat().st_size} bytes), {os.cpu_count()} cores, "
                  f"{args.seconds:.0f} s per point, client {args.client}, record_requests "
                  f"{'default' if args.record_requests is None else args.record_requests}")
            print(f"{'conc':>4} {'path':8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
            rows = []
            for c in levels:
                d = direct(path, args.seconds, c)
                h = client(url + "/v2/health/live", args.seconds, c, "GET", "")
                a = client(url + "/v2/models/small/infer", args.seconds, c, "POST", body)
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
