"""Serving under memory pressure (issue 10): a real agent, real HTTP, many models, a budget
that holds a few of them. Prints figures; not a test.

Each scenario starts ``edgeagent serve --config <tmp yaml> --port <free port>`` as a
subprocess (repository and data_dir in a temporary directory), waits for
``/v2/health/ready``, drives it with closed-loop clients over HTTP (aiohttp, loopback),
then reads ``GET /v1/cache`` and stops it. Clients never retry: every request is counted
once, as served (200) or failed (by status code, or by client-side error).

Scenarios (seeded; each stops by itself at its request count or time bound):

  sequential  one client, 8 synthetic models of 100 MB that load in 1.5 s, budget for 2,
              default SLO (1 s), 24 requests round robin
  zipf        8 clients, Zipf popularity over the same 8 models, SLO 30 s, 240 requests
  onnx        24 real ONNX MLPs of 8-24 MB (``agent.modelzoo.write_mlp``, seeded random
              weights), budget a quarter of their file bytes, 8 Zipf clients, 960 requests
  onnx-large  (--large) 40 ONNX MLPs of 20-60 MB, budget 25 %, 8 Zipf clients, 2,000 requests
  batching    32 closed-loop clients on one synthetic model (20 ms + 2 ms/row, SLO 200 ms),
              8 seconds

Per scenario: requests served / failed by status, loads the agent performed (sum of
``loads`` in ``/v1/cache``) vs the loads an LRU cache holding as many models as fit in the
budget by size would do over the same request order (the order in which the clients sent
them), p50/p99 latency of served requests, SLO violations, peak RSS of the agent (psutil,
every 50 ms, process and children) vs its idle RSS + budget (idle: after one warm-up
request for the first model and its eviction, so the agent's own base is in it), and
the most frequent error messages.

Peers (``.venv/bin/pip install -e '.[peers]'``): where ``ray[serve]`` is importable (by
this interpreter or ``--ray-python``), the ONNX scenarios also run against Ray Serve model
multiplexing (``@serve.multiplexed(max_num_models_per_replica=N)``, N = models that fit in
the budget, onnxruntime sessions, one replica, HTTP on loopback); where ``mlserver`` is
importable (or ``--mlserver-python``), against MLServer behind an LRU-by-count load/unload
wrapper (``bench/pressure_peers.py``). Same request sequence, same clients.

    .venv/bin/python bench/pressure.py                       # sequential zipf onnx batching
    .venv/bin/python bench/pressure.py --scenario onnx --json
    .venv/bin/python bench/pressure.py --large               # adds onnx-large
    .venv/bin/python bench/pressure.py --agent-src /tmp/old  # agent/ + cachepolicies/ from there
    .venv/bin/python bench/pressure.py --policy cremebrulee --policy cremebrulee-forecast
    .venv/bin/python bench/pressure.py --ray-python /tmp/peers-venv/bin/python \\
        --mlserver-python /tmp/mlserver-venv/bin/python --scenario onnx
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1_000_000
#: seconds a scenario's requests may still run after it stops sending new ones
HARD_STOP_GRACE = 30.0


# -- scenarios ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str                      # synthetic | onnx
    models: int
    clients: int
    requests: int | None = None    # None: run for `duration` seconds
    duration: float | None = None
    order: str = "zipf"            # zipf | round-robin
    slo_ms: float | None = None    # None: the agent's default (1000 ms)
    # synthetic
    size_bytes: int = 100 * MB
    load_ms: float = 1500
    base_ms: float = 5
    per_item_ms: float = 0
    budget_models: int = 2         # synthetic: the budget holds this many models
    # onnx
    min_mb: float = 8
    max_mb: float = 24
    budget_fraction: float = 0.25
    max_seconds: float = 150       # stop sending new requests after this long
    peers: bool = False            # also run against Ray Serve / MLServer


SCENARIOS = {
    "sequential": Scenario(
        "sequential", "one client, 8 synthetic models x 100 MB loading in 1.5 s, budget for 2, "
        "default SLO, 24 requests round robin",
        "synthetic", models=8, clients=1, requests=24, order="round-robin", max_seconds=90),
    "zipf": Scenario(
        "zipf", "8 clients, Zipf over 8 synthetic models x 100 MB loading in 1.5 s, budget "
        "for 2, SLO 30 s, 240 requests",
        "synthetic", models=8, clients=8, requests=240, slo_ms=30_000, max_seconds=150),
    "onnx": Scenario(
        "onnx", "24 ONNX MLPs of 8-24 MB, budget 25 % of their files, 8 Zipf clients, "
        "default SLO, 960 requests",
        "onnx", models=24, clients=8, requests=960, min_mb=8, max_mb=24, max_seconds=150,
        peers=True),
    "onnx-large": Scenario(
        "onnx-large", "40 ONNX MLPs of 20-60 MB, budget 25 % of their files, 8 Zipf clients, "
        "default SLO, 2,000 requests",
        "onnx", models=40, clients=8, requests=2000, min_mb=20, max_mb=60, max_seconds=300,
        peers=True),
    "batching": Scenario(
        "batching", "32 closed-loop clients on one synthetic model (20 ms + 2 ms/row), "
        "SLO 200 ms, 8 s",
        "synthetic", models=1, clients=32, duration=8.0, order="single", slo_ms=200,
        size_bytes=10 * MB, load_ms=0, base_ms=20, per_item_ms=2, budget_models=1,
        max_seconds=8.0),
}
DEFAULT = ["sequential", "zipf", "onnx", "batching"]


# -- model repositories ------------------------------------------------------------------

@dataclass
class Model:
    name: str
    inputs: int          # columns of X
    file_bytes: int      # what the budget is compared with
    path: Path | None = None  # the .onnx file (onnx models)


def mlp_hidden_for(target_bytes: float, inputs: int, outputs: int) -> int:
    """Hidden width of a 2-hidden-layer MLP whose float32 parameters take ~target bytes."""
    # 4 * (inputs*h + h + h*h + h + h*outputs + outputs) ~= target
    b = inputs + outputs + 2
    return max(8, int((-b + math.sqrt(b * b + target_bytes)) / 2))


def onnx_repository(work: Path, sc: Scenario, seed: int) -> tuple[Path, list[Model]]:
    """Seeded MLPs under ``work`` (reused when already written with the same spec)."""
    from agent.modelzoo import write_mlp

    rng = np.random.default_rng(seed)
    targets = rng.uniform(sc.min_mb * MB, sc.max_mb * MB, size=sc.models)
    repo = work / f"onnx-{sc.models}x{sc.min_mb:g}-{sc.max_mb:g}MB-seed{seed}"
    models = []
    for i, target in enumerate(targets):
        name = f"mlp{i:02d}"
        shape = dict(inputs=64, hidden=mlp_hidden_for(target, 64, 8), layers=2, outputs=8,
                     seed=seed * 1000 + i)
        path = repo / name / "1" / "model.onnx"
        marker = path.with_suffix(".json")
        if not (path.exists() and marker.exists()
                and json.loads(marker.read_text()) == shape):
            write_mlp(path, **shape)
            marker.write_text(json.dumps(shape))
        models.append(Model(name, 64, path.stat().st_size, path))
    return repo, models


def synthetic_repository(work: Path, sc: Scenario) -> tuple[Path, list[Model]]:
    import yaml

    repo = work / "models"
    models = []
    for i in range(sc.models):
        d = repo / f"m{i}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.yaml").write_text(yaml.safe_dump({
            "backend": "synthetic",
            "synthetic": {"base_ms": sc.base_ms, "per_item_ms": sc.per_item_ms,
                          "size_bytes": sc.size_bytes, "load_ms": sc.load_ms}}))
        models.append(Model(f"m{i}", 4, sc.size_bytes))
    return repo, models


def request_sequence(sc: Scenario, n_models: int, seed: int, zipf_s: float) -> list[int] | None:
    """Model index of each request, in sending order (None: duration-bound, model 0)."""
    if sc.requests is None:
        return None
    if sc.order == "round-robin":
        return [i % n_models for i in range(sc.requests)]
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_models + 1) ** zipf_s
    return rng.choice(n_models, size=sc.requests, p=weights / weights.sum()).tolist()


def lru_loads(order: list[str], capacity: int) -> int:
    """Misses of an LRU cache holding ``capacity`` models over ``order``."""
    cache: collections.OrderedDict[str, None] = collections.OrderedDict()
    misses = 0
    for key in order:
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += 1
        cache[key] = None
        if len(cache) > max(capacity, 1):
            cache.popitem(last=False)
    return misses


# -- processes ---------------------------------------------------------------------------

def free_port() -> int:
    """A loopback port free now, for a child that must be told its port before it starts
    and cannot report one it picked (the peers; a gRPC port, as ``--grpc-port 0`` turns
    gRPC off). Another process may bind it first: this project's servers bind port 0
    and announce their URL instead (``announced_url``). The benches' only copy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def announced_url(proc: subprocess.Popen, log: Path, offset: int = 0,
                  timeout: float = 120) -> str:
    """The URL that ``edgeagent serve`` or ``edgeagent coordinator serve`` (``proc``,
    its stdout in ``log`` from byte ``offset``) announced: "... listening on URL"."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(log, "rb") as f:
            f.seek(offset)
            for line in f.read().decode(errors="replace").splitlines():
                if "listening on " in line:
                    return line.split("listening on ")[1].split()[0]
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server exited with {proc.returncode} before it listened:\n"
                               f"{tail}")
        time.sleep(0.05)
    raise RuntimeError(f"no 'listening on' in {log} within {timeout:.0f} s")


class RssSampler:
    """Peak RSS of a process and its children, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.05):
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        import psutil

        total = 0
        try:
            procs = [self.proc] + self.proc.children(recursive=True)
        except psutil.Error:
            return 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self.samples += 1
            self._stop.wait(self.interval)

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path | None) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode} before ready:\n{tail}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen, grace: float = 15) -> None:
    import signal

    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def get_json(url: str, timeout: float = 10):
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def start_agent_process(work: Path, config: dict, log: Path, agent_src: str | None = None
                        ) -> tuple[subprocess.Popen, str]:
    """``edgeagent serve`` on ``config`` (written to ``work/agent.yaml``; without a
    ``port``, the OS picks one), its output appended to ``log``: (process, the base URL
    it announced). Not waited for beyond that announcement. ``agent_src``: run the
    agent of another tree (``agent_command``)."""
    import yaml

    (work / "agent.yaml").write_text(yaml.safe_dump({"port": 0, **config}))
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        proc = subprocess.Popen(agent_command(agent_src) + ["serve", "--config",
                                                            str(work / "agent.yaml")],
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, announced_url(proc, log, offset)


def agent_command(agent_src: str | None) -> list[str]:
    if agent_src is None:
        exe = ROOT / ".venv" / "bin" / "edgeagent"
        if exe.exists():
            return [str(exe)]
        return [sys.executable, "-c", "from agent.cli import main; main()"]
    # agent/ and cachepolicies/ from another tree (e.g. `git archive` of an older commit);
    # the editable install's import hook would otherwise win over sys.path
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in repr(f).lower()]; "
            f"sys.path.insert(0, {str(Path(agent_src).resolve())!r}); "
            "from agent.cli import main; main()")
    return [sys.executable, "-c", code]


