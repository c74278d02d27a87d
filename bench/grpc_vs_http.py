"""KServe v2 over gRPC vs over HTTP: latency and throughput of the same agent, the same
models, through the two real Triton clients (``tritonclient.grpc`` and
``tritonclient.http`` with binary tensors, as each sends by default), one client per
thread, several concurrencies. The baseline is HTTP in the same run; the ratio is
gRPC / HTTP (throughput > 1 and latency < 1: gRPC is faster).

The agent runs as its own process (``edgeagent serve --grpc-port P``, uvloop); the
clients share this machine's cores with it, and their own cost (Python, protobuf or
JSON headers) is inside the figures. ``live``: the health check (ServerLive,
``GET /v2/health/live``), the round trip without a model; two models: ``small`` (an
MLP, 1 x 16 FP32 in) and ``large`` (an MLP, 64 x 1024 FP32 in: 256 KiB a request).

    .venv/bin/python bench/grpc_vs_http.py [--seconds 3] [--concurrency 1,8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.modelzoo import write_mlp  # noqa: E402
from bench.pressure import free_port  # noqa: E402

MODELS = {"small": (dict(inputs=16, hidden=64, layers=2, outputs=4, seed=0), 1),
          "large": (dict(inputs=1024, hidden=64, layers=2, outputs=4, seed=1), 64)}


def start_agent(repo: Path, data: Path) -> tuple[subprocess.Popen, int, int]:
    """The agent on an HTTP port the OS picks (read back from its announcement) and a
    gRPC port picked here (``--grpc-port 0`` turns gRPC off): (process, http, grpc)."""
    grpc_port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository", str(repo),
         "--port", "0", "--grpc-port", str(grpc_port), "--data-dir", str(data),
         "--cpu-budget", "1GiB", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"the agent did not start: {line}")
    return proc, int(line.split()[3].rsplit(":", 1)[1]), grpc_port


def make_call(protocol: str, port: int, model: str, x: np.ndarray):
    """A function doing one request with a client of its own (one per thread)."""
    if protocol == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib
    client = client_lib.InferenceServerClient(f"127.0.0.1:{port}")
    inp = client_lib.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)

    def call() -> None:
        if model == "live":
            assert client.is_server_live()
            return
        result = client.infer(model, [inp])
        assert result.as_numpy("Y").shape == (x.shape[0], 4)

    return call


def measure(protocol: str, port: int, model: str, x: np.ndarray, seconds: float,
            concurrency: int) -> dict:
    start = threading.Barrier(concurrency)

    def worker() -> list[float]:
        call = make_call(protocol, port, model, x)  # in its thread (gevent's HTTP client)
        for _ in range(20):  # warm: connection open, model loaded, batcher sized
            call()
        start.wait()  # all warm: measure together
        end = time.perf_counter() + seconds
        lat = []
        while time.perf_counter() < end:
            t = time.perf_counter()
            call()
            lat.append(time.perf_counter() - t)
        return lat

    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(worker) for _ in range(concurrency)]
        lat = [v for f in futures for v in f.result()]
    return {"rps": len(lat) / seconds, "p50": float(np.percentile(lat, 50)) * 1000,
            "p99": float(np.percentile(lat, 99)) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name, (shape, _) in MODELS.items():
            write_mlp(repo / name / "1" / "model.onnx", **shape)
        proc, http, grpc_port = start_agent(repo, Path(tmp) / "data")
        try:
            print(f"{'model':<6} {'conc':>4} | {'HTTP req/s':>10} {'p50 ms':>7} {'p99 ms':>7} | "
                  f"{'gRPC req/s':>10} {'p50 ms':>7} {'p99 ms':>7} | {'rps x':>6} {'p50 x':>6}")
            rng = np.random.default_rng(0)
            for name, (shape, rows) in [("live", MODELS["small"]), *MODELS.items()]:
                x = rng.standard_normal((rows, shape["inputs"])).astype(np.float32)
                for c in levels:
                    h = measure("http", http, name, x, args.seconds, c)
                    g = measure("grpc", grpc_port, name, x, args.seconds, c)
                    print(f"{name:<6} {c:>4} | {h['rps']:>10.0f} {h['p50']:>7.2f} "
                          f"{h['p99']:>7.2f} | {g['rps']:>10.0f} {g['p50']:>7.2f} "
                          f"{g['p99']:>7.2f} | {g['rps'] / h['rps']:>6.2f} "
                          f"{g['p50'] / h['p50']:>6.2f}")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
