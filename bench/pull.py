"""Pulling models: ``sources`` times a cold pull (list, download, verify, rename) of
real ONNX models of 1-200 MB from each kind of source on loopback: ``file://``, a
Range-capable ``http://`` server, moto's S3 server and Debian's ``docker-registry``,
with MB/s. Each pull goes to a fresh directory (nothing resumed); the median of
``--reps`` pulls. Sections are subcommands, so later parts of issue 26 add theirs.

    .venv/bin/python bench/pull.py sources [--sizes 1,10,50,200] [--reps 3]
        [--schemes file,http,s3,oci]

``replay``: the three-tier replay. A Zipf trace over 40 synthetic models (room for 6 in
memory and 15 on disk; downloads of 0.05-3 s, as from sources of different speeds),
replayed with the penalty-aware policy on both tiers (cremebrulee) and with LRU on both:
loads, downloads, bytes pulled, total delay (downloads + loads) and mean response, first
through ``simulate --queueing --disk-capacity`` (seconds), then with ``--live`` against a
real agent pulling each model's file over HTTP from a local server that sends it in that
model's download time (Range). Floors: cremebrulee's total delay at most 0.85 x LRU's
where the simulator predicts a gain; live within 5 % of the simulated loads and 15 % of
its mean response.

    .venv/bin/python bench/pull.py replay [--seed 1] [--seeds 8] [--live] [--out DIR]

``--seeds N`` also prints the simulated ratio for N workloads (seeds from ``--seed``);
``--live`` replays the first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.server
import logging
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402
from agent.sources import open_source  # noqa: E402
from cachepolicies.simulator import SimulationResult, simulate  # noqa: E402
from cachepolicies.traces import Profiles, Trace, make_profiles, make_trace  # noqa: E402
from tests.servers import oci_registry, range_http_server, s3_server  # noqa: E402

SCHEMES = ("file", "http", "s3", "oci")

POLICIES = ("cremebrulee", "lru")  # each on both tiers
GAIN_FLOOR = 0.85  # penalty-aware total delay / LRU's
LOADS_WITHIN, MEAN_WITHIN = 0.05, 0.15  # live against simulated
WORKERS = 256  # the simulator's: none waits for one (the agent has no global limit)


def make_model(root: Path, megabytes: int) -> Path:
    """``root/1/model.onnx``: an MLP of about ``megabytes`` MB (one hidden x hidden
    matrix of float32)."""
    hidden = int(math.sqrt(megabytes * 1e6 / 4))
    return write_mlp(root / "1" / "model.onnx", inputs=64, hidden=hidden, layers=2,
                     outputs=8, seed=megabytes)


@contextlib.contextmanager
def publish(scheme: str, root: Path, work: Path) -> Iterator[tuple[str, dict]]:
    """(url, options) of ``root`` (holding ``1/model.onnx``) published in ``scheme``."""
    model = root / "1" / "model.onnx"
    if scheme == "file":
        yield root.as_uri(), {}
    elif scheme == "http":
        digest = hashlib.sha256(model.read_bytes()).hexdigest()
        with range_http_server(model.parent) as server:
            yield f"{server.url}/model.onnx#sha256={digest}", {}
    elif scheme == "s3":
        with s3_server(work / "aws") as s3:
            os.environ.update(s3.env)
            s3.client().create_bucket(Bucket="bench")
            opts = {"endpoint_url": s3.endpoint_url}
            open_source("s3://bench/model", opts).push(root / "1", 1)
            yield "s3://bench/model", opts
    else:
        with oci_registry(work / "registry") as reg:
            url = f"oci://{reg.host}/bench/model"
            open_source(url).push(root / "1", "1")
            yield url, {}


def time_pulls(url: str, opts: dict, work: Path, reps: int,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for i in range(reps):
        dest = work / f"pull-{i}" / "1"
        src = open_source(url, opts)
        t = clock()
        src.pull(1, dest)
        out.append(clock() - t)
    return out


def sources(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    schemes = [s for s in args.schemes.split(",") if s]
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'scheme':6} {'MB':>6} {'pull s':>8} {'MB/s':>8}   (median of {args.reps})")
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "src"
            megabytes = make_model(root, size).stat().st_size / 1e6
            for scheme in schemes:
                work = Path(tmp) / scheme
                try:
                    with publish(scheme, root, work) as (url, opts):
                        took = statistics.median(time_pulls(url, opts, work, args.reps))
                except BaseException as exc:  # noqa: BLE001 - pytest.skip's "no server here"
                    if type(exc).__name__ != "Skipped":
                        raise
                    print(f"{scheme:6} {megabytes:6.1f}  skipped: {exc}")
                    continue
                print(f"{scheme:6} {megabytes:6.1f} {took:8.3f} {megabytes / took:8.1f}",
                      flush=True)
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")


# -- the three-tier replay ------------------------------------------------------------------
@dataclass(frozen=True)
class ThreeTier:
    """The replay's workload: profiles (with ``download_seconds`` and ``disk_bytes``), the
    trace, and the two capacities (bytes)."""

    profiles: Profiles
    trace: Trace
    memory_bytes: int
    disk_bytes: int


def three_tier_workload(seed: int = 1, models: int = 40, requests: int = 480,
                        rate: float = 8.0, zipf: float = 0.9, in_memory: int = 6,
                        on_disk: int = 15, download: tuple[float, float] = (0.05, 3.0)
                        ) -> ThreeTier:
    """Zipf (``zipf``) over ``models`` synthetic models, popularity independent of the
    download seconds (log-uniform in ``download``: a fast mirror to a slow remote store),
    Poisson arrivals at ``rate``; memory for ``in_memory`` models of mean size, disk for
    ``on_disk`` models' files of mean size."""
    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(models)]
    size = rng.integers(10, 40, models) * 1_000_000
    disk = rng.integers(1, 5, models) * 500_000
    load = rng.uniform(0.1, 0.25, models)
    execs = rng.uniform(0.06, 0.12, models)  # well above the HTTP round trip
    download = np.exp(rng.uniform(*np.log(download), models))
    weights = 1 / np.arange(1, models + 1) ** zipf
    weights = weights[rng.permutation(models)]
    picks = rng.choice(models, requests, p=weights / weights.sum())
    times = np.cumsum(rng.exponential(1 / rate, requests))
    profiles = make_profiles(names, size, load, execs, download_seconds=download,
                             disk_bytes=disk)
    trace = make_trace(times - times[0], [names[i] for i in picks], profiles)
    return ThreeTier(profiles, trace, int(in_memory * size.mean()), int(on_disk * disk.mean()))


