"""The coordinator at fleet scale: simulated nodes posting reports to a real coordinator.

A real ``edgeagent coordinator serve`` process; ``--catalog`` models with SLOs; N
simulated nodes, each on its own keep-alive connection (as the agent's reporter keeps
one), each posting a report of ``--models`` models every ``--interval`` seconds at a
random phase. The report body is the agent's (``agent.wire``: capacity, and per model
device, residency, size, arrivals, batches, batch profile, latency percentiles) and
is checked with ``agent.wire.parse_report`` before the run. Clients are ``--procs``
processes on uvloop, a ``SimulatedNode`` protocol per node (its request made once, raw
bytes on its kept connection, its TLS session resumed, backing off as the agent does:
``agent.backoff``); their CPU is printed beside the coordinator's so a client
bottleneck shows. Half-way through each run ``POST /v1/plan`` is timed while ingestion
goes on.

Figures per fleet size: nodes | tree | mode (plain, tls, full) | offered/s | ingested/s (200 answers per
second) | refused (503 or 429 with Retry-After) | bad (other errors, failed
connections) | late (sends the client could not make on time) | report p50 | p99
(send to last byte of the answer) | max | p99 of the reports sent while the plan was
being made | POST /v1/plan | coordinator CPU (its main process and report workers,
not the planning child) and that CPU per ingested report | the coordinator's own
figure for it (``/metrics``, over its last minute) | the planning child's CPU |
the clients' CPU and that per ingested report (all over the measured window: the box's
cores are shared by all three, so each side's share shows) | the 1-minute load average
before -> after (the box may be shared: a load above its cores starves the coordinator).

``--report-workers N`` runs the coordinator with that many report workers (its
``report_workers``); ``--tls`` serves it over TLS (a CA and a certificate made on the
fly; every node's connection verifies it, one handshake per node as the reporter's
kept connection; the warm-up is longer by a second per 100 nodes, for the handshakes);
``--modes plain,tls`` runs each fleet size both ways and prints TLS's p99 over plain's;
the nodes renew leases as the agent does (``agent.node.lease``: a full report every
``--full-report-s`` at a random phase, or when a node changes: ``--changing`` of them a
minute, each then sending the arrivals of the intervals since its last one), and mode
``full`` (``--modes full,plain``) has them send a full report every interval, as before
leases, and prints the coordinator's cores per 10,000 nodes both ways (``--no-leases``:
every mode so); each row says how many of its 200s were leases and how many were full
reports, and, on SQLite, how many answered ones the store does not hold after the stop;
``--baseline-tree DIR`` also runs the coordinator of another checkout, alternating,
under the same clients, and prints the ratios; ``--restart-at S`` restarts the
coordinator S s into the window (same port and store) and says when every node had a
200 again and how long a node went without one; ``--dashboard S`` keeps the dashboard
open (its requests every S s, or ten times as long as the last refresh took where that
is longer, as the page waits; each refresh timed); ``--timeline MS`` also prints each
second whose slowest report took over MS ms (stalls show their period: a plan, a
collection). Each row also gives the coordinator's own count of its CPU per report
(``/metrics``), and how many nodes are due in the busiest 100 ms, and the busiest
millisecond, of an interval at the window's start (each node keeps the random phase it
was given, however late an answer came: nodes bunched in one instant queue at a
coordinator idle on average). The client processes run without their garbage
collector, whose pauses (5,000 connections each) would show as report latency.
``--ramp S`` has the fleet join over S seconds instead of all in the first interval.
Each listening process keeps its share of the fleet's connections (its
``max_connections``), under the open-file limit, which the bench raises as far as the
fleet needs and its hard limit allows, for itself, the coordinator and the clients; a
fleet past that (about 16,000 nodes a process under a hard limit of 20,000) needs more
``--report-workers`` and ``--procs`` (a warning says so). Past 20,000 nodes each
client's nodes come from loopback addresses of their own, 20,000 nodes an address.

    .venv/bin/python bench/coordinator_scale.py --nodes 1000,5000,10000 --duration 30
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --report-workers 2
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --modes plain,tls --baseline-tree DIR
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --duration 80 --restart-at 10
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --modes full,plain
    .venv/bin/python bench/coordinator_scale.py --nodes 10000 --store postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing as mp
import os
import random
import re
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

from agent.backoff import backoff_cap, parse_retry_after, retry_delay  # noqa: E402
from agent.http.connections import open_files_limit  # noqa: E402
from agent.http.eventloop import run_event_loop  # noqa: E402
from agent.node.reporter import MAX_PENDING_POINTS  # noqa: E402
from agent.security.tls import ResumingContext  # noqa: E402
from agent.wire import parse_report  # noqa: E402
from bench.strangers import raise_own_nofile  # noqa: E402


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


def report_id(i: int) -> int:
    """Node ``i``'s report id (one for all its full reports: the coordinator only checks
    that a lease names the report it holds)."""
    return 1_000_000_007 * (i + 1) % 2**53


_ARRIVALS = re.compile(rb'"arrivals": \[\[[^\]]*\]\]')
#: A node's first message: a lease naming no report (does the coordinator take them?)
PROBE = b'{}'


def leasing_report(i: int, request: bytes, interval: float, points: int) -> bytes:
    """Node ``i``'s full report (``request``) as a node that renews leases sends it:
    its report id, each model's rate, and ``points`` arrival intervals per model
    instead of one (those since its last full report: every model's count repeated)."""
    head, _, body = request.partition(b"\r\n\r\n")

    def many(m: re.Match) -> bytes:
        count = json.loads(m.group()[12:])[0][2]
        return b'"rate": %.6f, "arrivals": ' % (count / interval) + json.dumps(
            [[round(k * interval + 0.002, 3), interval, count]
             for k in range(points)]).encode()
    body = _ARRIVALS.sub(many, body)[:-1] + b', "report_id": %d}' % report_id(i)
    head = re.sub(rb"Content-Length: \d+", b"Content-Length: %d" % len(body), head)
    return head + b"\r\n\r\n" + body


def lease_request(i: int, answer: int | None) -> bytes:
    """Node ``i``'s lease naming its report and the answer it holds (None: the probe,
    naming neither)."""
    body = PROBE if answer is None else b'{"report":%d,"answer":%d}' % (report_id(i), answer)
    return (f"POST /v1/nodes/node-{i}/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def answer_version(body: bytes) -> int | None:
    """The ``answer`` version in a coordinator's answer (None: it has none)."""
    at = body.rfind(b'"answer":')
    if at < 0:
        return None
    end = at + 9
    while end < len(body) and body[end:end + 1].isdigit():
        end += 1
    return int(body[at + 9:end])


# -- client processes ---------------------------------------------------------------------


def _header(head: bytes, name: bytes) -> bytes | None:
    """Header ``name`` (lower case, with its colon) in ``head`` (an answer's status line
    and headers, lower-cased): its value, or None."""
    at = head.find(b"\r\n" + name)
    if at < 0:
        return None
    end = head.find(b"\r\n", at + 2)
    return head[at + 2 + len(name):end if end > 0 else None].strip()


class SimulatedNode(asyncio.Protocol):
    """One node on a connection of its own, kept alive as the agent's reporter keeps
    one: its report's request made once (head and body, raw bytes), sent at its due
    time, its answer parsed from the raw bytes (status, ``Content-Length``,
    ``Retry-After``, the answer's version); no stream objects, no task per node. After a
    failure it backs off as the agent does (``agent.backoff``: full jitter,
    ``Retry-After`` obeyed); after a 200 its next report is due at the next time of its
    own phase (``next_slot``), however late the answer came. As the agent
    (``agent.node.lease``), where the answer to its full report carries a version it
    renews a lease each interval instead, and
    sends its full report again every ``full_report_s`` (at a random phase), when it
    changes (each interval with the probability that makes ``changing`` of the nodes
    change a minute), or when the coordinator asks; a coordinator without leases gets
    a full report every interval."""

    def __init__(self, sim: "Simulation", i: int, request: bytes, phase: float) -> None:
        self.sim, self.i, self.request, self.phase = sim, i, request, phase
        # (with a ramp, its first report whole intervals later: the fleet joins over it)
        self.due = sim.start + (phase + math.floor(
            sim.rng.uniform(0, sim.ramp) / sim.interval)) * sim.interval
        #: its lease's request: the probe first, then one naming the answer's version
        self.lease: bytes | None = lease_request(i, None) if sim.leases else None
        self.full_due = self.due + sim.rng.uniform(0, sim.full_report_s)
        self.leasing = False  # what is in flight is a lease
        self.batching = False  # it renews leases: its full reports carry their fields
        self.last_full = self.due  # when its last full report was answered (loop time)
        self.transport: Any = None
        self.connecting = self.waiting = False
        self.failures = 0
        self.buf = bytearray()
        self.sent_clock = self.sent_wall = 0.0
        self.in_window = False
        self.timer: Any = None
        self.oks: list[float] = []  # wall times of its 200s (--restart-at only)

    def next_slot(self, now: float) -> float:
        """Its next due time after ``now`` (and after its last one): its phase (a
        fraction of an interval, drawn once) plus whole intervals (lease intervals once
        it renews leases) from the simulation's start, as a fleet of nodes started at
        random times reports. A
        node whose answer came late (its handshake waited in the warm-up's herd,
        the coordinator asked for its full report) does not take the answer's time as
        its new phase: the nodes answered in one burst would report in one burst
        every interval after, and queue at a coordinator idle on average. The slots
        it missed count as late."""
        sim = self.sim
        step = sim.lease_interval if self.batching else sim.interval
        # (uvloop's clock counts whole milliseconds: an answer can come "before" its
        # due time; a due time on the grid may come out of the division a hair short)
        now = max(now, self.due)
        slot = sim.start + (self.phase + math.floor(
            (now - sim.start) / step - self.phase + 1e-6) + 1) * step
        missed = max(0, math.floor((slot - self.due) / step) - 1)
        if missed and self.in_window:
            sim.stats["late"] += missed
        return slot

    def fire(self) -> None:
        sim = self.sim
        now = sim.loop.time()
        self.in_window = sim.measure[0] <= self.due < sim.measure[1]
        if self.in_window:
            sim.stats["offered"] += 1
            if now - self.due > 0.05:
                sim.stats["late"] += 1
        self.waiting = True
        self.leasing = self.lease is not None and now < self.full_due \
            and sim.rng.random() >= sim.change_per_interval
        self.sent_clock, self.sent_wall = time.perf_counter(), time.time()
        self.timer = sim.loop.call_later(sim.answer_timeout_s, self.give_up)
        if self.transport is not None:
            self.transport.write(self.message())
        elif not self.connecting:
            self.connecting = True
            sim.loop.create_task(self.connect())

    async def connect(self) -> None:
        try:
            await self.sim.loop.create_connection(
                lambda: self, "127.0.0.1", self.sim.port, ssl=self.sim.tls,
                local_addr=(self.sim.source_for(self.i), 0) if self.sim.source else None)
        except (OSError, asyncio.TimeoutError):
            self.connecting = False
            self.finish(None)

    def connection_made(self, transport: Any) -> None:
        self.transport, self.connecting = transport, False
        sslobj = transport.get_extra_info("ssl_object")
        if sslobj is not None:
            self.sim.stats["handshakes"] += 1
            self.sim.stats["resumed"] += bool(sslobj.session_reused)
        if self.waiting:
            transport.write(self.message())

    def message(self) -> bytes:
        """What goes now: its lease, or its full report (once it renews leases, with
        the arrivals of the intervals since its last full report)."""
        if self.leasing:
            return self.lease
        if not self.batching:
            return self.request
        # the intervals since its last full report (the agent keeps at most 500)
        return leasing_report(self.i, self.request, self.sim.interval, max(1, min(
            MAX_PENDING_POINTS, round((self.sim.loop.time() - self.last_full)
                                      / self.sim.interval))))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).lower()
        length = int(_header(head, b"content-length:") or 0)
        if len(buf) < end + 4 + length:
            return
        body = bytes(buf[end + 4:end + 4 + length])
        del buf[:end + 4 + length]
        retry_after = _header(head, b"retry-after:")
        self.finish(int(head[9:12]), None if retry_after is None
                    else parse_retry_after(retry_after.decode("latin-1"), time.time()),
                    body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.buf.clear()
        if self.waiting:
            self.finish(None)

    def give_up(self) -> None:
        """No answer within ``answer_timeout_s``: the connection is dropped."""
        self.timer = None
        if self.transport is not None:
            self.transport.abort()  # connection_lost finishes it
        else:
            self.finish(None)

    def finish(self, status: int | None, retry_after: float | None = None,
               body: bytes = b"") -> None:
        """The answer (``status``; None: no answer, the connection failed; its
        ``body``) counted, and the next report scheduled."""
        if not self.waiting:
            return
        self.waiting = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        sim, now = self.sim, self.sim.loop.time()
        stats = sim.stats
        if status == 200:
            self.failures = 0
            if self.in_window:
                stats["ok"] += 1
                stats["leases" if self.leasing else "full"] += 1
                stats["latency"].append((self.sent_wall, time.perf_counter() - self.sent_clock,
                                         self.leasing))
            asked = self.leasing and body == b'{"report":true}\n'
            if sim.track_oks and not asked:
                self.oks.append(time.time())
            if not self.leasing:
                if self.i in sim.answered_full:  # (its first keeps its random phase)
                    self.full_due = now + sim.full_report_s
                self.last_full = now
                sim.answered_full[self.i] = self.sent_wall
            elif not asked:
                sim.answered_lease[self.i] = self.sent_wall
            if asked:  # the coordinator asks for the full report
                stats["asked"] += self.in_window
                self.lease, self.batching, self.due = None, True, now
            else:
                version = answer_version(body)
                if version is not None:
                    self.lease = lease_request(self.i, version)
                self.due = self.next_slot(now)
        elif self.leasing and status in (403, 404, 405):  # a coordinator without leases
            self.lease, self.batching, self.due = None, False, now
        else:
            self.failures += 1
            kind = "broken" if status is None else \
                "refused" if status in (429, 503) and retry_after is not None else \
                "bare_5xx" if status >= 500 else "other"
            if self.in_window or sim.track_oks:
                stats[kind] += 1
                if kind in ("bare_5xx", "other"):
                    stats["statuses"][status] = stats["statuses"].get(status, 0) + 1
            if sim.track_oks:
                stats["failed_at"].append((time.time(), kind))
            if status is None and self.transport is not None:
                self.transport.abort()
                self.transport = None
            self.due = now + retry_delay(self.failures, sim.interval, sim.max_backoff,
                                         retry_after, rng=sim.rng.random)
        if self.due < sim.measure[1]:
            sim.loop.call_at(self.due, self.fire)


#: nodes that share one source address (``Simulation.source_for``)
SOURCE_NODES = 20_000


class Simulation:
    """One client process's nodes and what they saw (``stats``)."""

    def __init__(self, loop: Any, port: int, tls: Any, interval: float,
                 measure: tuple[float, float], track_oks: bool, leases: bool = True,
                 full_report_s: float = 300.0, changing: float = 0.01,
                 source: int | None = None, lease_interval: float | None = None,
                 start: float = 0.0, ramp: float = 0.0) -> None:
        self.loop, self.port, self.tls, self.interval = loop, port, tls, interval
        self.ramp = ramp  # seconds over which the nodes send their first reports
        self.start = start  # (loop time) every node's phase counts from here
        self.measure, self.track_oks = measure, track_oks
        self.leases, self.full_report_s, self.source = leases, full_report_s, source
        #: a node changes (a full report instead of its lease) with this chance each
        #: interval: ``changing`` of the nodes change a minute
        self.lease_interval = lease_interval or interval
        self.change_per_interval = changing * self.lease_interval / 60.0
        #: node -> the send time of its last full report, and lease, answered 200
        self.answered_full: dict[int, float] = {}
        self.answered_lease: dict[int, float] = {}
        self.max_backoff = backoff_cap(interval)  # the reporter's
        self.answer_timeout_s = 30.0
        self.rng = random.Random(port)
        self.stats: dict[str, Any] = {
            "offered": 0, "ok": 0, "late": 0, "refused": 0, "bare_5xx": 0, "other": 0,
            "broken": 0, "statuses": {}, "handshakes": 0, "resumed": 0, "latency": [],
            "failed_at": [], "leases": 0, "full": 0, "asked": 0}

    def source_for(self, i: int) -> str:
        """Node ``i``'s source address (with ``source``): one loopback address per
        ``SOURCE_NODES`` nodes, so no address needs more of the ~28,000 ephemeral ports
        than it has (``source``, this process's own, is the address's second byte)."""
        return f"127.{self.source}.{i // SOURCE_NODES}.1"


def client(ids: list[int], port: int, models: int, catalog: int, interval: float,
           t0: float, warmup: float, duration: float, out: "mp.Queue",
           ca_file: str | None = None, track_oks: bool = False,
           fleet: dict | None = None) -> None:
    """One client process: its nodes' reports; puts its counts, latencies and CPU (and,
    with ``track_oks``, every node's 200s). ``fleet``: ``Simulation``'s lease settings
    (``leases``, ``full_report_s``, ``changing``, ``source``)."""
    requests = {}
    for i in ids:
        body = node_body(i, models, catalog, interval)
        requests[i] = (f"POST /v1/nodes/node-{i}/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}"
                       f"\r\n\r\n").encode() + body
    tls = tls_context(ca_file)

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        start = loop.time() + (t0 - time.time())
        measure = (start + warmup, start + warmup + duration)
        sim = Simulation(loop, port, tls, interval, measure, track_oks, start=start,
                         **(fleet or {}))
        for at, key in zip(measure, ("window_cpu0", "window_cpu1")):  # the steady state
            loop.call_at(at, lambda key=key: sim.stats.__setitem__(key, time.process_time()))
        nodes = [SimulatedNode(sim, i, requests[i], random.Random(i).random())
                 for i in ids]
        for node in nodes:
            loop.call_at(node.due, node.fire)
        sim.stats["phase_step"] = sim.lease_interval if sim.leases else interval
        loop.call_at(measure[0], lambda: sim.stats.__setitem__("phases", [
            (n.due - measure[0]) % sim.stats["phase_step"] for n in nodes]))
        await asyncio.sleep(max(0.0, measure[1] - loop.time()) + 1.0)
        for _ in range(100):  # the last answers (up to 10 s)
            if not any(n.waiting for n in nodes):
                break
            await asyncio.sleep(0.1)
        for node in nodes:
            if node.transport is not None:
                node.transport.close()
        if track_oks:
            sim.stats["oks"] = [n.oks for n in nodes]
        sim.stats["answered_full"] = sim.answered_full
        sim.stats["answered_lease"] = sim.answered_lease
        return sim.stats

    gc.freeze()  # this client's own collector pauses (5,000 connections' objects, over
    gc.disable()  # 100 ms each) would show as report latency: none for a short run
    cpu0 = time.process_time()
    stats = run_event_loop(main())
    stats["cpu_s"] = time.process_time() - cpu0
    stats["window_cpu_s"] = stats.get("window_cpu1", time.process_time()) \
        - stats.get("window_cpu0", cpu0)
    out.put(stats)


# -- the coordinator ----------------------------------------------------------------------


def tls_context(ca_file: str | None) -> Any:
    """A client context trusting ``ca_file`` (None: plain HTTP) that resumes sessions
    as the agent's reporter does (one per client process: a reconnecting node resumes
    the newest ticket its process holds, which the worker that issued it accepts)."""
    if ca_file is None:
        return None
    return ResumingContext.for_client(Path(ca_file))


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


#: Connections each listening process keeps at least (the coordinator's
#: ``max_connections``): under this box's usual open-file limit (20,000).
MAX_CONNECTIONS = 16_000
#: open files a process needs beyond its connections (the store, logs, pipes)
SPARE_FILES = 4_096


def listener_connections(nodes: int, report_workers: int) -> int:
    """``max_connections`` each listening process wants: its share of the fleet's kept
    connections with room for the kernel's uneven spread (SO_REUSEPORT hashes each
    connection to a listener) and reconnects, at least ``MAX_CONNECTIONS``."""
    return max(MAX_CONNECTIONS, nodes * 5 // (4 * max(1, report_workers)) + 1_000)


def start_coordinator(state: Path, store: str | None, reactive_s: float,
                      report_workers: int = 0, tls: dict | None = None,
                      ca_file: str | None = None, port: int = 0,
                      tree: Path = ROOT, poll_ms: float | None = None,
                      max_connections: int = MAX_CONNECTIONS
                      ) -> tuple[subprocess.Popen, str]:
    """The coordinator of ``tree`` (a checkout) on ``port`` (0: one the OS picks):
    (process, the URL it announced), ready; ``tls``: its ``tls:`` section, ``ca_file``
    what verifies it."""
    # every simulated node comes from one address (a few, past 20,000 nodes): the
    # per-peer bound (a quarter of the total, itself a quarter of the open-file
    # limit) would close their kept connections as fast as they open
    config = {"port": port, "state_dir": str(state), "log_level": "warning",
              "reactive_interval_s": reactive_s, "max_connections": max_connections,
              "max_connections_per_peer": max_connections}
    if tls:
        config["tls"] = tls
    if report_workers:  # (a tree before report workers refuses the key)
        config["report_workers"] = report_workers
    if poll_ms is not None:  # (a tree before it refuses the key)
        config["report_worker_poll_ms"] = poll_ms
    if store and store != "sqlite":
        config["store"] = store
    (state / "coordinator.yaml").write_text(json.dumps(config))
    proc = subprocess.Popen([sys.executable, "-c", "from agent.cli import main; main()",
                             "coordinator", "serve", "--config", str(state / "coordinator.yaml")],
                            cwd=tree, stdout=subprocess.PIPE, text=True)
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


def stop_coordinator(co: subprocess.Popen) -> None:
    """SIGTERM, as systemd stops it; killed after a minute."""
    co.send_signal(signal.SIGTERM)
    try:
        co.wait(60)
    except subprocess.TimeoutExpired:
        print("  (the coordinator did not stop within 60 s of SIGTERM; killed)")
        co.kill()
        co.wait()


def own_metrics(url: str, ca_file: str | None) -> dict[str, float]:
    """The coordinator's own cost figures from its ``/metrics`` (``agent.coordinator.
    cost``; empty for a tree without them): sample (with its labels) -> value."""
    try:
        req = urllib.request.Request(f"{url}/metrics")
        with urllib.request.urlopen(req, timeout=30, context=tls_context(ca_file)) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("edgeagent_coordinator_") and " " in line}


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
        for wall, x, _ in r["latency"]:
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


def run(nodes: int, args: argparse.Namespace, tls_on: bool, tree: Path,
        leasing: bool = True) -> dict:
    """One fleet size against the coordinator of ``tree``, over TLS or not."""
    restart = args.restart_at is not None
    with tempfile.TemporaryDirectory() as tmp:
        tls, ca_file = make_certificates(Path(tmp)) if tls_on else (None, None)
        poll_ms = args.poll_ms if tree == ROOT else None
        # the coordinator and the clients (forked) inherit it; a client holds its share
        wanted, per_client = listener_connections(nodes, args.report_workers), \
            -(-nodes // args.procs)
        raise_own_nofile(max(wanted, per_client) + SPARE_FILES)
        open_files = open_files_limit()
        connections = min(wanted, open_files - SPARE_FILES)  # (more: more listeners)
        if nodes > connections * max(1, args.report_workers) * 0.9 \
                or per_client > open_files - SPARE_FILES:
            print(f"warning: {nodes} kept connections need more --report-workers or "
                  f"--procs under an open-file limit of {open_files}", flush=True)
        co, url = start_coordinator(Path(tmp), args.store, args.reactive_interval,
                                    args.report_workers, tls, ca_file, tree=tree,
                                    poll_ms=poll_ms, max_connections=connections)
        port = int(url.rsplit(":", 1)[1])
        try:
            for m in range(args.catalog):
                request(f"{url}/v1/models/m{m}", "PUT", {"slo_ms": 200}, ca_file=ca_file)
            # everyone reported twice, connections open (with TLS, the whole fleet's
            # handshakes at once, as after a coordinator restart, settle first: the
            # window measures the steady state of kept connections)
            warmup = args.warmup if args.warmup is not None else \
                args.interval * 2 + (nodes / 100 if tls_on else 0.0)
            t0 = time.time() + 2.0
            out: mp.Queue = mp.get_context("fork").Queue()
            procs = [mp.get_context("fork").Process(
                target=client, args=(list(range(p, nodes, args.procs)), port, args.models,
                                     args.catalog, args.interval, t0, warmup,
                                     args.duration, out, ca_file, restart, {
                                         "leases": args.leases and leasing,
                                         "full_report_s": args.full_report_s,
                                         "changing": args.changing,
                                         "lease_interval": args.lease_interval,
                                         "ramp": args.ramp,
                                         # past ~28,000 connections to one port,
                                         # source addresses of their own
                                         "source": 2 + p if nodes > 20_000 else None}))
                for p in range(args.procs)]
            for p in procs:
                p.start()
            time.sleep(max(0.0, t0 + warmup - time.time()))
            co_cpu0, db_cpu0, wall0 = cpu_seconds(co.pid), database_cpu_seconds(), time.time()
            gauges0 = own_metrics(url, ca_file)
            refreshes: list[tuple[float, int]] = []
            if args.dashboard:
                threading.Thread(target=_dashboard, daemon=True, args=(
                    url, args.dashboard_paths.split(","), args.dashboard,
                    wall0 + args.duration, refreshes, ca_file)).start()
            timed: dict = {"span": [float("inf"), float("inf")], "plan_s": float("nan"),
                           "replicas": "not timed (--restart-at)"}
            spent = (0.0, 0.0)  # CPU of the coordinator before a restart
            if restart:
                time.sleep(args.restart_at)
                spent = tuple(b - a for a, b in zip(co_cpu0, cpu_seconds(co.pid)))
                co_cpu0 = (0.0, 0.0)
                stopped = time.time()
                stop_coordinator(co)
                started = time.time()
                co, _ = start_coordinator(Path(tmp), args.store, args.reactive_interval,
                                          args.report_workers, tls, ca_file, port, tree,
                                          poll_ms)
                timed["restart"] = (stopped, started, time.time())
            else:
                time.sleep(args.duration / 2)
                planning = threading.Thread(target=_time_plan, args=(url, timed, ca_file))
                planning.start()
            time.sleep(max(0.0, wall0 + args.duration - time.time()))
            co_cpu, planner_cpu = (b - a + c for a, b, c in
                                   zip(co_cpu0, cpu_seconds(co.pid), spent))
            db_cpu = database_cpu_seconds() - db_cpu0
            wall = time.time() - wall0
            gauges = own_metrics(url, ca_file)
            results = [out.get() for _ in procs]
            if not restart:
                planning.join()
            for p in procs:
                p.join()
        finally:
            stop_coordinator(co)
        lost = lost_answers(Path(tmp) / "coordinator.sqlite3", results) \
            if args.store == "sqlite" else None
    latency = sorted(x for r in results for _, x, _ in r["latency"])
    leases = sorted(x for r in results for _, x, lease in r["latency"] if lease)
    full = sorted(x for r in results for _, x, lease in r["latency"] if not lease)
    lo, hi = timed["span"]
    planning = sorted(x for r in results for t, x, _ in r["latency"] if lo <= t <= hi)

    def pct(q: float, values: list[float] = latency) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values \
            else float("nan")
    total = {k: sum(r[k] for r in results) for k in (
        "offered", "ok", "late", "refused", "bare_5xx", "other", "broken", "handshakes",
        "resumed", "leases", "full", "asked")}
    statuses: dict[int, int] = {}
    for r in results:
        for status, count in r["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    if args.timeline:
        print_timeline(results, wall0, (lo, hi), args.timeline)
    return {"nodes": nodes, "tls": tls_on, "tree": tree, "leasing": args.leases and leasing,
            "offered_s": total["offered"] / args.duration,
            "ingested_s": total["ok"] / args.duration, **total, "statuses": statuses,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "lease_p99_ms": pct(0.99, leases),
            "full_p99_ms": pct(0.99, full), "lost": lost,
            "max_ms": pct(1.0), "plan_s": timed["plan_s"], "replicas": timed["replicas"],
            "planning_p99_ms": pct(0.99, planning),
            "coordinator_cpu": co_cpu / wall, "database_cpu": db_cpu / wall,
            "cpu_ms_per_report": co_cpu * 1000 / max(1, total["ok"]),
            "client_cpu": sum(r["window_cpu_s"] for r in results) / args.duration,
            "planner_cpu": planner_cpu / wall,
            "client_ms_per_report": sum(r["window_cpu_s"] for r in results) * 1000
            / max(1, total["ok"]),
            "gauges": gauges, "parts": None if restart else own_split(gauges0, gauges),
            "refreshes": refreshes, "busiest": [busiest_share(
                [x for r in results for x in r.get("phases", [])],
                results[0]["phase_step"], s) for s in PHASE_SLICES_S],
            "restart": restart_figures(results, timed["restart"], wall0 + args.duration)
            if restart else None}


#: The slices of an interval whose busiest one the bench prints (``busiest_share``).
PHASE_SLICES_S = (0.1, 0.001)


def busiest_share(phases: list[float], interval: float, slice_s: float
                  ) -> tuple[int, float]:
    """(nodes due in the busiest ``slice_s`` of an interval, as many as a uniform
    spread of ``phases`` puts there on average): nodes bunched in one instant queue at
    the coordinator however idle it is on average; bunched within a millisecond, their
    messages reach it in one read of its event loop."""
    bins = max(1, round(interval / slice_s))
    counts = [0] * bins
    for phase in phases:
        counts[min(bins - 1, int(phase / interval * bins))] += 1
    return max(counts, default=0), len(phases) / bins


def lost_answers(database: Path, results: list[dict]) -> dict[str, int] | None:
    """After the coordinator stopped: the nodes whose last full report, or lease,
    answered 200 is not in its SQLite store (its row's ``reported``, or ``last_seen``,
    older than when it was sent); None for a store without a ``reported`` column."""
    import sqlite3

    with sqlite3.connect(database) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(nodes)")}
        if "reported" not in columns:
            return None
        stored = {int(name[5:]): (seen, reported) for name, seen, reported in
                  db.execute("SELECT name, last_seen, reported FROM nodes")}
    lost = {"reports": 0, "leases": 0}
    for r in results:
        for i, sent in r["answered_full"].items():
            lost["reports"] += i not in stored or stored[i][1] < sent
        for i, sent in r["answered_lease"].items():
            lost["leases"] += i not in stored or stored[i][0] < sent
    return lost


def own_split(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """CPU ms per report (or lease) answered over the window, by part, as the
    coordinator counts them in ``/metrics`` (None for a tree without them)."""
    answered = 'edgeagent_coordinator_reports_total{answer="answered"}'
    if answered not in before or answered not in after:
        return None
    leases = "edgeagent_coordinator_leases_total"
    reports = max(1.0, after[answered] - before[answered]
                  + after.get(leases, 0.0) - before.get(leases, 0.0))
    return {part: (after[key] - before[key]) * 1000 / reports for part in
            ("main", "report_workers", "planner")
            for key in [f'edgeagent_coordinator_cpu_seconds_total{{part="{part}"}}']}


def restart_figures(results: list[dict], restart: tuple[float, float, float],
                    end: float) -> dict:
    """After a restart (SIGTERM at ``restart[0]``, the old coordinator gone and the new
    one started at ``restart[1]``, answering at ``restart[2]``): the seconds until the
    last node had a 200 again, from each; the nodes never back before ``end``; the
    longest a node went without a 200 (the age its directives reached; past
    ``directive_ttl_s`` it reverts them); what the nodes saw each second from the
    SIGTERM on (200s, refusals, failed connections)."""
    stopped, started, up = restart
    seconds: dict[int, dict[str, int]] = {}
    for r in results:
        for oks in r["oks"]:
            for t in oks:
                if t >= stopped:
                    row = seconds.setdefault(int(t - stopped), {})
                    row["ok"] = row.get("ok", 0) + 1
        for t, kind in r["failed_at"]:
            if t >= stopped:
                row = seconds.setdefault(int(t - stopped), {})
                row[kind] = row.get(kind, 0) + 1
    back, never, longest, over_ttl = [], 0, 0.0, 0
    for r in results:
        for oks in r["oks"]:
            after = [t for t in oks if t >= stopped]
            if not after:
                never += 1
                longest = max(longest, end - (oks[-1] if oks else stopped))
                continue
            back.append(after[0])
            before = [t for t in oks if t < stopped]
            times = ([before[-1]] if before else []) + after + [end]
            gap = max(b - a for a, b in zip(times, times[1:]))
            longest = max(longest, gap)
            over_ttl += gap > DIRECTIVE_TTL_S
    return {"stop_s": started - stopped, "start_s": up - started, "seconds": seconds,
            "down_s": up - stopped, "all_back_s": max(back) - up if back else float("nan"),
            "all_back_from_stop_s": max(back) - stopped if back else float("nan"),
            "never_back": never, "longest_without_200_s": longest, "over_ttl": over_ttl}


#: The coordinator's default directive_ttl_s: a node without a 200 for longer reverts
#: its directives (it does not act on a plan older than that).
DIRECTIVE_TTL_S = 60.0


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
    parser.add_argument("--poll-ms", type=float, default=None,
                        help="this tree's coordinator.report_worker_poll_ms (default: its "
                             "own default; the baseline tree keeps its own)")
    parser.add_argument("--tls", action="store_true",
                        help="serve over TLS (certificates made on the fly): --modes tls")
    parser.add_argument("--modes", default=None,
                        help="plain, tls or plain,tls: each fleet size in each, one after "
                             "the other (default plain; the TLS p99 over the plain one is "
                             "printed at the end)")
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                        help="also run the coordinator of this checkout (git worktree add "
                             "DIR COMMIT), alternating with this one's, under the same "
                             "clients; the ratios are printed at the end")
    parser.add_argument("--restart-at", type=float, default=None, metavar="S",
                        help="restart the coordinator (SIGTERM, then start it again on the "
                             "same port and store) S s into the window, and say how long "
                             "until every node had a 200 again (give a --duration of S + "
                             "70 or more); no plan is timed")
    parser.add_argument("--timeline", type=float, default=None, metavar="MS",
                        help="also print each second whose slowest report took over MS ms")
    parser.add_argument("--dashboard", type=float, default=None, metavar="S",
                        help="also keep the dashboard open: its requests every S s (the "
                             "page's default is 2) or, as the page, ten times as long as the "
                             "last refresh took where that is longer; timed")
    parser.add_argument("--dashboard-paths", default=DASHBOARD_PATHS,
                        help=f"what one refresh asks for (default {DASHBOARD_PATHS})")
    parser.add_argument("--no-leases", dest="leases", action="store_false",
                        help="the simulated nodes send a full report every interval even "
                             "to a coordinator that takes leases (as before them)")
    parser.add_argument("--full-report-s", type=float, default=300.0,
                        help="with leases: a node's full report at least this often "
                             "(default 300, the agent's full_report_s)")
    parser.add_argument("--changing", type=float, default=0.01,
                        help="with leases: the share of nodes whose state changes a minute "
                             "(each sends a full report then; default 0.01)")
    parser.add_argument("--lease-interval", type=float, default=None,
                        help="with leases: seconds between a node's leases (default "
                             "--interval)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before the window (default two intervals, and a "
                             "second per 100 nodes with TLS)")
    parser.add_argument("--ramp", type=float, default=0.0, metavar="S",
                        help="the fleet joins over S seconds: each node's first report "
                             "a random number of whole intervals into them (default 0: "
                             "all in the first interval, as after a restart); keep "
                             "--warmup past it")
    parser.add_argument("--autogroup-nice", type=int, default=None,
                        help="run in a session of its own whose scheduler autogroup has "
                             "this nice value (Linux; negative needs root): with autogroups "
                             "on, CPU is shared between sessions first, so another "
                             "session's nice 19 job still takes a core's share from this "
                             "one; -10 gives the bench the priority their nice meant")
    args = parser.parse_args()
    modes = (args.modes or ("tls" if args.tls else "plain")).split(",")
    if not set(modes) <= {"plain", "tls", "full"}:
        parser.error(f"--modes: plain, tls, full (plain, full reports every interval: "
                     f"as before leases), not {args.modes!r}")
    trees = [ROOT] + ([args.baseline_tree.resolve()] if args.baseline_tree else [])
    autogroup = Path("/proc/self/autogroup")
    if args.autogroup_nice is not None:
        if os.getsid(0) != os.getpid():  # a session (and autogroup) of its own first
            os.execvp("setsid", ["setsid", "-w", sys.executable, *sys.argv])
        autogroup.write_text(str(args.autogroup_nice))
    groups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(f"store={args.store} interval={args.interval:g}s leases={args.leases} "
          f"lease_interval={args.lease_interval or args.interval:g}s ramp={args.ramp:g}s "
          f"full_report_s={args.full_report_s:g} changing={args.changing:g}/min "
          f"models/report={args.models} "
          f"catalog={args.catalog} client procs={args.procs} cpus={os.cpu_count()} "
          f"reactive_interval_s={args.reactive_interval:g} report_workers="
          f"{args.report_workers} report_worker_poll_ms="
          f"{'default' if args.poll_ms is None else format(args.poll_ms, 'g')} "
          f"modes={','.join(modes)} autogroups="
          f"{groups.read_text().strip() if groups.exists() else '-'} "
          f"({autogroup.read_text().strip() if autogroup.exists() else '-'})")
    if args.baseline_tree:
        print(f"trees: this = {ROOT}, baseline = {trees[1]}")
    print(f"{'nodes':>6} | {'tree':>8} | {'mode':>5} | {'offered/s':>9} | {'ingested/s':>10} | "
          f"{'refused':>7} | {'bad':>5} | {'late':>5} | {'p50 ms':>7} | {'p99 ms':>7} | "
          f"{'max ms':>7} | {'p99 planning':>12} | {'plan s':>6} | "
          f"{'coord CPU':>9} | {'ms/report':>9} | {'own ms/rep':>10} | {'planner CPU':>11} | "
          f"{'client CPU':>10} | {'client ms/report':>16} | load avg")
    rows = []
    for n in [int(x) for x in args.nodes.split(",")]:
        for mode in modes:
            for tree in trees:
                load0 = os.getloadavg()[0]
                r = run(n, args, mode == "tls", tree, leasing=mode != "full")
                rows.append(r)
                own = r["gauges"].get("edgeagent_coordinator_cpu_per_report_seconds")  # a minute
                print(f"{r['nodes']:>6} | {'this' if tree == ROOT else 'baseline':>8} | "
                      f"{mode:>5} | {r['offered_s']:>9.0f} | "
                      f"{r['ingested_s']:>10.0f} | {r['refused']:>7} | "
                      f"{r['bare_5xx'] + r['other'] + r['broken']:>5} | {r['late']:>5} | "
                      f"{r['p50_ms']:>7.1f} | {r['p99_ms']:>7.1f} | "
                      f"{r['max_ms']:>7.1f} | {r['planning_p99_ms']:>12.1f} | "
                      f"{r['plan_s']:>6.2f} | {r['coordinator_cpu']:>8.0%} | "
                      f"{r['cpu_ms_per_report']:>9.3f} | "
                      f"{'-' if own is None else format(own * 1000, '.3f'):>10} | "
                      f"{r['planner_cpu']:>10.0%} | "
                      f"{r['client_cpu']:>9.0%} | {r['client_ms_per_report']:>16.3f} | "
                      f"{load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
                print_details(r, args)
    print_ratios(rows, trees)


def print_details(r: dict, args: argparse.Namespace) -> None:
    """What a row's columns leave out: failures by kind, TLS resumption, a restart."""
    if r["bare_5xx"] or r["other"] or r["broken"]:
        print(f"         bad: {r['bare_5xx']} 5xx without Retry-After, {r['other']} other "
              f"errors (statuses {r['statuses']}), {r['broken']} connections failed or "
              "lost", flush=True)
    print(f"         {r['leases'] / args.duration:.0f} leases/s and {r['full'] / args.duration:.1f} "
          f"full reports/s answered ({r['asked']} asked for); p99 leases {r['lease_p99_ms']:.1f} ms, full reports "
          f"{r['full_p99_ms']:.1f} ms; answered but not in the store: "
          f"{'-' if r['lost'] is None else r['lost']}", flush=True)
    print("         due at the window's start, nodes in the busiest slice of the "
          "interval: " + ", ".join(
              f"{slice_s * 1000:g} ms {most} ({uniform:.1f} on average)"
              for slice_s, (most, uniform) in zip(PHASE_SLICES_S, r["busiest"])),
          flush=True)
    if r["tls"]:
        print(f"         TLS handshakes: {r['handshakes']}, {r['resumed']} of them resumed",
              flush=True)
    if r["parts"]:
        print("         its own /metrics over the window, CPU ms per report: " + ", ".join(
            f"{part} {ms:.3f}" for part, ms in r["parts"].items()), flush=True)
    if args.store != "sqlite":
        print(f"         PostgreSQL's server processes on this box: "
              f"{r['database_cpu']:.0%} of a core", flush=True)
    if r["refreshes"]:
        took = sorted(t for t, _ in r["refreshes"])
        print(f"         dashboard every {args.dashboard:g} s: {len(took)} refreshes of "
              f"{max(b for _, b in r['refreshes']) / 1e6:.1f} MB, each "
              f"{took[len(took) // 2]:.2f} s (median), {took[-1]:.2f} s (max)", flush=True)
    if r["restart"]:
        x = r["restart"]
        print(f"         restart: stopped {x['stop_s']:.1f} s after SIGTERM, started again "
              f"in {x['start_s']:.1f} s (answering /v1/health); from the SIGTERM, each 5 s: "
              + ", ".join(f"{t}-{t + 5} s: " + "/".join(
                  str(sum(x['seconds'].get(u, {}).get(k, 0) for u in range(t, t + 5)))
                  for k in ("ok", "refused", "broken"))
                  for t in range(0, 1 + max(x['seconds'], default=0), 5))
              + " (200s/refused/connections failed)", flush=True)
        print(f"         restart: answering again {x['down_s']:.1f} s after SIGTERM; every "
              f"node had a 200 again {x['all_back_s']:.1f} s after that "
              f"({x['all_back_from_stop_s']:.1f} s after SIGTERM), {x['never_back']} never; "
              f"the longest a node went without one {x['longest_without_200_s']:.1f} s "
              f"({x['over_ttl']} nodes past the {DIRECTIVE_TTL_S:g} s directive_ttl_s)",
              flush=True)
    elif not isinstance(r["replicas"], int):
        print(f"         plan: {r['replicas']}")


def print_ratios(rows: list[dict], trees: list[Path]) -> None:
    """TLS p99 over plain p99 per fleet size and tree; this tree's CPU per report over
    the baseline's."""
    def find(n: int, tls: bool, tree: Path, leasing: bool | None = None) -> dict | None:
        return next((r for r in rows if (r["nodes"], r["tls"], r["tree"]) == (n, tls, tree)
                     and (leasing is None or r["leasing"] == leasing)), None)

    for n in sorted({r["nodes"] for r in rows}):
        for tree in trees:
            plain, tls = find(n, False, tree, True), find(n, True, tree)
            full = find(n, False, tree, False)
            if plain and full and plain is not full:
                print(f"{n} nodes, {'this' if tree == ROOT else 'baseline'}: coordinator "
                      f"cores per 10,000 nodes: leases {plain['coordinator_cpu'] * 1e4 / n:.3f}, "
                      f"full reports {full['coordinator_cpu'] * 1e4 / n:.3f} (leases / full "
                      f"reports = {plain['coordinator_cpu'] / full['coordinator_cpu']:.2f}); "
                      f"p99 {plain['p99_ms']:.1f} ms vs {full['p99_ms']:.1f} ms")
            if plain and tls:
                print(f"{n} nodes, {'this' if tree == ROOT else 'baseline'}: TLS p99 / plain "
                      f"p99 = {tls['p99_ms'] / plain['p99_ms']:.2f}")
        if len(trees) > 1:
            for tls_on in (False, True):
                this, base = find(n, tls_on, trees[0]), find(n, tls_on, trees[1])
                if this and base:
                    print(f"{n} nodes, {'TLS' if tls_on else 'plain'}: this / baseline: "
                          f"coordinator CPU per report {this['cpu_ms_per_report'] / base['cpu_ms_per_report']:.2f}, "
                          f"p99 {this['p99_ms'] / base['p99_ms']:.2f}, client CPU per report "
                          f"{this['client_ms_per_report'] / base['client_ms_per_report']:.2f}")


if __name__ == "__main__":
    main()
