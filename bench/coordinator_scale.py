"""The coordinator at fleet scale: simulated nodes posting reports to a real coordinator.

A real ``edgeagent coordinator serve`` process; ``--catalog`` models with SLOs; N
simulated nodes, each on its own keep-alive connection (as the agent's reporter keeps
one), each posting a report of ``--models`` models every ``--interval`` seconds at a
random phase. The report body is the agent's (``agent.wire``: capacity, and per model
device, residency, size, arrivals, batches, batch profile, latency percentiles) and
is checked with ``agent.wire.parse_report`` before the run. Clients are ``--procs``
processes on raw asyncio streams; their CPU is printed beside the coordinator's so a
client bottleneck shows. Half-way through each run ``POST /v1/plan`` is timed while
ingestion goes on.

Figures per fleet size: nodes | offered/s | ingested/s (200 answers per second) |
report p50 | p99 (send to last byte of the answer) | max | p99 of the reports sent
while the plan was being made | late (sends the client could not
make on time) | POST /v1/plan | coordinator CPU (its main process and report workers,
not the planning child) and that CPU per ingested report | the planning child's CPU |
the clients' CPU and that per ingested report (all over the measured window: the box's
cores are shared by all three, so each side's share shows) | the 1-minute load average
before -> after (the box may be shared: a load above its cores starves the coordinator).

``--report-workers N`` runs the coordinator with that many report workers (its
``report_workers``); ``--tls`` serves it over TLS (a CA and a certificate made on the
fly; every node's connection verifies it, one handshake per node as the reporter's
kept connection; the warm-up is longer by a second per 100 nodes, for the handshakes); ``--dashboard S`` keeps the dashboard open (its requests every S
s, or ten times as long as the last refresh took where that is longer, as the page
waits; each refresh timed); ``--timeline MS`` also prints each second whose slowest report
took over MS ms (stalls show their period: a plan, a collection). The client
processes run without their garbage collector, whose pauses (5,000 connections each)
would show as report latency.

    .venv/bin/python bench/coordinator_scale.py --nodes 1000,5000,10000 --duration 30
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --report-workers 2
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --tls
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --store postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.wire import parse_report  # noqa: E402


def model_report(rng: random.Random, interval: float) -> dict:
    """One model's part of a report, as the agent's reporter writes it."""
    requests = float(rng.randint(0, 200))
    p50 = round(rng.uniform(5, 30), 3)
    return {"device": "cpu", "state": "ready", "resident": True, "pinned": False,
            "size_bytes": rng.randint(1, 50) * 1_000_000, "load_seconds": 0.2,
            "workers": 1, "arrivals": [[0.002, interval, requests]],
            "requests": requests, "drops": 0.0,
            "batches": {"1": {"count": 10_000, "seconds": 10_000 * p50 / 1000}},
            "batch_ms": {"1": p50},
            "latency_ms": {"p50": p50, "p90": round(p50 * 1.5, 3),
                           "p99": round(p50 * 2, 3), "p99.9": round(p50 * 3, 3)}}


def node_body(i: int, models: int, catalog: int, interval: float) -> bytes:
    rng = random.Random(i)
    body = {"capacity": {"cores": 8, "cpu_memory_bytes": 16 * 2**30, "gpus": []},
            "interval_s": interval,
            "models": {f"m{(i * models + j) % catalog}": model_report(rng, interval)
                       for j in range(models)}}
    parse_report(f"node-{i}", body)  # the wire schema the reporter speaks
    return json.dumps(body).encode()


# -- client processes ---------------------------------------------------------------------


async def _node(i: int, port: int, body: bytes, interval: float, start: float,
                measure: tuple[float, float], stats: dict, tls: Any = None) -> None:
    head = (f"POST /v1/nodes/node-{i}/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    request = head + body
    reader = writer = None
    due = start + random.Random(i).uniform(0, interval)
    loop = asyncio.get_running_loop()
    while due < measure[1]:
        await asyncio.sleep(max(0.0, due - loop.time()))
        sent, clock = loop.time(), time.perf_counter()  # uvloop's time() has ms steps
        wall = time.time()
        in_window = measure[0] <= due < measure[1]
        if in_window:
            stats["offered"] += 1
            if sent - due > 0.05:
                stats["late"] += 1
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            ok = status_line.split(b" ", 2)[1] == b"200"
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            ok = False
            if writer is not None:
                writer.close()
            reader = writer = None
        if in_window:
            if ok:
                stats["ok"] += 1
                stats["latency"].append((wall, time.perf_counter() - clock))
            else:
                stats["errors"] += 1
        due += interval
    if writer is not None:
        writer.close()


def client(ids: list[int], port: int, models: int, catalog: int, interval: float,
           t0: float, warmup: float, duration: float, out: "mp.Queue",
           ca_file: str | None = None) -> None:
    """One client process: its nodes' loops; puts its counts, latencies and CPU."""
    bodies = {i: node_body(i, models, catalog, interval) for i in ids}
    tls = tls_context(ca_file)
    stats = {"offered": 0, "ok": 0, "errors": 0, "late": 0, "latency": []}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time() + (t0 - time.time())
        measure = (start + warmup, start + warmup + duration)
        for at, key in zip(measure, ("window_cpu0", "window_cpu1")):  # the steady state
            loop.call_at(at, lambda key=key: stats.__setitem__(key, time.process_time()))
        await asyncio.gather(*(_node(i, port, bodies[i], interval, start, measure, stats,
                                     tls) for i in ids))

    gc.freeze()  # this client's own collector pauses (5,000 connections' objects, over
    gc.disable()  # 100 ms each) would show as report latency: none for a short run
    cpu0 = time.process_time()
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    stats["cpu_s"] = time.process_time() - cpu0
    stats["window_cpu_s"] = stats.get("window_cpu1", time.process_time()) \
        - stats.get("window_cpu0", cpu0)
    out.put(stats)


