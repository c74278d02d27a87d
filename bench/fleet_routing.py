"""The fleet as one cache (issue 34): three agents and a coordinator on loopback, 12
real ONNX models of different sizes and load times, each agent's budget about a third
of the models' total, Zipf clients spread round-robin over the nodes (as an ordinary
load balancer would). Prints, in one run:

* routing on against ``routing.enabled: false`` on the same workload (fresh fleets,
  alternating): the fleet's loads after the plan, failures, mean response; with
  routing, how each model's requests split over its nodes against the plan's weights,
  and the simulated fleet's loads against the live, per node and phase (warm-up, the
  plan's prefetches, measured): ``cachepolicies.fleet`` replays each node's cache
  through the agent's twin, the warm-up as it reached the node, then the plan's pins
  and prefetches as the node applied them, then the measured trace spread round robin
  and routed by the plan;
* ``kill -9`` of one agent mid-run: requests failed among those sent to the others,
  and how long until a plan moves its models;
* a hop's cost: a tiny model's p50 through another node against on its own node
  (kept-alive, plain HTTP, then mTLS between nodes).

    .venv/bin/python bench/fleet_routing.py [--requests 900] [--rounds 1] [--skip-kill]
        [--skip-hop] [--hop-requests 2000] [--save-runs DIR]

Targets (issue 34): loads with routing <= 0.4x without, mean response lower, 0 failed;
each model's split within 10 % of the plan's weights; 0 failed across the kill and its
models moved within node_timeout_s plus one planning interval; a hop <= 1 ms at p50
(plain), <= 1.5 ms (mTLS); simulated loads within 10 % of live.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.modelzoo import write_mlp  # noqa: E402
from tests.helpers import (Agent, CoordinatorProcess, issue_cert, make_ca,  # noqa: E402
                           request, wait_for)

#: (hidden width, hidden layers) of each model: files from 0.3 MB to 22 MB
SHAPES = [(256, 2), (384, 3), (512, 3), (640, 3), (768, 3), (896, 3), (1024, 3),
          (1152, 3), (1280, 3), (1408, 3), (1536, 3), (1664, 3)]
NODES = ("edge-0", "edge-1", "edge-2")
NODE_TIMEOUT_S = 5.0
PLAN_INTERVAL_S = 60.0
REPORT_INTERVAL_S = 0.5  # each answer to a report repeats the plan's directives
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                    "data": [0.5, -1.0, 2.0, 0.25]}]}


def write_repository(repo: Path) -> list[str]:
    names = []
    for i, (hidden, layers) in enumerate(SHAPES):
        name = f"m{i:02d}"
        write_mlp(repo / name / "1" / "model.onnx", inputs=4, hidden=hidden, layers=layers,
                  outputs=4, seed=i)
        (repo / name / "config.yaml").write_text(yaml.safe_dump(
            {"backend": "onnx", "max_batch_size": 0, "slo": {"latency_ms": 500}}))
        names.append(name)
    return names


def zipf_trace(names: list[str], requests: int, rate: float, seed: int
               ) -> list[tuple[float, str, int]]:
    """(at seconds, model, node index): Zipf (s = 0.9) popularity in a fixed seeded
    order, Poisson arrivals, request i to node i mod 3."""
    order = np.random.default_rng(0).permutation(len(names))
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(names) + 1) ** 0.9
    picks = order[rng.choice(len(names), requests, p=weights / weights.sum())]
    times = np.cumsum(rng.exponential(1 / rate, requests))
    return [(float(t - times[0]), names[m], i % len(NODES))
            for i, (t, m) in enumerate(zip(times, picks))]


async def replay(urls, trace, *, skip=lambda at: set()) -> list[dict]:
    """Send ``trace`` open loop (a node in ``skip(at)`` is left out, its request sent to
    the next one, as a load balancer's health check would); one dict per request."""
    import aiohttp

    results = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        start = time.perf_counter()

        async def one(at, model, node):
            await asyncio.sleep(max(at - (time.perf_counter() - start), 0))
            down = skip(time.perf_counter() - start)
            while node in down:
                node = (node + 1) % len(urls)
            sent = time.perf_counter()
            row = {"model": model, "node": node, "status": 0, "served_by": None}
            try:
                async with session.post(f"{urls[node]}/v2/models/{model}/infer",
                                        json=BODY) as r:
                    await r.read()
                    row.update(status=r.status, served_by=r.headers.get("edgeagent-served-by"))
            except aiohttp.ClientError as exc:
                row["error"] = type(exc).__name__
            row["seconds"] = time.perf_counter() - sent
            row["at"] = sent - start
            results.append(row)

        await asyncio.gather(*(one(*item) for item in trace))
    return results


class Fleet:
    """A coordinator and three agents (processes) on loopback."""

    def __init__(self, work: Path, repo: Path, names: list[str], budget: int, *,
                 routing: bool, extra: dict | None = None) -> None:
        self.co = CoordinatorProcess(None, work / "coordinator", reactive_interval_s=3600,
                                     plan_interval_s=PLAN_INTERVAL_S, rate_step_s=1,
                                     plan_window_s=10, history_s=120,
                                     node_timeout_s=NODE_TIMEOUT_S)
        self.agents: dict[str, Agent] = {}
        for n in names:
            request(f"{self.co.url}/v1/models/{n}", "PUT",
                    {"slo_ms": 500, "cpu_per_replica": 0.25})
        for name in NODES:
            cfg = work / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump({
                "infer_threads": 2, "routing": {"enabled": routing, **(extra or {})},
                "coordinator": {"url": self.co.url,
                                "report_interval_s": REPORT_INTERVAL_S,
                                "node_name": name, "cores": 4}}))
            self.agents[name] = Agent(repo, work / name, "--config", str(cfg),
                                      "--cpu-budget", str(budget))
        self.urls = [self.agents[n].url for n in NODES]

    def caches(self) -> dict[str, list[dict]]:
        """Each live node's ``GET /v1/cache`` (its loads so far, prefetches included)."""
        return {name: a.get("/v1/cache") for name, a in self.agents.items()
                if a.proc.poll() is None}

    def plan(self) -> dict:
        status, plan = request(f"{self.co.url}/v1/plan", "POST", timeout=120)[:2]
        assert status == 200, plan

        def applied():
            for agent in self.agents.values():
                link = agent.get("/v1/coordinator")
                if not link["directives"] or link["directives"]["plan_id"] != plan["id"] \
                        or link["prefetching"]:
                    return False
                routing = agent.get("/v1/routing")
                if routing["enabled"] and not routing["trusted"]:
                    return False
            return True
        wait_for(applied, 120, "every node follows the plan")
        return plan

    def directives(self) -> dict[str, dict]:
        """What each node applied of the plan: the models it pinned for the coordinator
        and those its directives had it load (``pin``, then ``prefetch``)."""
        out = {}
        for name, agent in self.agents.items():
            link = agent.get("/v1/coordinator")
            orders = link["directives"]
            out[name] = {"pinned": link["pinned_by_coordinator"],
                         "prefetch": list(dict.fromkeys([*orders["pin"],
                                                         *orders["prefetch"]])),
                         "reports": link["reports"]}
        return out

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.proc.poll() is None:
                agent.stop()
        self.co.stop()


