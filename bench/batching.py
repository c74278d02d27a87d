"""Adaptive batching on a real ONNX model: throughput and latency through the agent for
no batching, a static batch size and adaptive batching (AIMD + MArk window), under an
open-loop Poisson load at increasing offered rates, against the best offline
throughput (direct ``session.run`` at the best batch size whose latency is within the
SLO) as the limit.

The model is a weight-heavy MLP (about 290 MiB of float32 weights): a batch of one is
bound by reading the weights, so batching pays (the offline table shows how much). The
agent runs as its own process (``edgeagent serve``, one ONNX Runtime thread per session,
as configured by default); the load generator is another process (a minimal keep-alive
HTTP/1.1 client on asyncio streams, binary tensor data). All share this machine's
cores, so on a small box client and HTTP costs are inside the agent figures. Each point
runs ``--warm`` unmeasured seconds, then ``--seconds`` measured; modes are interleaved
and each figure is the median over ``--repeat`` runs.

    .venv/bin/python bench/batching.py [--seconds 3] [--slo-ms 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.modelzoo import write_mlp  # noqa: E402

SHAPE = dict(inputs=1024, hidden=8192, layers=2, outputs=16, seed=0)
SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MODES = {  # model name -> its config.yaml (beside the SLO)
    "no-batching": {"max_batch_size": 0},
    "static-8": {"max_batch_size": 8, "batching": {"adaptive": False, "window_ms_max": 0}},
    "adaptive": {"max_batch_size": 256},
}
LOADS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.2)  # offered load, × the offline limit


def offline_limit(path: Path, slo: float) -> tuple[dict[int, float], int, float]:
    """(median seconds by batch size, best size within the SLO, its items/s)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    times = {}
    for b in SIZES:
        x = rng.standard_normal((b, SHAPE["inputs"])).astype(np.float32)
        session.run(None, {"X": x})
        runs = []
        deadline = time.perf_counter() + 1.5
        while len(runs) < 5 or (time.perf_counter() < deadline and len(runs) < 200):
            t = time.perf_counter()
            session.run(None, {"X": x})
            runs.append(time.perf_counter() - t)
        times[b] = statistics.median(runs)
    within = [b for b in SIZES if times[b] <= slo]
    best = max(within, key=lambda b: b / times[b])
    return times, best, best / times[best]


CLIENT = r"""
import asyncio, json, sys, time
from urllib.parse import urlsplit
import numpy as np
url, rate, warm, seconds, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
x = np.random.default_rng(seed).standard_normal((1, int(sys.argv[6]))).astype(np.float32)
header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, x.shape[1]],
                                  "parameters": {"binary_data_size": x.nbytes}}],
                     "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
body = header + x.tobytes()
parts = urlsplit(url)
request = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
           f"Inference-Header-Content-Length: {len(header)}\r\n"
           f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
           ).encode() + body
idle = []  # keep-alive connections: a minimal HTTP/1.1 client costs the agent's box less
async def one(out, record):
    t = time.perf_counter()
    if idle:
        reader, writer = idle.pop()
    else:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    idle.append((reader, writer))
    if record:
        out.append((status, time.perf_counter() - t))
async def main():
    rng = np.random.default_rng(seed)
    out, tasks = [], []
    start = time.perf_counter()
    nxt = start
    while nxt < start + warm + seconds:
        nxt += rng.exponential(1 / rate)
        delay = nxt - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(out, nxt >= start + warm)))
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    print(json.dumps(out))
asyncio.run(main())
"""


def load_point(url: str, rate: float, warm: float, seconds: float, seed: int) -> dict:
    """One open-loop run: goodput (200s per second), latency of 200s, share of 503s."""
    run = subprocess.run([sys.executable, "-c", CLIENT, url, str(rate), str(warm),
                          str(seconds), str(seed), str(SHAPE["inputs"])],
                         capture_output=True, text=True, check=True)
    results = json.loads(run.stdout)
    ok = [t for status, t in results if status == 200]
    other = {s for s, _ in results} - {200, 503}
    if other:
        raise RuntimeError(f"unexpected statuses {other}")
    return {"goodput": len(ok) / seconds,
            "p50": float(np.percentile(ok, 50)) if ok else float("nan"),
            "p99": float(np.percentile(ok, 99)) if ok else float("nan"),
            "shed": 1 - len(ok) / max(len(results), 1)}