# -- the coordinator ----------------------------------------------------------------------


def tls_context(ca_file: str | None) -> Any:
    """A client context trusting ``ca_file`` (None: plain HTTP)."""
    if ca_file is None:
        return None
    from agent.security.tls import client_context

    return client_context(Path(ca_file))


def request(url: str, method: str = "GET", body: dict | None = None, timeout: float = 120,
            ca_file: str | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout, context=tls_context(ca_file)) as resp:
        return resp.status, json.loads(resp.read())


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_ticks(fields: list[str]) -> int:
    return int(fields[11]) + int(fields[12])  # utime + stime


def _processes():
    """(``/proc/PID/stat`` fields after the name, command name) of every process
    still there."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                yield _stat(int(proc.name)), (proc / "comm").read_text().strip()
            except OSError:
                pass  # gone meanwhile


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU of the coordinator process ``pid`` and its report workers (its children at
    its own nice value), and of its planning process (the child that runs niced)."""
    fields = _stat(pid)
    ours = planner = 0
    for f, _ in _processes():
        if f[1] == str(pid):
            if f[16] == fields[16]:
                ours += _cpu_ticks(f)
            else:
                planner += _cpu_ticks(f)
    tick = os.sysconf("SC_CLK_TCK")
    return (_cpu_ticks(fields) + ours) / tick, planner / tick


def database_cpu_seconds() -> float:
    """CPU of this box's PostgreSQL server processes (their command is ``postgres``):
    a database on the same box takes its share of the cores."""
    ticks = sum(_cpu_ticks(f) for f, comm in _processes() if comm == "postgres")
    return ticks / os.sysconf("SC_CLK_TCK")