def split_error(results: list[dict], plan: dict) -> tuple[float, dict]:
    """The largest relative gap between a model's share of requests on a node and the
    plan's weight for it (models with 30+ requests), and the splits seen."""
    worst, seen = 0.0, {}
    for model, row in plan["models"].items():
        weights = row["placement"]
        mine = [r["served_by"] for r in results if r["model"] == model and r["status"] == 200]
        if len(mine) < 30 or not weights:
            continue
        total = sum(weights.values())
        seen[model] = {n: mine.count(n) for n in sorted(set(mine))}
        for node, weight in weights.items():
            planned = weight / total
            worst = max(worst, abs(mine.count(node) / len(mine) - planned) / planned)
    return worst, seen


PHASES = ("warmup", "plan", "measured")


def live_phases(marks: list[dict[str, list[dict]]]) -> dict[str, dict[str, int]]:
    """Each node's loads per phase from its caches at the phases' bounds."""
    def loads(k, node):
        return sum(m["loads"] for m in marks[k][node])
    return {node: {phase: loads(k + 1, node) - loads(k, node)
                   for k, phase in enumerate(PHASES)} for node in marks[0]}


def simulated_loads(fleet: Fleet, warmup, measured, plan: dict, budget: int,
                    routing: bool, bounds: tuple[float, float], applied: dict[str, dict],
                    wall_start: float, save: Path | None = None, marks: list | None = None
                    ) -> tuple[dict[str, dict[str, int]], ...]:
    """Each node's loads per phase as ``cachepolicies.fleet`` replays the run, three
    times: the warm-up as each node's record says its requests reached it
    (``wall_start``: the wall clock at the warm-up's start), then as the trace sent it
    (spread round robin), no plan yet either way; then all of the run as the records
    say each node served it. At ``bounds[0]`` (seconds from the warm-up's start, when
    the plan was asked for) the directives as each node applied them (``applied``: its
    pins, its prefetches), renewed as often as it reported (``renewal_s``); from
    ``bounds[1]`` the measured trace spread round robin and routed by the plan (when
    routing), in the first two. Each node's cache is the twin (its budget, the agent's
    policy, the settings it recorded) on the profiles it measured (a model it never
    loaded: another node's). ``save``: a file to keep what it read of the run in
    (JSON), with ``marks`` (the nodes' caches at the phases' bounds)."""
    import csv
    import io
    import urllib.request

    def text(url: str) -> str:
        with urllib.request.urlopen(url) as answer:
            return answer.read().decode()

    rows = {node: list(csv.DictReader(io.StringIO(text(f"{agent.url}/v1/profiles"))))
            for node, agent in fleet.agents.items()}
    records = {n: text(f"{a.url}/v1/trace") for n, a in fleet.agents.items()}
    if save is not None:
        save.write_text(json.dumps({"warmup": warmup, "measured": measured, "plan": plan,
                                    "budget": budget, "routing": routing,
                                    "bounds": bounds, "applied": applied,
                                    "profiles": rows, "marks": marks,
                                    "memory": {n: a.get("/v1/memory")
                                               for n, a in fleet.agents.items()},
                                    "records": records, "wall_start": wall_start}))
    run = (warmup, measured, plan, budget, routing, bounds, applied, rows)
    return (replay_run(*run, records, wall_start), replay_run(*run),
            replay_run(*run, records, wall_start, served=True))


