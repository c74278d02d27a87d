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
    .venv/bin/python bench/serving_overhead.py --record-ab 8 [--seconds 2]
    .venv/bin/python bench/serving_overhead.py --against DIR [--rounds 8] [--seconds 2]
    .venv/bin/python bench/serving_overhead.py --tracing-ab 8 [--seconds 2]
    .venv/bin/python bench/serving_overhead.py --client wrk --profile 10 [--concurrency 1]

``--record-requests 0`` runs the agent without its request record (the twin's ring,
on by default). ``--record-ab R`` measures what the record costs: two agents, one with
``record_requests: 0`` and one with the default, measured at the first concurrency in
R rounds, alternating which goes first; it prints each round's p50/p99 of both, and the
difference (with - without) as its mean over the rounds with its spread, so "within
the noise" is a measured statement. ``--against DIR`` compares this checkout with
another (``git archive COMMIT | tar -x -C DIR``) the same way: an agent from each,
``--rounds`` rounds alternating, the difference this - DIR. ``--tracing-ab R``: what
OpenTelemetry traces cost (the tracing extra): an agent without ``tracing:`` and one
tracing requests (``--sample-ratio``, default every one) to a real OTLP/gRPC collector
that this process runs (it counts the spans it receives, printed at the end). ``--profile S`` samples the
agent for S seconds with py-spy (``pip install py-spy``, the bench extra; it needs the
right to trace the agent's process: root, or ``ptrace_scope`` 0) while the client loads
it at the first concurrency, and prints where the event loop's own time (while it holds
the GIL) goes: each function's share, inclusive and by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def start_agent(tmp: Path, repo: Path, record_requests: int | None,
                name: str, code: Path | None = None, settings: dict | None = None
                ) -> tuple[subprocess.Popen, str]:
    """An ``edgeagent serve`` process on ``repo`` (``record_requests`` None: the agent's
    default; ``settings``: more of its config), from the checkout ``code`` (None: as
    this process imports it); (process, base URL)."""
    config = tmp / f"{name}.yaml"
    doc = dict(settings or {})
    if record_requests is not None:
        doc["record_requests"] = record_requests
    config.write_text(json.dumps(doc) + "\n")  # JSON is YAML
    env = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    agent = subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository",
         str(repo), "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp / name),
         "--cpu-budget", "256MB", "--log-level", "warning", "--config", str(config)],
        stdout=subprocess.PIPE, text=True, cwd=code or ROOT, env=env)
    return agent, agent.stdout.readline().split()[3]