def start_coordinator(state: Path, store: str | None, reactive_s: float,
                      report_workers: int = 0, tls: dict | None = None,
                      ca_file: str | None = None) -> tuple[subprocess.Popen, str]:
    """The coordinator on a port the OS picks: (process, the URL it announced), ready;
    ``tls``: its ``tls:`` section, ``ca_file`` what verifies it."""
    config = {"port": 0, "state_dir": str(state), "log_level": "warning",
              "reactive_interval_s": reactive_s}
    if tls:
        config["tls"] = tls
    if report_workers:  # (a tree before report workers refuses the key)
        config["report_workers"] = report_workers
    if store and store != "sqlite":
        config["store"] = store
    (state / "coordinator.yaml").write_text(json.dumps(config))
    proc = subprocess.Popen([sys.executable, "-c", "from agent.cli import main; main()",
                             "coordinator", "serve", "--config", str(state / "coordinator.yaml")],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "edgeagent coordinator listening on URL ..."
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"the coordinator did not start: {line!r}")
    url = line.split("listening on ")[1].split()[0]
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # the rest, unread
    for _ in range(600):
        try:
            request(f"{url}/v1/health", timeout=1, ca_file=ca_file)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the coordinator did not start")


def _time_plan(url: str, timed: dict, ca_file: str | None) -> None:
    """``POST /v1/plan``: its seconds, wall-clock span and replicas (or why not) into
    ``timed``."""
    t = time.perf_counter()
    timed["span"] = [time.time(), float("inf")]
    try:
        status, plan = request(f"{url}/v1/plan", "POST", ca_file=ca_file)
        timed["span"][1] = time.time()
        timed["plan_s"] = time.perf_counter() - t
        timed["replicas"] = sum(m["replicas"] for m in plan["models"].values())
    except urllib.error.HTTPError as err:
        timed["plan_s"], timed["replicas"] = float("nan"), \
            f"HTTP {err.code}: {err.read()[:200]!r}"
    except OSError as err:  # timed out: the clients' figures still come
        timed["plan_s"], timed["replicas"] = float("nan"), f"{type(err).__name__}: {err}"


#: What the coordinator's dashboard page asks for at each refresh.
DASHBOARD_PATHS = "/v1/nodes?limit=100,/v1/models,/v1/plan"


def _dashboard(url: str, paths: list[str], every: float, until: float,
               seen: list[tuple[float, int]], ca_file: str | None) -> None:
    """An open dashboard page: GET ``paths`` every ``every`` s, or ten times as long as
    the last refresh took where that is longer (after the last refresh ended, as the
    page's timer) until ``until``; each refresh's seconds and bytes into ``seen``. One
    after another: the page sends its three at once, but they are answered on the
    coordinator's one event loop anyway."""
    while time.time() < until:
        t, size = time.perf_counter(), 0
        for path in paths:
            try:
                with urllib.request.urlopen(url + path, timeout=120,
                                            context=tls_context(ca_file)) as resp:
                    size += len(resp.read())
            except urllib.error.HTTPError as err:  # /v1/plan: 404 before a first plan
                size += len(err.read())
        seen.append((time.perf_counter() - t, size))
        time.sleep(max(every, 10 * seen[-1][0]))


def print_timeline(results: list[dict], wall0: float, plan_span: tuple[float, float],
                   slow_ms: float) -> None:
    """Each second of the measured window whose slowest report took over ``slow_ms``:
    its reports, p99 and max, and whether a plan was being made (where stalls come
    from: periodic ones show their period)."""
    seconds: dict[int, list[float]] = {}
    for r in results:
        for wall, x in r["latency"]:
            seconds.setdefault(int(wall - wall0), []).append(x * 1000)
    print(f"  timeline: seconds with a report over {slow_ms:g} ms (t from the window's start)")
    for t in sorted(seconds):
        xs = sorted(seconds[t])
        if xs[-1] > slow_ms:
            planning = plan_span[0] - wall0 <= t + 1 and t <= plan_span[1] - wall0
            print(f"  t={t:>4}s  reports={len(xs):>5}  p99={xs[int(0.99 * len(xs))]:>7.1f}  "
                  f"max={xs[-1]:>7.1f}{'  (planning)' if planning else ''}")


def make_certificates(directory: Path) -> tuple[dict, str]:
    """(the coordinator's ``tls:`` section, the CA file that verifies it), made here."""
    from tests.helpers import issue_cert, make_ca

    ca = make_ca(directory)
    server = issue_cert(ca, directory, "coordinator")
    return {"cert_file": str(server.cert_file), "key_file": str(server.key_file)}, \
        str(ca.cert_file)


