"""How long a plan of N nodes takes, and where the time goes, without the fleet bench.

For each ``--nodes`` size: a fresh store (SQLite in a temporary directory; PostgreSQL
with ``--store postgresql://...``, whose ``nodes``, ``rate_bins``, ``models`` and
``plans`` are emptied first, or ``--store pg``: a throwaway cluster, as
``tests/pgcluster.py`` makes them) holding a ``--catalog``-model catalog and N nodes
written through the store's own API (``Store.write_reports``, the records ingestion
makes: ``ingest.report_record``), each node's report the one ``coordinator_scale.py``'s
simulated nodes send as they renew leases (``--models`` models, capacity, batches,
latency percentiles, each model's ``rate`` and the ``report_id``), its full report
written up to ``--full-report-s`` ago and its lease (``last_seen``) renewed within the
last ``--interval``; the fleet's arrival history (``history_s`` of bins per model, at
the rates the nodes report) written as reports of an old node no longer live.

Then ``--plans`` plans in a row (the first with no plan before it, the next ones
placing against the last): each timed in this process, by part (reading the live
reports, the rest of ``build``, forecasts (their reads of the bins included), solve,
place, render, saving the plan, and what the planning child sends back: the plan's
text and each node's directive row), and then the same plan made by a real planning
process (``planworker.PlanWorker``, what ``POST /v1/plan`` calls: niced, its garbage
collector off, the plan's text and rows sent back over its pipe), timed from this side,
with that process's peak RSS; then a reactive check that finds every node renewed
(as each does with leases every 10 s), timed in this process, and a second one
``reactive_interval_s`` later (the steady state: every node heard from again by its
lease, as ``lease_write_s`` lets the planner take it, none with a new full report).
``--profile DIR`` writes each size's cProfile of the in-process plan there and prints
its top functions; ``--keep DIR`` keeps each size's SQLite fleet there and plans on it
again on the next run (its plans deleted first), e.g. with ``--tree`` naming another
checkout's code.

    .venv/bin/python bench/plan_scale.py --nodes 10000,30000,100000
    .venv/bin/python bench/plan_scale.py --nodes 30000 --profile /tmp/prof
    .venv/bin/python bench/plan_scale.py --nodes 10000 --store pg
    .venv/bin/python bench/plan_scale.py --nodes 100000 --keep /tmp/fleets --tree ../base
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
#: ``--tree DIR``: plan with another checkout's code (this bench's own harness)
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv[:-1] else None
if _TREE is not None:
    sys.path.insert(0, str(Path(_TREE).resolve()))

from agent.coordinator import planner as planner_module  # noqa: E402
from agent.coordinator.catalog import ModelSLO  # noqa: E402
from agent.coordinator.config import CoordinatorConfig  # noqa: E402
from agent.coordinator.ingest import report_record  # noqa: E402
from agent.coordinator.planner import Planner  # noqa: E402
from agent.coordinator.planworker import PlanWorker  # noqa: E402
from agent.coordinator.store import StoredPlan  # noqa: E402
from agent.coordinator.stores import open_store  # noqa: E402
from agent.wire import parse_report  # noqa: E402
from bench.coordinator_scale import node_body, report_id  # noqa: E402

PARTS = ("read nodes", "build (rest)", "forecast", "solve", "place", "render", "save",
         "text + rows")


def leasing_body(i: int, models: int, catalog: int, interval: float) -> dict:
    """Node ``i``'s full report as a node renewing leases sends it (its models' rates
    and its report id beside the simulated node's report)."""
    body = json.loads(node_body(i, models, catalog, interval))
    for m in body["models"].values():
        m["rate"] = m["requests"] / interval
    body["report_id"] = report_id(i)
    return body