def replay_run(warmup, measured, plan, budget, routing, bounds, applied, rows,
               records=None, wall_start=None, served=False):
    """``simulated_loads`` from what it read of the run (``--save-runs`` keeps it);
    with the nodes' request ``records`` (``GET /v1/trace``) and the wall clock at the
    warm-up's start, each node's warm-up is the requests as they reached it, and
    ``served``: its measured requests too (those it served: the routing as it went,
    fallbacks included, instead of the plan's)."""
    from agent.config import AgentConfig
    from agent.config.twinsettings import recorded_settings, twin_settings
    from cachepolicies.fleet import replay_nodes, routing_weights, spread
    from cachepolicies.traces import Trace, make_trace
    from cachepolicies.twin import Directive

    profiles = node_profiles(rows)
    names = profiles[NODES[0]].names
    first = next(iter(profiles.values()))
    if records is None:
        trace_w = make_trace([t for t, _, _ in warmup], [m for _, m, _ in warmup], first)
        early = spread(trace_w, first, list(NODES), {})
    else:
        early = {n: arrived(records[n], wall_start, 0.0, bounds[0], first) for n in NODES}
    if served:
        late = {n: arrived(records[n], wall_start, bounds[1], np.inf, first) for n in NODES}
    else:
        trace_m = make_trace([bounds[1] + t for t, _, _ in measured],
                             [m for _, m, _ in measured], first)
        late = spread(trace_m, first, list(NODES), routing_weights(plan) if routing else {})
    traces = {n: Trace(np.concatenate([early[n].timestamps, late[n].timestamps]),
                       np.concatenate([early[n].model_ids, late[n].model_ids]), n)
              for n in NODES}
    # the plan's directives as each node applied them, again with every report's answer
    # (a pinned model not resident is loaded again each time; one not pinned, once)
    end = bounds[1] + measured[-1][0]
    directives = {n: [Directive(float(at), frozenset(names.index(m)
                                                     for m in applied[n]["pinned"]),
                                tuple(names.index(m) for m in applied[n]["prefetch"]))
                      for at in np.arange(bounds[0], end, applied[n].get(
                          "renewal_s", REPORT_INTERVAL_S))] for n in NODES}
    twins = {n: twin_settings(AgentConfig(), recorded_settings(rows[n]))  # as measured
             for n in NODES}
    outcomes = replay_nodes(traces, profiles, budget, "cremebrulee", twins,
                            directives=directives, log_events=True)
    out = {}
    for node, outcome in outcomes.items():
        times = np.array([t for t, what, _ in outcome.events if what == "load"])
        out[node] = {"warmup": int(np.count_nonzero(times < bounds[0])),
                     "plan": int(np.count_nonzero((times >= bounds[0]) & (times < bounds[1]))),
                     "measured": int(np.count_nonzero(times >= bounds[1]))}
    return out