# -- load generation ---------------------------------------------------------------------

@dataclass
class Result:
    seq: int              # sending order
    model: str
    status: int           # HTTP status, or 0 for a client-side error
    latency: float        # seconds
    error: str = ""
    retry_after: str | None = None  # the Retry-After header of a failure


def v2_body(model: Model) -> bytes:
    x = np.full((1, model.inputs), 0.5, np.float32)
    return json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, model.inputs],
                                   "data": x.ravel().tolist()}]}).encode()


async def drive(target, models: list[Model], sequence: list[int] | None, sc: Scenario,
                timeout: float) -> tuple[list[Result], int, float]:
    """Closed-loop clients: (results, requests not sent because of the time bound, wall s).

    ``target`` is ``(url_for(model), headers_for(model))``."""
    import aiohttp

    url_for, headers_for = target
    bodies = {m.name: v2_body(m) for m in models}
    results: list[Result] = []
    counter = iter(range(10**9))
    start = time.perf_counter()
    stop_at = start + (sc.duration if sc.duration is not None else sc.max_seconds)
    hard_stop = stop_at + HARD_STOP_GRACE  # no request outlives this
    total = len(sequence) if sequence is not None else None

    async def one(session, seq: int, model: Model) -> None:
        t = time.perf_counter()
        left = max(1.0, min(timeout, hard_stop - t))
        try:
            async with session.post(url_for(model), data=bodies[model.name],
                                    timeout=aiohttp.ClientTimeout(total=left),
                                    headers={"Content-Type": "application/json",
                                             **headers_for(model)}) as r:
                raw = await r.read()
                status = r.status
                retry_after = r.headers.get("Retry-After")
            err = ""
            if status != 200:
                try:
                    doc = json.loads(raw)
                    err = str(doc.get("error", doc) if isinstance(doc, dict) else doc)
                except ValueError:
                    err = raw[:300].decode(errors="replace")
            results.append(Result(seq, model.name, status, time.perf_counter() - t, err,
                                  retry_after if status != 200 else None))
        except Exception as exc:  # noqa: BLE001 — every request is counted
            results.append(Result(seq, model.name, 0, time.perf_counter() - t,
                                  f"{type(exc).__name__}: {exc}"[:300]))

    async def client(session) -> None:
        while True:
            if time.perf_counter() >= stop_at:
                return
            seq = next(counter)
            if total is not None and seq >= total:
                return
            model = models[sequence[seq]] if sequence is not None else models[0]
            await one(session, seq, model)

    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=conn, timeout=client_timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(sc.clients)))
    wall = time.perf_counter() - start
    sent = len(results)
    not_sent = (total - sent) if total is not None else 0
    return results, not_sent, wall


