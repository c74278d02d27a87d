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
real agent pulling each model's file over HTTP from a local Range server that waits
that model's download seconds before sending it (``tests/helpers.py``
``replay_three_tiers``). Floors: cremebrulee's total delay at most 0.85 x LRU's where
the simulator predicts a gain; live within 5 % of the simulated loads and 15 % of its
mean response.

    .venv/bin/python bench/pull.py replay [--seed 1] [--seeds 8] [--live] [--out DIR]

``--seeds N`` also prints the simulated ratio for N workloads (seeds from ``--seed``);
``--live`` replays the first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402
from agent.sources import open_source  # noqa: E402
from cachepolicies.simulator import SimulationResult, simulate  # noqa: E402
from cachepolicies.twin import Queueing  # noqa: E402
from tests.helpers import ThreeTier, replay_three_tiers, three_tier_workload  # noqa: E402
from tests.servers import oci_registry, range_http_server, s3_server  # noqa: E402

SCHEMES = ("file", "http", "s3", "oci")

POLICIES = ("cremebrulee", "lru")  # each on both tiers
GAIN_FLOOR = 0.85  # penalty-aware total delay / LRU's
LOADS_WITHIN, MEAN_WITHIN = 0.05, 0.15  # live against simulated
#: The twin's settings: the live replay's agent (64 workers per model, 32 loads at once).
QUEUEING = Queueing(workers=64, load_concurrency=32)


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
def simulated(work: ThreeTier, policy: str, queueing: Queueing = QUEUEING
              ) -> SimulationResult:
    """The simulator's replay of ``work`` with ``policy`` on both tiers, through the twin
    with ``queueing`` (the live agent's load slots)."""
    return simulate(work.trace, work.profiles, work.memory_bytes, policy, queueing=queueing,
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
              f"--workers {QUEUEING.workers} --load-concurrency {QUEUEING.load_concurrency}")
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
    if args.live:
        replay_live_agent(args)


def replay_live_agent(args: argparse.Namespace) -> None:
    """``replay --live``: the same trace simulated then replayed against a live agent."""
    work = three_tier_workload(args.seed, requests=args.requests, rate=args.rate)
    print("live: the same trace against an agent pulling each model's file over HTTP")
    print(HEADER)
    lives = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in POLICIES:
            sim = Figures.of(simulated(work, policy, dataclasses.replace(
                QUEUEING, load_concurrency=args.loads, max_concurrent_pulls=args.pulls)))
            print(sim.row(f"sim {policy}"), flush=True)
            results, listing, served = replay_three_tiers(
                work, policy, Path(tmp) / policy, load_concurrency=args.loads,
                max_concurrent_pulls=args.pulls)
            lives[policy] = live_figures(results, listing, served)
            print(lives[policy].row(f"live {policy}") + agreement(lives[policy], sim),
                  flush=True)
    gain = lives["cremebrulee"].total_delay / lives["lru"].total_delay
    print(f"live: cremebrulee / lru total delay {gain:.3f} (floor <= {GAIN_FLOOR}: "
          f"{'ok' if gain <= GAIN_FLOOR else 'MISSED'})")
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")


def live_figures(results, listing, served) -> Figures:
    """A live replay's figures: loads and load seconds as the agent booked them (each
    model's last load), pulls as the server sent them (not the sources' 1-byte probes).
    Failed requests are printed (there should be none: a pull that finds the disk held
    by models pulling or loading waits for room)."""
    failed = [status for _, status in results if status != 200]
    if failed:
        print(f"  {len(failed)} of {len(results)} requests failed: "
              f"{dict(zip(*np.unique(failed, return_counts=True)))}")
    loads = sum(m["loads"] for m in listing)
    load_seconds = sum(m["loads"] * (m["load_seconds"] + m["first_run_seconds"])
                       for m in listing)
    pulls = [s for s in served if s.sent > 1]
    download_seconds = sum(s.seconds for s in pulls)
    return Figures(loads, len(pulls), sum(s.sent for s in pulls), download_seconds,
                   load_seconds + download_seconds,
                   float(np.mean([seconds for seconds, _ in results])))


def agreement(live: Figures, sim: Figures) -> str:
    """How far ``live`` is from ``sim`` against the floors."""
    loads = live.loads / sim.loads - 1
    mean = live.mean_response / sim.mean_response - 1
    verdict = "ok" if abs(loads) <= LOADS_WITHIN and abs(mean) <= MEAN_WITHIN else "MISSED"
    return f"   live: loads {loads:+.1%}, mean {mean:+.1%} ({verdict})"


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
    p.add_argument("--loads", type=int, default=32,
                   help="--live: the agent's load_concurrency (the simulator bounds none)")
    p.add_argument("--pulls", type=int, default=32,
                   help="--live: the agent's max_concurrent_pulls")
    p.add_argument("--out", help="write the trace and profiles CSV files here")
    p.set_defaults(run=replay)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
