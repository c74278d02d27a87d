"""Fault injection under load (issue 13). Prints figures; not a test (the checks that
could fail are in tests/test_faults.py and tests/test_backend_tfserving.py).

Each scenario runs client threads against an agent on loopback (a closed loop, one
request after another, 5 s client timeout), injects one fault at t0, and prints what
the clients saw: answers by outcome, the outage (t0 to the end of the last failed
request), the recovery event (restart issued, model reloaded, server back, coordinator
back) and the time from it to the first success, and failures after that success.

1. ``kill9``: ``edgeagent serve`` (a real process, ONNX MLPs, 3 of them resident) killed
   with SIGKILL, restarted ``--restart-delay`` s later (as systemd's RestartSec would);
   the resident set restored from the state file; clients during the outage are refused.
2. ``onnx``: an agent in this process whose model's ONNX Runtime session raises ORT's
   RuntimeException on its next run (the double of tests/test_faults.py: ORT cannot be
   made to fail on demand with a valid model); 503 + Retry-After, the model reloaded.
3. ``tfserving``: an agent in this process with a TF Serving model; the model server it
   started (the real binary when on PATH, else the stand-in) killed with SIGKILL.
4. ``coordinator``: ``edgeagent coordinator serve`` (a real process) killed for
   ``--coordinator-down`` s and restarted while a real agent process reports to it every
   second: the agent's answers, its report attempts, its warnings, and the time to the
   first report after the coordinator is back.

    .venv/bin/python bench/faults.py
    .venv/bin/python bench/faults.py --only kill9 --coordinator-down 300
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pressure import (agent_command, announced_url, get_json,  # noqa: E402
                            start_agent_process, stop_process, wait_http)

BODY = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                               "data": [0.5, 1.0, 1.5, 2.0]}]}).encode()


def call(url: str, body: bytes, timeout: float = 5.0) -> str:
    """One request; its outcome: the HTTP status, or ``refused`` / ``timeout`` /
    ``reset`` / the exception's name."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return str(r.status)
    except urllib.error.HTTPError as err:
        err.read()
        return str(err.code)
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, ConnectionRefusedError):
            return "refused"
        if isinstance(reason, TimeoutError):
            return "timeout"
        return type(reason).__name__
    except TimeoutError:
        return "timeout"
    except ConnectionError as exc:
        return "reset" if isinstance(exc, ConnectionResetError) else type(exc).__name__