def arrived(record: str, wall_start: float, since: float, until: float, profiles):
    """A node's requests that reached it from ``since`` until before ``until`` (seconds
    from ``wall_start``), from its record (the simulator's trace CSV), on the trace's
    clock."""
    import csv
    import io

    from cachepolicies.traces import Trace, make_trace

    rows = [r for r in csv.DictReader(io.StringIO(record))  # (a model never loaded
            if since <= float(r["unix_time"]) - wall_start < until  # anywhere: no profile)
            and r["model"].split(":")[0] in profiles.names]
    if not rows:
        return Trace(np.empty(0), np.empty(0, dtype=np.int64), "no requests")
    return make_trace([max(0.0, float(r["unix_time"]) - wall_start) for r in rows],
                      [r["model"].split(":")[0] for r in rows], profiles)


def node_profiles(rows: dict[str, list[dict]]):
    """Each node's profiles from its ``/v1/profiles`` rows (a model it never measured:
    the first node's that did)."""
    from cachepolicies.traces import make_profiles

    columns = ("size_bytes", "load_seconds", "exec_seconds", "first_exec_seconds",
               "exec_seconds_per_row", "load_slot_seconds")
    measured = {node: {r["model"].split(":")[0]: r for r in node_rows
                       if r.get("load_seconds") not in (None, "")}
                for node, node_rows in rows.items()}
    names = sorted({m for per in measured.values() for m in per})

    def cell(row, column):
        value = row.get(column)
        return float("nan") if value in (None, "") else float(value)

    out = {}
    for node in rows:
        chosen = [measured[node].get(m) or next(per[m] for per in measured.values()
                                                 if m in per) for m in names]
        values = {c: [cell(r, c) for r in chosen] for c in columns}
        out[node] = make_profiles(
            names, np.array(values["size_bytes"], dtype=np.int64), values["load_seconds"],
            values["exec_seconds"], values["first_exec_seconds"],
            exec_seconds_per_row=values["exec_seconds_per_row"],
            load_slot_seconds=values["load_slot_seconds"], source=f"{node}'s profiles")
    return out