def simulated(work: ThreeTier, policy: str) -> SimulationResult:
    """The simulator's replay of ``work`` with ``policy`` on both tiers."""
    return simulate(work.trace, work.profiles, work.memory_bytes, policy, queueing=WORKERS,
                    disk_capacity=work.disk_bytes)


def write_inputs(work: ThreeTier, out: Path) -> None:
    """The trace and profiles as the simulator's CSV files, for ``edgeagent simulate``."""
    out.mkdir(parents=True, exist_ok=True)
    p = work.profiles
    with open(out / "profiles.csv", "w") as f:
        f.write("model,size_bytes,load_seconds,exec_seconds,download_seconds,disk_bytes\n")
        for row in zip(p.names, p.size_bytes, p.load_seconds, p.exec_seconds,
                       p.download_seconds, p.disk_bytes):
            f.write("{},{},{!r},{!r},{!r},{}\n".format(*row))
    with open(out / "trace.csv", "w") as f:
        f.write("timestamp,model\n")
        for t, m in zip(work.trace.timestamps.tolist(), work.trace.model_ids.tolist()):
            f.write(f"{t!r},{p.names[m]}\n")


@dataclass
class Figures:
    """One replay's figures, simulated or live."""

    loads: int
    downloads: int
    bytes_pulled: int
    download_seconds: float
    total_delay: float  # downloads + loads
    mean_response: float

    @classmethod
    def of(cls, result: SimulationResult) -> Figures:
        return cls(result.misses, result.downloads, result.bytes_downloaded,
                   result.download_delay_seconds, result.load_delay_seconds,
                   result.mean_response_seconds)

    def row(self, label: str) -> str:
        return (f"{label:<20} {self.loads:>6} {self.downloads:>9} "
                f"{self.bytes_pulled / 1e6:>9.1f} {self.download_seconds:>10.1f} "
                f"{self.total_delay:>10.1f} {self.mean_response:>9.3f}")