# -- figures -----------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values), q))


_NORMALISE = [(re.compile(r"\b(m\d+|mlp\d+)(:\d+)?\b"), "<model>"),
              (re.compile(r"\d+(\.\d+)?"), "N")]


def normalise(msg: str) -> str:
    for pat, rep in _NORMALISE:
        msg = pat.sub(rep, msg)
    return msg[:200]


def summarise(results: list[Result], not_sent: int, wall: float, slo_s: float,
              capacity: int) -> dict:
    results = sorted(results, key=lambda r: r.seq)
    served = [r for r in results if r.status == 200]
    failed = collections.Counter(str(r.status) if r.status else "client-error"
                                 for r in results if r.status != 200)
    lat = [r.latency for r in served]
    errors = collections.Counter((r.status, normalise(r.error)) for r in results
                                 if r.status != 200)
    examples = {}
    for r in results:
        if r.status != 200:
            examples.setdefault((r.status, normalise(r.error)), r.error[:300])
    order = [r.model for r in results]
    return {
        "sent": len(results), "not_sent": not_sent, "served": len(served),
        "failed": sum(failed.values()), "failed_by_status": dict(failed),
        "lru_capacity": capacity, "lru_loads": lru_loads(order, capacity),
        "p50_ms": None if not lat else pct(lat, 50) * 1000,
        "p99_ms": None if not lat else pct(lat, 99) * 1000,
        "max_ms": None if not lat else max(lat) * 1000,
        "slo_ms": slo_s * 1000,
        "slo_violations": sum(1 for x in lat if x > slo_s),
        "throughput_rps": len(served) / wall if wall > 0 else None,
        "wall_s": wall,
        "errors": [{"status": s, "count": n, "message": examples[(s, m)]}
                   for (s, m), n in errors.most_common(4)],
        "failed_with_retry_after": sum(1 for r in results
                                       if r.status != 200 and r.retry_after is not None),
    }