def compare(args, work: Path, names: list[str], repo: Path, budget: int) -> dict:
    warmup = zipf_trace(names, args.warmup, args.rate, args.seed)
    measured = zipf_trace(names, args.requests, args.rate, args.seed + 1)
    out = {}
    for r in range(args.rounds):
        for routing in (True, False) if r % 2 == 0 else (False, True):
            label = "routing" if routing else "routing.enabled: false"
            fleet = Fleet(work / f"{label.split(':')[0]}-{r}".replace(".", "-"), repo, names,
                          budget, routing=routing)
            try:
                marks = [fleet.caches()]
                start, wall_start = time.monotonic(), time.time()
                asyncio.run(replay(fleet.urls, warmup))
                marks.append(fleet.caches())
                asked = time.monotonic() - start
                plan = fleet.plan()  # its prefetches count as the plan's loads
                applied = fleet.directives()
                marks.append(fleet.caches())
                begun = time.monotonic() - start
                results = asyncio.run(replay(fleet.urls, measured))
                marks.append(fleet.caches())
                ended, lasted = fleet.directives(), time.monotonic() - start - begun
                for node, now in applied.items():  # how often the directives came again
                    now["renewal_s"] = lasted / max(1, ended[node]["reports"] - now["reports"])
                live = live_phases(marks)
                loads = sum(x["plan"] + x["measured"] for x in live.values())
                failed = sum(1 for x in results if x["status"] != 200)
                row = {"round": r, "loads_after_plan": loads,
                       "warmup_loads": sum(x["warmup"] for x in live.values()),
                       "failed": failed,
                       "statuses": {str(s): sum(1 for x in results if x["status"] == s)
                                    for s in sorted({x["status"] for x in results})},
                       "mean_ms": round(1000 * float(np.mean([x["seconds"]
                                                              for x in results])), 2)}
                if routing:
                    worst, seen = split_error(results, plan)
                    row["split_worst_error"] = round(worst, 3)
                    row["assignment"] = plan["assignment"]
                save = None if args.save_runs is None else \
                    args.save_runs / f"{label.split(':')[0]}-{r}.json"
                sim, from_trace, as_served = simulated_loads(
                    fleet, warmup, measured, plan, budget, routing, (asked, begun),
                    applied, wall_start, save, marks)
                row["live_loads_total"] = sum(sum(x.values()) for x in live.values())
                row["simulated_loads_total"] = sum(sum(x.values()) for x in sim.values())
                row["simulated_from_trace_total"] = sum(sum(x.values())
                                                        for x in from_trace.values())
                row["simulated_as_served_total"] = sum(sum(x.values())
                                                       for x in as_served.values())
                row["loads_by_node_phase"] = {n: {"live": live[n], "simulated": sim[n]}
                                              for n in NODES}
                row["pinned"] = {n: applied[n]["pinned"] for n in NODES}
                print(f"{label}: " + json.dumps(row), flush=True)
                out.setdefault(label, []).append(row)
                if routing and r == 0 and not args.skip_kill:
                    kill(fleet, names, args)
            finally:
                fleet.stop()
    on, off = out["routing"], out["routing.enabled: false"]
    ratio = sum(x["loads_after_plan"] for x in on) / max(1, sum(x["loads_after_plan"]
                                                                for x in off))
    print(f"loads after the plan, routing / not: {ratio:.3f} (target <= 0.4); mean "
          f"{np.mean([x['mean_ms'] for x in on]):.2f} ms vs "
          f"{np.mean([x['mean_ms'] for x in off]):.2f} ms; failed "
          f"{sum(x['failed'] for x in on)} vs {sum(x['failed'] for x in off)}", flush=True)
    for label, rows in out.items():
        for x in rows:
            phases = {p: (sum(v["simulated"][p] for v in x["loads_by_node_phase"].values()),
                          sum(v["live"][p] for v in x["loads_by_node_phase"].values()))
                      for p in PHASES}
            live = max(1, x["live_loads_total"])
            print(f"{label}: simulated fleet loads {x['simulated_loads_total']} vs live "
                  f"{x['live_loads_total']} ({x['simulated_loads_total'] / live:.3f}; "
                  f"target 0.9-1.1); per phase simulated/live "
                  + ", ".join(f"{p} {s}/{v}" for p, (s, v) in phases.items())
                  + f"; with the warm-up as sent (not as it arrived) "
                  f"{x['simulated_from_trace_total']} "
                  f"({x['simulated_from_trace_total'] / live:.3f}); every request where "
                  f"it was served (the nodes' records) {x['simulated_as_served_total']} "
                  f"({x['simulated_as_served_total'] / live:.3f})", flush=True)
    return out