class SpanSink:
    """A real OTLP/gRPC trace collector on loopback that counts the spans it receives
    (opentelemetry-proto's service, from the tracing extra)."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as rpc

        sink = self
        self.spans = 0

        class Service(rpc.TraceServiceServicer):
            def Export(self, request, context):
                sink.spans += sum(len(scope.spans) for r in request.resource_spans
                                  for scope in r.scope_spans)
                return pb.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(1))
        rpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.endpoint = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


def record_ab(urls: dict[str, str], client, body: str, seconds: float, concurrency: int,
              rounds: int) -> None:
    """Both agents (``urls``: label -> URL) in ``rounds`` rounds, the order alternating
    (ABBA...); each round's p50/p99 and the p50/p99 differences' mean and spread."""
    labels = list(urls)
    rows: dict[str, list[dict]] = {label: [] for label in labels}
    print(f"{'round':>5} " + " ".join(f"{label + ' p50/p99 ms, req/s':>32}"
                                      for label in labels))
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            rows[label].append(client(urls[label] + "/v2/models/small/infer", seconds,
                                      concurrency, "POST", body))
        print(f"{r + 1:5d} " + " ".join(
            f"{rows[label][-1]['p50_ms']:>15.3f}/{rows[label][-1]['p99_ms']:<8.3f}"
            f"{rows[label][-1]['rps']:>8.0f}" for label in labels))
    with_, without = labels[1], labels[0]
    for q in ("p50_ms", "p99_ms"):
        a = np.array([x[q] for x in rows[with_]])
        b = np.array([x[q] for x in rows[without]])
        diff = a - b
        half = 2 * diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("inf")
        verdict = "within the noise" if abs(diff.mean()) <= half else "beyond the noise"
        print(f"{q[:3]} {with_} - {without}: {diff.mean():+.3f} ms, mean of {len(diff)} "
              f"rounds (rounds' sd {diff.std(ddof=1) if len(diff) > 1 else 0:.3f} ms, "
              f"±2 standard errors {half:.3f} ms: {verdict}); the rounds' median "
              f"difference {np.median(diff):+.3f} ms; medians {np.median(a):.3f} vs "
              f"{np.median(b):.3f} ms")
    a, b = (np.array([x["rps"] for x in rows[label]]) for label in (with_, without))
    print(f"req/s {with_} / {without}: {np.median(a / b):.3f}, the rounds' median ratio; "
          f"medians {np.median(a):.0f} vs {np.median(b):.0f} req/s")


def profile(agent: subprocess.Popen, url: str, client, body: str, seconds: float,
            concurrency: int, top: int = 45) -> None:
    """py-spy on ``agent`` for ``seconds`` under load; the event loop thread's shares."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        sampler = subprocess.Popen(
            [spy, "record", "-p", str(agent.pid), "-d", f"{seconds:.0f}", "-r", "1000",
             "--gil", "--nonblocking", "-f", "raw", "-o", str(raw)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        load = client(url + "/v2/models/small/infer", seconds + 2, concurrency, "POST", body)
        out = sampler.communicate(timeout=60)[0]
        if sampler.returncode or not raw.exists():
            print(f"py-spy could not sample the agent: {out.strip()[-500:]}")
            return
        inclusive, alone, total = shares(raw.read_text())
    print(f"profile: {total} samples of the event loop holding the GIL in {seconds:g} s, "
          f"{load['rps']:.0f} req/s at concurrency {concurrency} (py-spy slows it)")
    print(f"{'incl %':>7} {'self %':>7}  function")
    for frame, n in inclusive.most_common(top):
        print(f"{100 * n / total:7.1f} {100 * alone[frame] / total:7.1f}  {frame}")


def shares(collapsed: str) -> tuple[Counter, Counter, int]:
    """(samples per function inclusive, by itself, total) of the event loop thread's
    stacks in py-spy's collapsed output; the frames above the loop are left out."""
    inclusive: Counter = Counter()
    alone: Counter = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        loops = [i for i, f in enumerate(frames) if f.startswith(("run (uvloop",
                                                                   "Runner.run ("))]
        if not loops:
            continue
        loop = loops[-1]
        frames = frames[loop + 1:] or ["(the loop itself)"]
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        alone[frames[-1]] += int(count)
    return inclusive, alone, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--client", choices=("aiohttp", "wrk"), default="aiohttp",
                    help="load generator: the Python aiohttp client or wrk (C, Lua script)")
    ap.add_argument("--record-requests", type=int,
                    help="the agent's record_requests (0: no record) [default: the agent's]")
    ap.add_argument("--record-ab", type=int, metavar="ROUNDS",
                    help="the record's cost: agents without and with it, ROUNDS rounds "
                         "alternating, at the first --concurrency")
    ap.add_argument("--against", type=Path, metavar="DIR",
                    help="this checkout vs the one in DIR, --rounds rounds alternating, at "
                         "the first --concurrency")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of --against")
    ap.add_argument("--tracing-ab", type=int, metavar="ROUNDS",
                    help="the cost of tracing every request (OTLP to a collector run "
                         "here): agents without and with, ROUNDS rounds alternating")
    ap.add_argument("--sample-ratio", type=float, default=1.0,
                    help="tracing.sample_ratio of --tracing-ab's traced agent")
    ap.add_argument("--profile", type=float, metavar="SECONDS",
                    help="then sample the agent with py-spy for SECONDS under load at the "
                         "first --concurrency and print where the event loop's time goes")
    args = ap.parse_args()
    if args.record_ab is not None and (args.record_ab < 2 or args.record_requests is not None):
        ap.error("--record-ab needs at least 2 rounds and no --record-requests")
    if args.client == "wrk" and shutil.which("wrk") is None:
        ap.error("--client wrk needs the wrk binary on PATH (Debian: apt-get install wrk)")
    client = through_wrk if args.client == "wrk" else through_agent
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        path = write_mlp(repo / "small" / "1" / "model.onnx", **SHAPE)
        x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
        body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 16],
                                       "data": x.ravel().tolist()}]})
        sink = None
        if args.record_ab is not None or args.against is not None or args.tracing_ab:
            if args.tracing_ab:
                sink = SpanSink()
                traced = {"tracing": {"endpoint": sink.endpoint,
                                      "sample_ratio": args.sample_ratio}}
                agents = {"without": start_agent(Path(tmp), repo, args.record_requests,
                                                 "without"),
                          "with": start_agent(Path(tmp), repo, args.record_requests,
                                              "with", settings=traced)}
                title = (f"tracing's cost: no tracing: (without) vs sample_ratio "
                         f"{args.sample_ratio:g} (with)")
            elif args.against is not None:
                agents = {"there": start_agent(Path(tmp), repo, args.record_requests,
                                               "there", args.against.resolve()),
                          "here": start_agent(Path(tmp), repo, args.record_requests, "here",
                                              ROOT)}
                title = f"this checkout (here) vs {args.against} (there)"
            else:
                agents = {label: start_agent(Path(tmp), repo, n, label)
                          for label, n in (("without", 0), ("with", None))}
                title = "the record's cost: record_requests 0 (without) vs the default (with)"
            try:
                for _, url in agents.values():
                    through_agent(url + "/v2/models/small/infer", 0.5, 1, "POST", body)
                print(f"{title}, concurrency {levels[0]}, {args.seconds:g} s a point, "
                      f"client {args.client}, load average {os.getloadavg()[0]:.1f}")
                record_ab({k: url for k, (_, url) in agents.items()}, client, body,
                          args.seconds, levels[0],
                          args.record_ab or args.tracing_ab or args.rounds)
                print(f"load average {os.getloadavg()[0]:.1f} at the end")
            finally:
                for agent, _ in agents.values():
                    agent.terminate()
                    agent.wait(30)
                if sink is not None:
                    print(f"the collector received {sink.spans} spans")
                    sink.stop()
            return
        agent, url = start_agent(Path(tmp), repo, args.record_requests, "agent")
        try:
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
            if args.profile:
                profile(agent, url, client, body, args.profile, levels[0])
        finally:
            agent.terminate()
            agent.wait(30)


if __name__ == "__main__":
    main()