HEADER = (f"{'':<20} {'loads':>6} {'downloads':>9} {'pulled_MB':>9} {'download_s':>10} "
          f"{'total_s':>10} {'mean_s':>9}")


def replay(args: argparse.Namespace) -> None:
    """The ``replay`` subcommand."""
    work = three_tier_workload(args.seed, requests=args.requests, rate=args.rate)
    if args.out:
        write_inputs(work, Path(args.out))
        print(f"inputs: {args.out}/trace.csv, {args.out}/profiles.csv; the same run: "
              f"edgeagent simulate --trace {args.out}/trace.csv --profiles "
              f"{args.out}/profiles.csv --capacity {work.memory_bytes} --disk-capacity "
              f"{work.disk_bytes} --policy cremebrulee --policy lru --queueing "
              f"--workers {WORKERS}")
    print(f"seed {args.seed}: {len(work.trace)} requests over {len(work.profiles)} models, "
          f"{work.trace.timestamps[-1]:.0f} s; memory {work.memory_bytes / 1e6:.0f} MB "
          f"(6 models), disk {work.disk_bytes / 1e6:.1f} MB (15 models' files)")
    print(HEADER)
    sims = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        sims[policy] = Figures.of(simulated(work, policy))
        print(sims[policy].row(f"sim {policy}") + f"   ({time.perf_counter() - t0:.2f} s)",
              flush=True)
    gain = sims["cremebrulee"].total_delay / sims["lru"].total_delay
    print(f"simulated: cremebrulee / lru total delay {gain:.3f} (floor <= {GAIN_FLOOR} "
          f"where it predicts a gain: {'ok' if gain <= GAIN_FLOOR else 'MISSED'})")
    if args.seeds > 1:
        gains = []
        for seed in range(args.seed, args.seed + args.seeds):
            other = three_tier_workload(seed, requests=args.requests, rate=args.rate)
            ours, lru = (simulated(other, policy).load_delay_seconds for policy in POLICIES)
            gains.append(ours / lru)
        print(f"simulated, seeds {args.seed}-{args.seed + args.seeds - 1}: cremebrulee / lru "
              f"total delay {' '.join(f'{g:.2f}' for g in gains)}; mean {np.mean(gains):.3f}")
    if not args.live:
        return
    lives = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in POLICIES:
            lives[policy] = live(work, policy, Path(tmp) / policy)
            sim = sims[policy]
            loads = lives[policy].loads / sim.loads - 1
            mean = lives[policy].mean_response / sim.mean_response - 1
            verdict = ("ok" if abs(loads) <= LOADS_WITHIN and abs(mean) <= MEAN_WITHIN
                       else "MISSED")
            print(lives[policy].row(f"live {policy}") + f"   loads {loads:+.1%}, mean "
                  f"{mean:+.1%} against sim ({verdict})", flush=True)
    gain = lives["cremebrulee"].total_delay / lives["lru"].total_delay
    print(f"live: cremebrulee / lru total delay {gain:.3f} (floor <= {GAIN_FLOOR}: "
          f"{'ok' if gain <= GAIN_FLOOR else 'MISSED'})")