def fill(store: Any, nodes: int, args: argparse.Namespace, now: float) -> None:
    """The catalog, ``nodes`` live nodes' reports and leases, and the fleet's history."""
    for m in range(args.catalog):
        store.put_model(ModelSLO(f"m{m}", slo_ms=200.0), now - 3600)
    rng = random.Random(0)
    rates: dict[str, float] = {}
    batch, renewed = [], {}
    for i in range(nodes):
        name = f"node-{i}"
        body = leasing_body(i, args.models, args.catalog, args.interval)
        raw = json.dumps(body).encode()
        report = parse_report(name, raw)
        reported = now - rng.uniform(args.interval, args.full_report_s)
        batch.append(report_record(name, raw, report, reported))
        renewed[name] = now - rng.uniform(0, args.interval)
        for model, m in body["models"].items():
            rates[model] = rates.get(model, 0.0) + m["rate"]
        if len(batch) == 2000:
            store.write_reports(batch, renewed)
            batch, renewed = [], {}
    store.write_reports(batch, renewed)
    # the fleet's history up to the oldest full report, as an old node's reports
    step, end = store.rate_step_s, now - args.full_report_s
    points = {model: [(t, step, rate * step) for t in
                      (end - k * step for k in range(int(args.history_s // step)))]
              for model, rate in rates.items()}
    store.write_reports([report_record("history", b"{}", parse_report("history", {
        "capacity": {"cores": 1, "cpu_memory_bytes": 1}}), end - 3600)._replace(
        arrivals=points)])


class Parts:
    """Seconds spent in each wrapped call, by part, less the wrapped calls it made."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._inner = [0.0]  # per open call: the seconds of the wrapped calls it made

    def wrap(self, part: str, call: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._inner.append(0.0)
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                self.seconds[part] += took - self._inner.pop()
                self._inner[-1] += took
        return timed


#: Planner methods timed (those of a planner before ``read_fleet`` too), by part.
TIMED = (("read_fleet", "read nodes"), ("live_reports", "read nodes"),
         ("_problem", "build (rest)"), ("build", "build (rest)"),
         ("rate_forecast", "forecast"), ("_place", "place"), ("_render", "render"),
         ("_saved", "save"))


@contextmanager
def instrumented(planner: Planner, parts: Parts) -> Iterator[None]:
    """``planner`` with its parts timed (the module's ``solve`` too, restored after)."""
    solve = planner_module.solve
    planner_module.solve = parts.wrap("solve", solve)
    timed = [attr for attr, _ in TIMED if hasattr(planner, attr)]
    for attr, part in TIMED:
        if hasattr(planner, attr):
            setattr(planner, attr, parts.wrap(part, getattr(planner, attr)))
    try:
        yield
    finally:
        planner_module.solve = solve
        for attr in timed:
            delattr(planner, attr)


def plan_in_process(planner: Planner, profile: cProfile.Profile | None
                    ) -> tuple[float, dict[str, float], StoredPlan]:
    """One ``plan_now`` as the planning child makes it (garbage collector off, then its
    text and rows): (seconds, seconds by part, the plan)."""
    parts = Parts()
    gc.disable()
    t0 = time.perf_counter()
    try:
        with instrumented(planner, parts):
            if profile is not None:
                profile.enable()
            stored = planner.plan_now("manual")
            t1 = time.perf_counter()
            stored.text, stored.rows  # what the child sends back
            if profile is not None:
                profile.disable()
        parts.seconds["text + rows"] = time.perf_counter() - t1
    finally:
        gc.enable()
    return time.perf_counter() - t0, parts.seconds, stored


def warm_kernels() -> None:
    """Load the solver's and the forecast's compiled kernels here before any timing (a
    planning process loads them at its first plan: the first size's first plan there
    includes that)."""
    from agent.coordinator.faro import Capacity, JobSpec, Problem, forecast, solve

    solve(Problem(Capacity(8, 1e12), (JobSpec("a", 20.0, 0.05, 0.2, 99.0, 1.0, 1.0, 1e8),)))
    forecast(np.arange(30.0), 6, n_samples=200, seed=0)


def peak_rss_mib(pid: int | None) -> float:
    """``pid``'s peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def reset_pg(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("nodes", "rate_bins", "models", "plans"):
            try:
                conn.execute(f"DELETE FROM {table}")
            except psycopg.errors.UndefinedTable:
                pass


def one_size(nodes: int, args: argparse.Namespace, url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(args.keep) / f"{nodes}" if args.keep and url is None else Path(tmp)
        config = CoordinatorConfig(state_dir=state, store=url, history_s=args.history_s,
                                   log_level="warning")
        if url is not None:
            reset_pg(url)
        kept = state / "now"  # when a kept fleet was written (its clock)
        store = open_store(config)
        t0 = time.perf_counter()
        if kept.exists():
            now = float(kept.read_text())
            with sqlite3.connect(config.database) as db:  # the first plan has none before
                db.execute("DELETE FROM plans")
        else:
            now = time.time()
            fill(store, nodes, args, now)
            if args.keep and url is None:
                kept.write_text(repr(now))
        written = time.perf_counter() - t0
        clock = [now]  # the reactive checks move it on
        planner = Planner(store, config, clock=lambda: clock[0])
        worker = PlanWorker(config, store, clock=lambda: now)
        worker.start()
        print(f"\n{nodes:,} nodes ({args.models} models each of {args.catalog}; written "
              f"in {written:.1f} s), store {'PostgreSQL' if url else 'SQLite'}")
        print(f"{'plan':>5} {'load':>5} {'in process':>11}  "
              + "  ".join(f"{p:>12}" for p in PARTS)
              + f"  {'planning process':>16} {'its peak RSS':>12} {'assigned':>8}")
        try:
            for k in range(args.plans):
                load = loadavg()
                profile = cProfile.Profile() if args.profile and k == args.plans - 1 \
                    else None
                total, parts, stored = plan_in_process(planner, profile)
                t1 = time.perf_counter()
                child = worker.plan_now("manual")
                child_s = time.perf_counter() - t1
                assigned = len(stored.rows)
                same = child.rows == stored.rows
                print(f"{k + 1:>5} {load:>5} {total:>10.2f}s  "
                      + "  ".join(f"{parts[p]:>11.2f}s" for p in PARTS)
                      + f"  {child_s:>15.2f}s {peak_rss_mib(worker.pid):>8.0f} MiB "
                      f"{assigned:>8}" + ("" if same else "  (child's rows differ!)"))
                if profile is not None:
                    path = Path(args.profile) / f"plan-{nodes}.prof"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    profile.dump_stats(path)
                    stats = pstats.Stats(profile).sort_stats("tottime")
                    stats.print_stats(args.top)
            gc.disable()  # as in the planning process
            for what in ("every node renewed", "again, reactive_interval_s later"):
                t0, c0 = time.perf_counter(), time.process_time()
                planner.reactive_tick()
                print(f"reactive check, {what}: {time.perf_counter() - t0:.2f} s "
                      f"({time.process_time() - c0:.2f} s of CPU)")
                clock[0] += config.reactive_interval_s
            gc.enable()
        finally:
            worker.close()
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="10000,30000,100000",
                        help="comma-separated fleet sizes (default 10000,30000,100000)")
    parser.add_argument("--models", type=int, default=10, help="models per node")
    parser.add_argument("--catalog", type=int, default=1000, help="models in the catalog")
    parser.add_argument("--interval", type=float, default=10.0,
                        help="seconds between a node's leases (default 10)")
    parser.add_argument("--full-report-s", type=float, default=300.0,
                        help="a node's full report at most this old (default 300)")
    parser.add_argument("--history-s", type=float, default=900.0,
                        help="the coordinator's history_s (default 900, its default)")
    parser.add_argument("--plans", type=int, default=2, help="plans in a row per size")
    parser.add_argument("--store", default=None,
                        help="postgresql://... (emptied first) or pg (a throwaway "
                             "cluster); default SQLite")
    parser.add_argument("--profile", default=None,
                        help="directory for a cProfile of each size's last plan")
    parser.add_argument("--top", type=int, default=25, help="profile lines printed")
    parser.add_argument("--tree", default=None,
                        help="plan with the agent package of this checkout (a baseline)")
    parser.add_argument("--keep", default=None,
                        help="keep each size's SQLite fleet in this directory and use it "
                             "again on the next run (its plans deleted first)")
    args = parser.parse_args()
    print(f"plan_scale: {time.strftime('%Y-%m-%d %H:%M:%S')} cpus={os.cpu_count()} "
          f"load {Path('/proc/loadavg').read_text().strip()}; planner of "
          f"{Path(planner_module.__file__).parents[2]}")
    warm_kernels()
    cluster = None
    url = args.store
    try:
        if args.store == "pg":
            from tests.pgcluster import Cluster, find_bindir

            root = Path(tempfile.mkdtemp(prefix="edgeagent-pg-"))
            cluster = Cluster(find_bindir(), root).init()
            cluster.start()
            url = cluster.new_database()
        for n in (int(x) for x in args.nodes.split(",")):
            one_size(n, args, url)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nthis process's peak RSS {peak:.0f} MiB; load "
          f"{Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