# -- one run against the agent -----------------------------------------------------------

def warm_up(base: str, model: Model) -> None:
    """One request for ``model``, then evict it: the agent's own base (its thread pools,
    the runtime's first run) is then in the idle RSS the budget is compared with, and no
    model is resident."""
    import urllib.request

    for path, data in ((f"/v2/models/{model.name}/infer", v2_body(model)),
                       (f"/v1/cache/{model.name}/evict", b"")):
        with urllib.request.urlopen(urllib.request.Request(
                base + path, data=data, method="POST"), timeout=60) as resp:
            resp.read()


def run_agent_scenario(sc: Scenario, args, work: Path, policy: str | None = None) -> dict:
    import yaml

    seed = args.seed
    run_dir = Path(tempfile.mkdtemp(prefix=f"{sc.name}-", dir=work))
    if sc.kind == "onnx":
        repo, models = onnx_repository(work, sc, seed)
        total = sum(m.file_bytes for m in models)
        budget = int(total * sc.budget_fraction)
    else:
        repo, models = synthetic_repository(run_dir, sc)
        budget = sc.size_bytes * sc.budget_models
    mean_size = sum(m.file_bytes for m in models) / len(models)
    capacity = max(1, int(budget // mean_size))
    sequence = request_sequence(sc, len(models), seed, args.zipf_s)
    slo_s = (sc.slo_ms or 1000.0) / 1000

    cfg = {"host": "127.0.0.1", "port": 0, "repository": str(repo),
           "data_dir": str(run_dir / "data"), "cpu_budget": budget, "restore": False,
           "infer_threads": 2, "log_level": "info", "drain_seconds": 5}
    if sc.slo_ms is not None:
        cfg["slo"] = {"latency_ms": sc.slo_ms}
    if policy is not None:
        cfg["policy"] = policy
    (run_dir / "agent.yaml").write_text(yaml.safe_dump(cfg))
    log = run_dir / "agent.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(agent_command(args.agent_src) + [
            "serve", "--config", str(run_dir / "agent.yaml")],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run_dir)
    base = announced_url(proc, log)
    info = {"scenario": sc.name, "title": sc.title,
            "system": "edgeagent" if policy is None else f"edgeagent/{policy}",
            "models": len(models), "model_bytes_total": sum(m.file_bytes for m in models),
            "budget_bytes": budget}
    try:
        wait_http(base + "/v2/health/ready", proc, 180, log)
        warm_up(base, models[0])
        time.sleep(0.5)
        sampler = RssSampler(proc.pid)
        baseline = sampler.rss()
        sampler.start()
        results, not_sent, wall = asyncio.run(drive(
            (lambda m: f"{base}/v2/models/{m.name}/infer", lambda m: {}),
            models, sequence, sc, args.request_timeout))
        time.sleep(0.2)
        peak = sampler.stop()
        info["agent_died"] = proc.poll() is not None
        cache = None
        try:
            cache = get_json(base + "/v1/cache")
        except Exception as exc:  # noqa: BLE001
            info["cache_error"] = repr(exc)
    finally:
        stop_process(proc)
    summary = summarise(results, not_sent, wall, slo_s, capacity)
    loads = None if cache is None else sum(e.get("loads", 0) or 0 for e in cache)
    cache = cache or []
    agent_violations = sum(e.get("slo_violations", 0) or 0 for e in cache)
    drops = collections.Counter()
    for e in cache:
        for k, v in (e.get("drops") or {}).items():
            drops[k] += v
    log_text = log.read_text(errors="replace")
    info.update(summary)
    info.update({
        "loads": loads, "evictions": sum(e.get("evictions", 0) or 0 for e in cache),
        "loads_vs_lru": loads / summary["lru_loads"]
        if loads is not None and summary["lru_loads"] else None,
        "agent_slo_violations": agent_violations, "agent_drops": dict(drops),
        "rss_baseline_bytes": baseline, "rss_peak_bytes": peak,
        "rss_over_baseline_bytes": peak - baseline,
        "rss_within_budget": peak <= baseline + budget,
        "agent_log_errors": sum(1 for line in log_text.splitlines()
                                if " ERROR " in line or "Traceback" in line),
        "agent_exit_code": proc.returncode, "agent_log": str(log),
    })
    if not (args.keep_logs or info["agent_log_errors"] or info["agent_died"]):
        shutil.rmtree(run_dir, ignore_errors=True)
        info["agent_log"] = None
    return info