# -- the live replay ------------------------------------------------------------------------
class TimedFiles:
    """A threaded HTTP file server on 127.0.0.1 that sends each file in the seconds
    ``seconds[name]`` says (its body spread over them), with Range (``bytes=N-``)."""

    def __init__(self, root: Path, seconds: dict[str, float]) -> None:
        files = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                name = self.path.split("?")[0].lstrip("/")
                path = root / name
                if not name or not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                first = 0
                asked = self.headers.get("Range", "")
                if asked.startswith("bytes=") and asked.endswith("-"):
                    first = min(int(asked[6:-1]), len(data))
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {first}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[first:]
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                files.send(self.wfile, body, seconds.get(name, 0.0) * len(body)
                           / max(len(data), 1))

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def send(out, body: bytes, seconds: float, chunks: int = 20) -> None:
        """``body`` in ``chunks`` pieces, each at its share of ``seconds`` from the start."""
        start = time.perf_counter()
        step = -(-len(body) // chunks) or 1
        for n, at in enumerate(range(0, len(body), step), 1):
            out.write(body[at:at + step])
            out.flush()
            time.sleep(max(start + seconds * n * step / len(body) - time.perf_counter(), 0))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def live(work: ThreeTier, policy: str, tmp: Path) -> Figures:
    """``work`` replayed in real time against an agent (``policy`` on both tiers) whose
    models are synthetic and sourced from a ``TimedFiles`` server."""
    import yaml

    from agent.config import AgentConfig
    from tests.helpers import AgentServer, replay_live

    if "disk_budget" not in AgentConfig.__dataclass_fields__:
        raise SystemExit("--live needs the agent's disk tier (issue 26: branch disk)")
    p = work.profiles
    files, repo = tmp / "remote", tmp / "models"
    files.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, name in enumerate(p.names):
        data = rng.bytes(int(p.disk_bytes[i]))
        (files / f"{name}.bin").write_bytes(data)
        (repo / name).mkdir(parents=True)
    server = TimedFiles(files, {f"{n}.bin": float(s)
                                for n, s in zip(p.names, p.download_seconds)})
    try:
        for i, name in enumerate(p.names):
            digest = hashlib.sha256((files / f"{name}.bin").read_bytes()).hexdigest()
            config = {"backend": "synthetic",
                      "source": f"{server.url}/{name}.bin#sha256={digest}",
                      "synthetic": {"size_bytes": int(p.size_bytes[i]),
                                    "load_ms": float(p.load_seconds[i]) * 1000,
                                    "base_ms": float(p.exec_seconds[i]) * 1000},
                      "max_batch_size": 0, "slo": {"latency_ms": 60000},
                      "batching": {"workers": 64}}
            (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
        agent = AgentServer(AgentConfig(
            repository=repo, data_dir=tmp / "data", cpu_budget=work.memory_bytes,
            disk_budget=work.disk_bytes, policy=policy, infer_threads=2,
            load_concurrency=32, max_concurrent_pulls=32),
            budgets={"cpu": work.memory_bytes})
        try:
            results = asyncio.run(replay_live(agent.url, work.trace, p.names))
            listing = agent.request("GET", "/v1/cache")[2]
            disk = agent.node.disk.summary()
        finally:
            agent.close()
    finally:
        server.close()
    failed = [status for _, status in results if status != 200]
    if failed:
        raise SystemExit(f"live {policy}: {len(failed)} requests failed ({failed[:5]} ...)")
    loads = sum(m["loads"] for m in listing)
    load_seconds = sum(m["loads"] * float(p.load_seconds[p.index[m["name"]]])
                       for m in listing)
    download_seconds = float(disk.get("pull_seconds", float("nan")))
    return Figures(loads, disk["pulls"], disk["pulled_bytes"], download_seconds,
                   load_seconds + download_seconds,
                   float(np.mean([seconds for seconds, _ in results])))


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="section", required=True)
    p = sub.add_parser("sources", help="cold pull time per source and model size")
    p.add_argument("--sizes", default="1,10,50,200", help="model sizes in MB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.set_defaults(run=sources)
    p = sub.add_parser("replay", help="the three-tier replay (simulated, --live)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="workloads simulated")
    p.add_argument("--requests", type=int, default=480)
    p.add_argument("--rate", type=float, default=8.0, help="requests/s")
    p.add_argument("--live", action="store_true",
                   help="also replay against a real agent and HTTP server (real time)")
    p.add_argument("--out", help="write the trace and profiles CSV files here")
    p.set_defaults(run=replay)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