class Clients:
    """``n`` threads calling ``target()`` (a URL and body) in a closed loop; each call's
    (start, end, outcome) on ``perf_counter``."""

    def __init__(self, n: int, target, seed: int = 1) -> None:
        self.calls: list[tuple[float, float, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(target, seed + i),
                                          daemon=True) for i in range(n)]

    def _run(self, target, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            url, body = target(rng)
            start = time.perf_counter()
            outcome = call(url, body)
            end = time.perf_counter()
            with self._lock:
                self.calls.append((start, end, outcome))
            if outcome != "200":
                time.sleep(0.01)  # a client's pause before retrying

    def __enter__(self) -> "Clients":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def summary(name: str, clients: Clients, t0: float, recovered: float | None,
            recovery_event: str, extra: dict | None = None) -> dict:
    """The figures of one scenario (printed); ``t0`` the fault, ``recovered`` the
    recovery event's time (perf_counter)."""
    calls = sorted(clients.calls)
    after = [c for c in calls if c[1] >= t0]
    outcomes = collections.Counter(c[2] for c in after)
    failed = [c for c in after if c[2] != "200"]
    first_ok = next((c for c in after if c[2] == "200" and recovered is not None
                     and c[0] >= recovered), None)
    late = [c for c in failed if first_ok is not None and c[0] > first_ok[1]]
    doc = {"scenario": name, "requests_after_fault": len(after),
           "outcomes": dict(sorted(outcomes.items())),
           "failed": len(failed),
           "outage_s": round(max(c[1] for c in failed) - t0, 3) if failed else 0.0,
           "slowest_failure_s": round(max(c[1] - c[0] for c in failed), 3) if failed else None,
           "recovery_event": recovery_event,
           "recovery_after_fault_s": None if recovered is None else round(recovered - t0, 3),
           "first_success_after_recovery_s": None if first_ok is None
           else round(first_ok[1] - recovered, 3),
           "failed_after_that_success": len(late), **(extra or {})}
    print(f"\n== {name}")
    print(f"  requests after the fault: {len(after)}  outcomes: {doc['outcomes']}")
    print(f"  failed: {len(failed)} (slowest failure {doc['slowest_failure_s']} s)  "
          f"outage (fault -> end of the last failure): {doc['outage_s']} s")
    print(f"  {recovery_event}: +{doc['recovery_after_fault_s']} s after the fault; "
          f"first success {doc['first_success_after_recovery_s']} s after it; "
          f"failures after that success: {len(late)}")
    for key, value in (extra or {}).items():
        print(f"  {key}: {value}")
    return doc


def write_repo(repo: Path, names: list[str]) -> None:
    from agent.modelzoo import write_mlp

    for i, name in enumerate(names):
        write_mlp(repo / name / "1" / "model.onnx", inputs=4, hidden=16, layers=1,
                  outputs=2, seed=i)


# -- 1. kill -9 -------------------------------------------------------------------------


def kill9(work: Path, args) -> dict:
    names = [f"mlp{i}" for i in range(6)]
    repo = work / "models"
    write_repo(repo, names)
    config = {"repository": str(repo), "data_dir": str(work / "data"),
              "grpc_port": 0, "cpu_budget": "256MiB", "log_level": "info"}
    log = work / "kill9.log"
    proc, base = start_agent_process(work, config, log)
    config["port"] = int(base.rsplit(":", 1)[1])  # the restart takes the same port
    wait_http(base + "/v2/health/ready", proc, 120, log)
    hot = names[:3]
    for name in hot:
        call(f"{base}/v2/models/{name}/infer", BODY)
    state = work / "data" / "resident.json"
    end = time.monotonic() + 10
    while time.monotonic() < end and not (state.exists() and len(
            json.loads(state.read_text())["resident"]) == len(hot)):
        time.sleep(0.05)
    with Clients(args.clients, lambda rng: (f"{base}/v2/models/{rng.choice(hot)}/infer",
                                            BODY)) as clients:
        time.sleep(args.warm)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(args.restart_delay)
        restarted = time.perf_counter()
        proc, _ = start_agent_process(work, config, log)
        wait_http(base + "/v2/health/ready", proc, 120, log)
        ready = time.perf_counter()
        time.sleep(args.after)
    try:
        states = {m["name"]: m["state"] for m in get_json(base + "/v1/cache")}
        restored = sorted(n for n in hot if states.get(n) == "ready")
    finally:
        stop_process(proc)
    return summary("kill -9 of the agent, restarted", clients, t0, restarted,
                   "restart issued", {
                       "restart_delay_s": args.restart_delay,
                       "restart -> /v2/health/ready 200 (resident set loaded)":
                           f"{ready - restarted:.3f} s",
                       "resident set restored": f"{len(restored)}/{len(hot)} {restored}"})


# -- 2. ONNX Runtime fails mid-run ------------------------------------------------------


def onnx_crash(work: Path, args) -> dict:
    from agent.config import AgentConfig
    from tests.helpers import AgentServer, FaultyFactory

    repo = work / "onnx-models"
    write_repo(repo, ["m", "other"])
    factory = FaultyFactory("m")
    reloaded: list[float] = []

    agent = AgentServer(AgentConfig(repository=repo, data_dir=work / "onnx-data",
                                    cpu_budget=256 * 2**20, infer_threads=2),
                        budgets={"cpu": 256 * 2**20}, backend_factory=factory)
    try:
        call(f"{agent.url}/v2/models/m/infer", BODY)
        loads = factory.loads
        with Clients(args.clients, lambda rng: (f"{agent.url}/v2/models/m/infer", BODY)
                     ) as clients:
            time.sleep(args.warm)
            t0 = time.perf_counter()
            factory.faults["left"] = 1
            end = time.monotonic() + 30
            while factory.loads == loads and time.monotonic() < end:
                time.sleep(0.001)
            reloaded.append(time.perf_counter())
            time.sleep(args.after)
        other = call(f"{agent.url}/v2/models/other/infer", BODY)
    finally:
        agent.close()
    return summary("ONNX Runtime session fails mid-run (one run)", clients, t0,
                   reloaded[0] if factory.loads > loads else None, "model reloaded",
                   {"loads of m": factory.loads, "another model meanwhile": other})


# -- 3. TF Serving's model server killed ------------------------------------------------


def tfserving_crash(work: Path, args) -> dict:
    import shutil

    from agent.config import AgentConfig, TfServingSettings
    from tests.helpers import AgentServer

    standin = ROOT / "tests" / "tfserving_standin"
    binary = (os.environ.get("EDGEAGENT_TFSERVING_BINARY")
              or shutil.which("tensorflow_model_server")
              or f"{shlex.quote(sys.executable)} {shlex.quote(str(standin / 'server.py'))}")
    out = work / "savedmodels"
    done = subprocess.run([sys.executable, str(standin / "savedmodels.py"), str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    paths = {k: Path(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    repo = work / "tf-models"
    shutil.copytree(paths["repo"] / "mlp", repo / "tfmlp")
    write_repo(repo, ["onnxmlp"])
    settings = TfServingSettings(binary=binary, start_timeout_seconds=120,
                                 load_timeout_seconds=60, restart_backoff_seconds=0.2,
                                 restart_backoff_max_seconds=2)
    agent = AgentServer(AgentConfig(repository=repo, data_dir=work / "tf-data",
                                    cpu_budget=2**30, infer_threads=2, tfserving=settings),
                        budgets={"cpu": 2**30})
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "data": [0.5, 1.0, 1.5, 2.0]}]}).encode()
    try:
        if call(f"{agent.url}/v2/models/tfmlp/infer", body, timeout=120) != "200":
            raise RuntimeError("the TF model does not serve")
        host = agent.node.tfserving
        old = host.pid()
        with Clients(args.clients, lambda rng: (f"{agent.url}/v2/models/tfmlp/infer", body)
                     ) as clients:
            time.sleep(args.warm)
            t0 = time.perf_counter()
            os.kill(old, signal.SIGKILL)
            end = time.monotonic() + 120
            back = None
            while time.monotonic() < end:
                pid = host.pid()
                if pid not in (None, old) and host.server._state == "up":
                    back = time.perf_counter()
                    break
                time.sleep(0.005)
            time.sleep(args.after)
        onnx = call(f"{agent.url}/v2/models/onnxmlp/infer", BODY)
        restarts = host.server.restarts
    finally:
        agent.close()
    return summary("TF Serving's model server killed (SIGKILL)", clients, t0, back,
                   "server restarted and its models reloaded",
                   {"server": "tensorflow_model_server" if "server.py" not in binary
                    else "the stand-in (tests/tfserving_standin)",
                    "server restarts": restarts, "an ONNX model afterwards": onnx})


# -- 4. the coordinator down ------------------------------------------------------------


def coordinator_down(work: Path, args) -> dict:
    clog = work / "coordinator.log"

    def start_coordinator(port: int) -> tuple[subprocess.Popen, str]:
        """The coordinator on ``port`` (0: the OS picks): (process, its URL)."""
        offset = clog.stat().st_size if clog.exists() else 0
        with open(clog, "a") as out:
            proc = subprocess.Popen(agent_command(None) + [
                "coordinator", "serve", "--port", str(port), "--state-dir",
                str(work / "coordinator")], stdout=out, stderr=subprocess.STDOUT)
        url = announced_url(proc, clog, offset, 60)
        wait_http(url + "/v1/health", proc, 60, clog)
        return proc, url

    (work / "coordinator").mkdir()
    coordinator, curl = start_coordinator(0)  # restarted on the same port below
    repo = work / "co-models"
    write_repo(repo, ["a", "b"])
    config = {"repository": str(repo), "data_dir": str(work / "co-data"),
              "grpc_port": 0, "cpu_budget": "256MiB", "log_level": "info",
              "coordinator": {"url": curl, "node_name": "n1", "report_interval_s": 1.0}}
    log = work / "co-agent.log"
    proc, base = start_agent_process(work, config, log)
    try:
        wait_http(base + "/v2/health/ready", proc, 120, log)
        end = time.monotonic() + 20
        while get_json(base + "/v1/coordinator")["reports"] < 1 and time.monotonic() < end:
            time.sleep(0.05)
        with Clients(args.clients, lambda rng: (
                f"{base}/v2/models/{rng.choice('ab')}/infer", BODY)) as clients:
            time.sleep(args.warm)
            t0 = time.perf_counter()
            coordinator.send_signal(signal.SIGKILL)
            coordinator.wait(10)
            time.sleep(args.coordinator_down)
            before = get_json(base + "/v1/coordinator")
            back_at = time.perf_counter()
            coordinator, _ = start_coordinator(int(curl.rsplit(":", 1)[1]))
            end = time.monotonic() + 120
            while time.monotonic() < end:
                status = get_json(base + "/v1/coordinator")
                if status["reports"] > before["reports"]:
                    break
                time.sleep(0.02)
            reported = time.perf_counter()
            time.sleep(args.after)
        nodes = [n.get("node", n.get("name")) for n in get_json(curl + "/v1/nodes")]
    finally:
        stop_process(proc)
        stop_process(coordinator)
    text = log.read_text()
    warnings = sum("report to" in line and "WARNING" in line for line in text.splitlines())
    doc = summary(f"coordinator killed for {args.coordinator_down:g} s, restarted", clients,
                  t0, t0, "(the agent needs no recovery)", {
                      "report attempts that failed while it was down": before["failures"],
                      "agent warnings about reporting": warnings,
                      "coordinator restart -> first report received":
                          f"{reported - back_at:.3f} s",
                      "nodes the coordinator knows afterwards": nodes})
    return doc


SCENARIOS = {"kill9": kill9, "onnx": onnx_crash, "tfserving": tfserving_crash,
             "coordinator": coordinator_down}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=list(SCENARIOS), action="append")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warm", type=float, default=1.0, help="load before the fault (s)")
    ap.add_argument("--after", type=float, default=3.0, help="load after recovery (s)")
    ap.add_argument("--restart-delay", type=float, default=1.0)
    ap.add_argument("--coordinator-down", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    docs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(SCENARIOS):
            work = Path(tmp) / name
            work.mkdir()
            docs.append(SCENARIOS[name](work, args))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps(docs, indent=1))


if __name__ == "__main__":
    main()