def run(nodes: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tls, ca_file = make_certificates(Path(tmp)) if args.tls else (None, None)
        co, url = start_coordinator(Path(tmp), args.store, args.reactive_interval,
                                    args.report_workers, tls, ca_file)
        port = int(url.rsplit(":", 1)[1])
        try:
            for m in range(args.catalog):
                request(f"{url}/v1/models/m{m}", "PUT", {"slo_ms": 200}, ca_file=ca_file)
            # everyone reported twice, connections open (with TLS, the whole fleet's
            # handshakes at once, as after a coordinator restart, settle first: the
            # window measures the steady state of kept connections)
            # (a handshake costs the two sides ~3.5 ms of CPU together, Python's ssl and
            # OpenSSL 3.0: 10,000 of them take ~35 s of this box's two cores)
            warmup = args.interval * 2 + (nodes / 100 if args.tls else 0.0)
            t0 = time.time() + 2.0
            out: mp.Queue = mp.get_context("fork").Queue()
            procs = [mp.get_context("fork").Process(
                target=client, args=(list(range(p, nodes, args.procs)), port, args.models,
                                     args.catalog, args.interval, t0, warmup,
                                     args.duration, out, ca_file))
                for p in range(args.procs)]
            for p in procs:
                p.start()
            time.sleep(max(0.0, t0 + warmup - time.time()))
            co_cpu0, db_cpu0, wall0 = cpu_seconds(co.pid), database_cpu_seconds(), time.time()
            refreshes: list[tuple[float, int]] = []
            if args.dashboard:
                threading.Thread(target=_dashboard, daemon=True, args=(
                    url, args.dashboard_paths.split(","), args.dashboard,
                    wall0 + args.duration, refreshes, ca_file)).start()
            time.sleep(args.duration / 2)
            timed: dict = {}
            planning = threading.Thread(target=_time_plan, args=(url, timed, ca_file))
            planning.start()
            time.sleep(max(0.0, wall0 + args.duration - time.time()))
            co_cpu, planner_cpu = (b - a for a, b in zip(co_cpu0, cpu_seconds(co.pid)))
            db_cpu = database_cpu_seconds() - db_cpu0
            wall = time.time() - wall0
            results = [out.get() for _ in procs]
            planning.join()
            plan_s, replicas = timed["plan_s"], timed["replicas"]
            for p in procs:
                p.join()
        finally:
            co.send_signal(signal.SIGTERM)
            try:
                co.wait(60)
            except subprocess.TimeoutExpired:
                print(f"  (the coordinator did not stop within 60 s of SIGTERM; killed)")
                co.kill()
                co.wait()
    latency = sorted(x for r in results for _, x in r["latency"])
    lo, hi = timed["span"]
    planning = sorted(x for r in results for t, x in r["latency"] if lo <= t <= hi)

    def pct(q: float, values: list[float] = latency) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values \
            else float("nan")
    total = {k: sum(r[k] for r in results) for k in ("offered", "ok", "errors", "late")}
    if args.timeline:
        print_timeline(results, wall0, (lo, hi), args.timeline)
    return {"nodes": nodes, "offered_s": total["offered"] / args.duration,
            "ingested_s": total["ok"] / args.duration, "errors": total["errors"],
            "late": total["late"], "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": pct(1.0), "plan_s": plan_s, "replicas": replicas,
            "planning_p99_ms": pct(0.99, planning),
            "coordinator_cpu": co_cpu / wall, "database_cpu": db_cpu / wall,
            "cpu_ms_per_report": co_cpu * 1000 / max(1, total["ok"]),
            "client_cpu": sum(r["window_cpu_s"] for r in results) / args.duration,
            "planner_cpu": planner_cpu / wall,
            "client_ms_per_report": sum(r["window_cpu_s"] for r in results) * 1000
            / max(1, total["ok"]),
            "refreshes": refreshes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000,10000",
                        help="fleet sizes, comma-separated (default 1000,5000,10000)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds measured per fleet size (default 30)")
    parser.add_argument("--store", default="sqlite",
                        help="sqlite (default) or a postgresql:// URL")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="seconds between a node's reports (default 5, the agent's)")
    parser.add_argument("--models", type=int, default=10, help="models per report")
    parser.add_argument("--catalog", type=int, default=1000, help="models in the catalog")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--reactive-interval", type=float, default=10.0,
                        help="the coordinator's reactive_interval_s (default 10, its own)")
    parser.add_argument("--report-workers", type=int, default=0,
                        help="the coordinator's report_workers (default 0)")
    parser.add_argument("--tls", action="store_true",
                        help="serve over TLS (certificates made on the fly)")
    parser.add_argument("--timeline", type=float, default=None, metavar="MS",
                        help="also print each second whose slowest report took over MS ms")
    parser.add_argument("--dashboard", type=float, default=None, metavar="S",
                        help="also keep the dashboard open: its requests every S s (the "
                             "page's default is 2) or, as the page, ten times as long as the "
                             "last refresh took where that is longer; timed")
    parser.add_argument("--dashboard-paths", default=DASHBOARD_PATHS,
                        help=f"what one refresh asks for (default {DASHBOARD_PATHS})")
    parser.add_argument("--autogroup-nice", type=int, default=None,
                        help="run in a session of its own whose scheduler autogroup has "
                             "this nice value (Linux; negative needs root): with autogroups "
                             "on, CPU is shared between sessions first, so another "
                             "session's nice 19 job still takes a core's share from this "
                             "one; -10 gives the bench the priority their nice meant")
    args = parser.parse_args()
    autogroup = Path("/proc/self/autogroup")
    if args.autogroup_nice is not None:
        if os.getsid(0) != os.getpid():  # a session (and autogroup) of its own first
            os.execvp("setsid", ["setsid", "-w", sys.executable, *sys.argv])
        autogroup.write_text(str(args.autogroup_nice))
    groups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(f"store={args.store} interval={args.interval:g}s models/report={args.models} "
          f"catalog={args.catalog} client procs={args.procs} cpus={os.cpu_count()} "
          f"reactive_interval_s={args.reactive_interval:g} tls={args.tls} autogroups="
          f"{groups.read_text().strip() if groups.exists() else '-'} "
          f"({autogroup.read_text().strip() if autogroup.exists() else '-'})")
    print(f"{'nodes':>6} | {'offered/s':>9} | {'ingested/s':>10} | {'errors':>6} | "
          f"{'late':>5} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | "
          f"{'p99 planning':>12} | {'plan s':>6} | "
          f"{'coord CPU':>9} | {'ms/report':>9} | {'planner CPU':>11} | {'client CPU':>10} | "
          f"{'client ms/report':>16} | load avg")
    for n in [int(x) for x in args.nodes.split(",")]:
        load0 = os.getloadavg()[0]
        r = run(n, args)
        print(f"{r['nodes']:>6} | {r['offered_s']:>9.0f} | {r['ingested_s']:>10.0f} | "
              f"{r['errors']:>6} | {r['late']:>5} | {r['p50_ms']:>7.1f} | {r['p99_ms']:>7.1f} | "
              f"{r['max_ms']:>7.1f} | {r['planning_p99_ms']:>12.1f} | {r['plan_s']:>6.2f} | "
              f"{r['coordinator_cpu']:>8.0%} | "
              f"{r['cpu_ms_per_report']:>9.3f} | {r['planner_cpu']:>10.0%} | "
              f"{r['client_cpu']:>9.0%} | {r['client_ms_per_report']:>16.3f} | "
              f"{load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        if args.store != "sqlite":
            print(f"         PostgreSQL's server processes on this box: "
                  f"{r['database_cpu']:.0%} of a core", flush=True)
        if r["refreshes"]:
            took = sorted(t for t, _ in r["refreshes"])
            print(f"         dashboard every {args.dashboard:g} s: {len(took)} refreshes of "
                  f"{max(b for _, b in r['refreshes']) / 1e6:.1f} MB, each "
                  f"{took[len(took) // 2]:.2f} s (median), {took[-1]:.2f} s (max)", flush=True)
        if not isinstance(r["replicas"], int):
            print(f"         plan: {r['replicas']}")


if __name__ == "__main__":
    main()