# -- peers -------------------------------------------------------------------------------

def importable(python: str, module: str) -> bool:
    try:
        r = subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def run_peer_scenario(peer: str, python: str, sc: Scenario, args, work: Path) -> dict:
    repo, models = onnx_repository(work, sc, args.seed)
    total = sum(m.file_bytes for m in models)
    budget = int(total * sc.budget_fraction)
    capacity = max(1, int(budget // (total / len(models))))
    sequence = request_sequence(sc, len(models), args.seed, args.zipf_s)
    slo_s = (sc.slo_ms or 1000.0) / 1000
    run_dir = Path(tempfile.mkdtemp(prefix=f"{sc.name}-{peer}-", dir=work))
    port = free_port()
    log = run_dir / f"{peer}.log"
    cmd = [python, str(ROOT / "bench" / "pressure_peers.py"), peer, "--repo", str(repo),
           "--port", str(port), "--max-models", str(capacity), "--work", str(run_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    info = {"scenario": sc.name, "system": peer, "title": sc.title, "models": len(models),
            "model_bytes_total": total, "budget_bytes": budget, "max_models": capacity}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=run_dir, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/ready", proc, 300, log)
        time.sleep(0.5)
        sampler = RssSampler(proc.pid)
        baseline = sampler.rss()
        sampler.start()
        if peer == "ray":
            target = (lambda m: base + "/infer",
                      lambda m: {"serve_multiplexed_model_id": m.name})
        else:
            target = (lambda m: f"{base}/v2/models/{m.name}/infer", lambda m: {})
        results, not_sent, wall = asyncio.run(drive(target, models, sequence, sc,
                                                    args.request_timeout))
        peak = sampler.stop()
        try:
            stats = get_json(base + "/stats")
        except Exception as exc:  # noqa: BLE001
            stats = {"error": repr(exc)}
    finally:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    summary = summarise(results, not_sent, wall, slo_s, capacity)
    info.update(summary)
    loads = stats.get("loads") if isinstance(stats, dict) else None
    info.update({"loads": loads,
                 "loads_vs_lru": loads / summary["lru_loads"]
                 if loads is not None and summary["lru_loads"] else None,
                 "rss_baseline_bytes": baseline, "rss_peak_bytes": peak,
                 "rss_over_baseline_bytes": peak - baseline, "peer_stats": stats,
                 "peer_log": None if not args.keep_logs else str(log)})
    if not args.keep_logs:
        shutil.rmtree(run_dir, ignore_errors=True)
    return info


# -- printing ----------------------------------------------------------------------------

def fmt_ms(x) -> str:
    return "-" if x is None else f"{x:.0f} ms" if x >= 100 else f"{x:.1f} ms"


def print_result(r: dict) -> None:
    mb = lambda b: f"{b / MB:.0f} MB"  # noqa: E731
    print(f"== {r['scenario']} [{r['system']}]: {r.get('title', '')}")
    print(f"   models {r['models']} ({r['model_bytes_total'] / MB:.0f} MB of files), "
          f"budget {r['budget_bytes'] / MB:.0f} MB (LRU-by-count capacity "
          f"{r['lru_capacity']})")
    by = ", ".join(f"{k}: {v}" for k, v in sorted(r["failed_by_status"].items())) or "none"
    ns = f", {r['not_sent']} not sent (time bound)" if r["not_sent"] else ""
    print(f"   requests  {r['sent']} sent, {r['served']} served, {r['failed']} failed "
          f"({by}){ns} in {r['wall_s']:.1f} s ({r['throughput_rps']:.1f} served/s)")
    ratio = "-" if r.get("loads_vs_lru") is None else f"{r['loads_vs_lru']:.2f}"
    print(f"   loads     {r['system']} {r.get('loads', '-')}, LRU-by-count "
          f"{r['lru_loads']}, ratio {ratio}"
          + (f", evictions {r['evictions']}" if "evictions" in r else ""))
    agent_v = (f", agent counts {r['agent_slo_violations']}"
               if "agent_slo_violations" in r else "")
    print(f"   latency   p50 {fmt_ms(r['p50_ms'])}, p99 {fmt_ms(r['p99_ms'])}, "
          f"max {fmt_ms(r['max_ms'])} (served); SLO {r['slo_ms']:.0f} ms: "
          f"{r['slo_violations']} late{agent_v}")
    within = ""
    if "rss_within_budget" in r:
        within = ": within" if r["rss_within_budget"] else ": OVER"
    print(f"   RSS       idle {mb(r['rss_baseline_bytes'])}, peak {mb(r['rss_peak_bytes'])}, "
          f"+{mb(r['rss_over_baseline_bytes'])} vs budget {mb(r['budget_bytes'])}{within}")
    if r.get("agent_drops"):
        print(f"   drops     {r['agent_drops']} (agent's /v1/cache)")
    if r["failed"]:
        print(f"   retry     {r['failed_with_retry_after']} of {r['failed']} failures carried "
              "Retry-After (the client does not retry)")
    for e in r["errors"]:
        print(f"   error     {e['count']} x {e['status'] or 'client'}: {e['message']}")
    if r.get("agent_died"):
        print(f"   AGENT DIED during the run (exit {r['agent_exit_code']}), see {r['agent_log']}")
    if r.get("cache_error"):
        print(f"   /v1/cache unavailable: {r['cache_error']}")
    if r.get("agent_log_errors"):
        print(f"   log       {r['agent_log_errors']} ERROR/Traceback lines in {r['agent_log']}")


def print_peer_table(rows: list[dict]) -> None:
    if len(rows) < 2:
        return
    ref = next((r for r in rows if r["system"] == "edgeagent"), None)
    print(f"   -- side by side ({rows[0]['scenario']}):")
    print(f"   {'system':10} {'served':>7} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'loads':>6} {'/LRU':>5} {'p99/edge':>9} {'served/edge':>11}")
    for r in rows:
        p99r = (r["p99_ms"] / ref["p99_ms"]) if ref and ref["p99_ms"] and r["p99_ms"] else None
        sr = (r["served"] / ref["served"]) if ref and ref["served"] else None
        f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
        print(f"   {r['system']:10} {r['served']:7d} {r['failed']:7d} {f(r['p50_ms']):>8} "
              f"{f(r['p99_ms']):>8} {str(r.get('loads', '-')):>6} "
              f"{f(r.get('loads_vs_lru'), 2):>5} {f(p99r, 2):>9} {f(sr, 2):>11}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS),
                    help="repeatable; default: " + " ".join(DEFAULT))
    ap.add_argument("--large", action="store_true", help="add onnx-large")
    ap.add_argument("--json", action="store_true", help="print one JSON list instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    ap.add_argument("--request-timeout", type=float, default=120,
                    help="client-side total timeout per request, seconds")
    ap.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(),
                                                        "edgeagent-pressure"),
                    help="generated ONNX repositories are kept here and reused")
    ap.add_argument("--agent-src", help="a tree with agent/ and cachepolicies/ to run "
                    "instead of the installed one")
    ap.add_argument("--ray-python", default=os.environ.get("EDGEAGENT_RAY_PYTHON",
                                                           sys.executable))
    ap.add_argument("--mlserver-python", default=os.environ.get("EDGEAGENT_MLSERVER_PYTHON",
                                                                sys.executable))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep each run's directory (config, data_dir, server log) under "
                    "--work-dir; by default kept only when the agent logged errors or died")
    ap.add_argument("--system", action="append", choices=["edgeagent", "ray", "mlserver"],
                    help="repeatable; default: edgeagent and every importable peer")
    ap.add_argument("--policy", action="append",
                    help="the agent's eviction policy (its config's policy:), repeatable: "
                    "each scenario runs the agent once per policy, in turn [default: the "
                    "agent's default]")
    args = ap.parse_args()

    names = list(dict.fromkeys(args.scenario or DEFAULT))
    if args.large and "onnx-large" not in names:
        names.append("onnx-large")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    say = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print

    peers: list[tuple[str, str]] = []
    if not args.no_peers and any(SCENARIOS[n].peers for n in names):
        wanted = set(args.system or ["ray", "mlserver"])
        if "ray" in wanted and importable(args.ray_python, "ray.serve"):
            peers.append(("ray", args.ray_python))
        if "mlserver" in wanted and importable(args.mlserver_python, "mlserver"):
            peers.append(("mlserver", args.mlserver_python))
        missing = ({"ray", "mlserver"} & wanted) - {p for p, _ in peers}
        if missing:
            say(f"peers: {' and '.join(sorted(missing))} not importable; to compare, "
                f".venv/bin/pip install -e '.[peers]' (mlserver wants protobuf < 7: a "
                f"separate venv with '.[peers]' plus --ray-python/--mlserver-python "
                f"VENV/bin/python keeps .venv as it is)")

    out = []
    start = time.perf_counter()
    for name in names:
        sc = SCENARIOS[name]
        rows = []
        for policy in (args.policy or [None]) if (args.system is None
                                                  or "edgeagent" in args.system) else []:
            try:
                r = run_agent_scenario(sc, args, work, policy)
            except Exception as exc:  # noqa: BLE001
                say(f"== {name} [edgeagent]: FAILED TO RUN: {type(exc).__name__}: {exc}")
                out.append({"scenario": name, "system": "edgeagent", "policy": policy,
                            "error": repr(exc)})
            else:
                rows.append(r)
                out.append(r)
                if not args.json:
                    print_result(r)
                    sys.stdout.flush()
        if sc.peers:
            for peer, python in peers:
                try:
                    p = run_peer_scenario(peer, python, sc, args, work)
                except Exception as exc:  # noqa: BLE001
                    say(f"== {name} [{peer}]: FAILED TO RUN: {type(exc).__name__}: {exc}")
                    out.append({"scenario": name, "system": peer, "error": repr(exc)})
                    continue
                rows.append(p)
                out.append(p)
                if not args.json:
                    print_result(p)
            if not args.json:
                print_peer_table(rows)
        sys.stdout.flush()
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