def kill(fleet: Fleet, names: list[str], args) -> None:
    """``kill -9`` of edge-2 a third into a run over the three nodes; requests from then
    on go to the two others (a load balancer's health check); the first plan without
    it is awaited."""
    trace = zipf_trace(names, args.kill_requests, args.rate, args.seed + 7)
    victim = fleet.agents["edge-2"]
    at = trace[len(trace) // 3][0]
    state = {"killed": None, "moved": None}

    def skip(now):
        return {2} if now >= at else set()

    async def run():
        async def killer():
            await asyncio.sleep(at)
            victim.proc.kill()
            state["killed"] = time.monotonic()

        async def watch():
            while state["moved"] is None:
                await asyncio.sleep(0.2)
                if state["killed"] is None:
                    continue
                plan = await asyncio.to_thread(lambda: fleet.co.get("/v1/plan")[1])
                if "edge-2" not in plan["assignment"]:
                    state["moved"] = time.monotonic() - state["killed"]
        watcher = asyncio.ensure_future(watch())
        results, _ = await asyncio.gather(replay(fleet.urls, trace, skip=skip), killer())
        try:
            await asyncio.wait_for(watcher, NODE_TIMEOUT_S + PLAN_INTERVAL_S + 30)
        except asyncio.TimeoutError:
            pass
        return results
    results = asyncio.run(run())
    lost = [x for x in results if x["node"] == 2 and x["status"] != 200]
    failed = [x for x in results if x["node"] != 2 and x["status"] != 200]
    print("kill -9 edge-2: " + json.dumps({
        "requests": len(results), "failed_to_survivors": len(failed),
        "in_flight_to_the_killed_node": len(lost),
        "plan_moved_its_models_after_s": None if state["moved"] is None
        else round(state["moved"], 2),
        "bound_s": NODE_TIMEOUT_S + PLAN_INTERVAL_S}), flush=True)


def hop(args, work: Path) -> None:
    """A tiny model's p50 on its own node and through the other, kept-alive clients,
    alternating blocks; plain HTTP, then mTLS between nodes (and to the client)."""
    from agent.modelzoo import write_mlp as mlp

    repo = work / "tiny"
    mlp(repo / "tiny" / "1" / "model.onnx", inputs=4, hidden=8, layers=1, outputs=4)
    (repo / "tiny" / "config.yaml").write_text(yaml.safe_dump({"max_batch_size": 0}))
    certs = work / "certs"
    certs.mkdir()
    ca = make_ca(certs)
    for tls in (False, True):
        client = None
        if tls:
            for name in NODES[:2]:
                issue_cert(ca, certs, name, hosts=(name, "127.0.0.1"))
            client = issue_cert(ca, certs, "bench-client", hosts=("127.0.0.1",))
        co = CoordinatorProcess(None, work / f"hop-co-{tls}", reactive_interval_s=3600,
                                plan_interval_s=3600)
        agents = []
        try:
            request(f"{co.url}/v1/models/tiny", "PUT", {"slo_ms": 100})
            for name in NODES[:2]:
                cfg = {"infer_threads": 2, "coordinator": {
                    "url": co.url, "report_interval_s": 0.5, "node_name": name}}
                context = None
                if tls:
                    cfg["tls"] = {"cert_file": str(certs / f"{name}.crt"),
                                  "key_file": str(certs / f"{name}.key"),
                                  "client_ca_file": str(ca.cert_file),
                                  "client_auth": "require"}
                    cfg["routing"] = {"ca_file": str(ca.cert_file),
                                      "cert_file": str(certs / f"{name}.crt"),
                                      "key_file": str(certs / f"{name}.key")}
                    context = ssl.create_default_context(cafile=str(ca.cert_file))
                    context.load_cert_chain(client.cert_file, client.key_file)
                path = work / f"hop-{name}-{tls}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                agents.append(Agent(repo, work / f"hop-{name}-{tls}", "--config", str(path),
                                    context=context))
            for agent in agents:  # the model resident on both: either may be planned
                agent.get("/v2/models/tiny/ready")
                request(f"{agent.url}/v2/models/tiny/infer", "POST", BODY,
                        context=agent.context)
            time.sleep(1.5)
            status, plan = request(f"{co.url}/v1/plan", "POST")[:2]
            home = next(iter(plan["assignment"]))
            owner = next(a for a, n in zip(agents, NODES) if n == home)
            other = next(a for a, n in zip(agents, NODES) if n != home)
            wait_for(lambda: other.get("/v1/routing")["trusted"], 30, "the table")
            p50 = asyncio.run(_hop_p50(owner, other, home, args.hop_requests, owner.context))
            kind = "mTLS" if tls else "plain HTTP"
            print(f"hop ({kind}): p50 on its node {p50[0] * 1000:.3f} ms, through the other "
                  f"{p50[1] * 1000:.3f} ms: +{(p50[1] - p50[0]) * 1000:.3f} ms "
                  f"(target <= {1.5 if tls else 1.0} ms; {100 * p50[2]:.0f} % of the "
                  f"other's answers forwarded, placement "
                  f"{plan['models']['tiny']['placement']})", flush=True)
        finally:
            for agent in agents:
                agent.stop()
            co.stop()