def start_agent(repo: Path, data: Path) -> tuple[subprocess.Popen, str]:
    config = data / "agent.yaml"
    config.write_text(yaml.safe_dump({"repository": str(repo), "data_dir": str(data),
                                      "cpu_budget": "2GiB", "port": 0, "restore": False,
                                      "log_level": "warning"}))
    agent = subprocess.Popen([str(Path(sys.executable).with_name("edgeagent")), "serve",
                              "--config", str(config), "--grpc-port", "0"], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    return agent, agent.stdout.readline().split()[3]


def inspect(url: str, name: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/cache/{name}", timeout=10) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per point")
    ap.add_argument("--warm", type=float, default=1.5, help="unmeasured seconds first")
    ap.add_argument("--slo-ms", type=float, default=200.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loads", default=",".join(map(str, LOADS)))
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    modes = args.modes.split(",")
    slo = args.slo_ms / 1000
    loads = [float(x) for x in args.loads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo, data = Path(tmp) / "models", Path(tmp) / "data"
        data.mkdir()
        path = write_mlp(repo / "adaptive" / "1" / "model.onnx", **SHAPE)
        for name, cfg in MODES.items():
            target = repo / name / "1" / "model.onnx"
            if name != "adaptive":
                target.parent.mkdir(parents=True)
                os.link(path, target)
            (repo / name / "config.yaml").write_text(
                yaml.safe_dump({**cfg, "slo": {"latency_ms": args.slo_ms}}))
        times, best, limit = offline_limit(path, slo)
        print(f"model: MLP {SHAPE} ({path.stat().st_size / 2**20:.0f} MiB), "
              f"{os.cpu_count()} cores, SLO {args.slo_ms:.0f} ms (p99)")
        print("offline session.run, 1 thread: " + "  ".join(
            f"b={b}: {times[b] * 1000:.1f} ms ({b / times[b]:.0f}/s)" for b in SIZES))
        print(f"offline limit: {limit:.0f} req/s at batch {best} ({times[best] * 1000:.1f} ms "
              f"<= SLO); batch 1: {1 / times[1]:.0f} req/s")
        agent, url = start_agent(repo, data)
        runs: dict[tuple[str, float], list[dict]] = {}
        try:
            for name in modes:  # load each model and give it first measurements
                load_point(f"{url}/v2/models/{name}/infer", 20, 0.0, 1.0, 0)
            # Modes interleaved, point by point and repeat by repeat: a burst of load from
            # elsewhere on the machine then hits every mode alike.
            for seed in range(1, args.repeat + 1):
                for frac in loads:
                    for name in modes:
                        r = load_point(f"{url}/v2/models/{name}/infer", frac * limit,
                                       args.warm, args.seconds, seed)
                        info = inspect(url, name)
                        r.update(limit=info["batch_limit"], window=info["batch_window_ms"])
                        runs.setdefault((name, frac), []).append(r)
        finally:
            agent.terminate()
            agent.wait(60)
        print(f"medians of {args.repeat} run(s) per point:")
        print(f"{'mode':12} {'offered/s':>9} {'goodput/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'503 %':>6}  {'limit':>5} {'window ms':>9}")
        rows: dict[str, list[tuple[float, dict]]] = {}
        for name in modes:
            rows[name] = []
            for frac in loads:
                points = runs[(name, frac)]
                med = {k: statistics.median(p[k] for p in points) for k in points[0]}
                rows[name].append((frac * limit, med))
                print(f"{name:12} {frac * limit:9.0f} {med['goodput']:9.0f} "
                      f"{med['p50'] * 1000:8.1f} {med['p99'] * 1000:8.1f} "
                      f"{med['shed'] * 100:6.1f}  {med['limit']:5.0f} {med['window']:9.2f}")
        print(f"\nbest goodput with p99 <= SLO ({args.slo_ms:.0f} ms), as a share of the "
              f"offline limit ({limit:.0f}/s):")
        for name, points in rows.items():
            ok = [m for _, m in points if m["p99"] <= slo]
            best_ok = max((m["goodput"] for m in ok), default=0.0)
            worst_p99 = max(m["p99"] for _, m in points) * 1000
            print(f"  {name:12} {best_ok:7.0f}/s = {best_ok / limit:6.1%} of the limit "
                  f"(p99 over all loads: max {worst_p99:.1f} ms)")
        best = {name: max((m["goodput"] for _, m in points if m["p99"] <= slo), default=0.0)
                for name, points in rows.items()}
        if "adaptive" in best:
            others = "; ".join(f"adaptive / {name} = {best['adaptive'] / best[name]:.1f}"
                               for name in best if name != "adaptive" and best[name] > 0)
            print(f"adaptive / offline limit = {best['adaptive'] / limit:.2f} "
                  f"(target >= 0.85)" + (f"; {others}" if others else ""))


if __name__ == "__main__":
    main()