async def _hop_p50(owner: Agent, other: Agent, home: str, n: int, context
                   ) -> tuple[float, float, float]:
    """(p50 on the owner, p50 through the other node of the answers its owner served,
    the share of those the other forwarded)."""
    import aiohttp

    body = json.dumps(BODY).encode()
    times: dict[str, list[float]] = {"own": [], "hop": []}
    served: list[str] = []
    connector = aiohttp.TCPConnector(limit=2, ssl=context if context else True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def block(url, key, count):
            for _ in range(count):
                started = time.perf_counter()
                async with session.post(f"{url}/v2/models/tiny/infer", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    assert r.status == 200
                    by = r.headers.get("edgeagent-served-by")
                if key == "hop":
                    served.append(by)
                if by == home:  # (a plan with a replica on both: the other's own share)
                    times[key].append(time.perf_counter() - started)
        await block(owner.url, "own", 50)  # warm both paths' connections
        await block(other.url, "hop", 50)
        times = {"own": [], "hop": []}
        served.clear()
        for _ in range(max(1, n // 100)):
            await block(owner.url, "own", 100)
            await block(other.url, "hop", 100)
    return (float(np.median(times["own"])), float(np.median(times["hop"])),
            served.count(home) / max(1, len(served)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=900, help="measured, after the plan")
    ap.add_argument("--warmup", type=int, default=300, help="before the plan (its rates)")
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="fleets per mode, alternating")
    ap.add_argument("--budget-share", type=float, default=1 / 3)
    ap.add_argument("--footprint", type=float, default=1.3,
                    help="memory per file byte the budget allows for")
    ap.add_argument("--kill-requests", type=int, default=900)
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--skip-hop", action="store_true")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--hop-requests", type=int, default=2000)
    ap.add_argument("--save-runs", type=Path, default=None,
                    help="a folder to keep each run's simulator inputs in (JSON)")
    args = ap.parse_args()
    if args.save_runs is not None:
        args.save_runs.mkdir(parents=True, exist_ok=True)
    print("load average before:", open("/proc/loadavg").read().strip(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "models"
        names = write_repository(repo)
        total = sum((repo / n / "1" / "model.onnx").stat().st_size for n in names)
        budget = int(total * args.budget_share * args.footprint)
        print(f"{len(names)} models, {total / 1e6:.1f} MB of files; budget "
              f"{budget / 1e6:.1f} MB per node", flush=True)
        if not args.skip_compare:
            compare(args, work, names, repo, budget)
        if not args.skip_hop:
            hop(args, work)
    print("load average after:", open("/proc/loadavg").read().strip(), flush=True)


if __name__ == "__main__":
    main()
