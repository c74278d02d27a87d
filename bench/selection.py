"""Clipper's selection figures (Figs. 7-10) on the synthetic classifier, through a live
agent (``edgeagent serve`` in its own process) over HTTP with feedback:

* ``recovery`` (Fig. 8): a stream where the best of five members fails on the middle
  quarter; exp3 and exp4 against every static member, and the controls (Clipper's
  literal Exp4 update, plain Hedge, undiscounted Thompson), over several seeds: the
  cumulative error, and when the leader moved off the failed member and back.
* ``policies``: the same stream through the policies alone, in this process (no agent):
  the controls' figures without the serving path in between, and where the weights go.
* ``ensemble`` (Fig. 7): exp4's error against the best member's on a stationary
  stream, and the error of answers at each level of agreement.
* ``stragglers`` (Fig. 9): ensembles of 1-16 members with lognormal latency under a
  20 ms SLO, with the cut-off and waiting for every member: p99 and accuracy.
* ``users`` (Fig. 10): 400 users whose best member depends on their group (reported
  right 70 % of the time): per-user error on later queries against the general
  member and the member of the reported group.
* ``feedback``: observations per second through the feedback endpoint.
* ``budget``: an app of five members under a budget holding two: loads per 1,000
  requests after warm-up, and the p99 against the SLO.

    .venv/bin/python bench/selection.py [--seeds 10] [--queries 20000] [--rows 1]
        [--feedback-batch 1] [--jobs 1] [--policies exp4,exp3,clipper_exp4,hedge,thompson_undiscounted]
        [--nice 0] [--straggler-sigma 0.6] [--straggler-queries 300] [--straggler-sizes 1,2,4,8,16]
        [--only recovery,policies,ensemble,stragglers,users,feedback,budget]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import random

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.backends.synthetic import classify  # noqa: E402
from agent.config import parse_model_config  # noqa: E402
from agent.node.selection.policies import SelectionPolicy  # noqa: E402
from tests.helpers import Agent, add_app, add_classifier  # noqa: E402


class Client:
    """One keep-alive HTTP connection to the agent."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data,
                          headers={"Content-Type": "application/json"} if data else {})
        resp = self.conn.getresponse()
        doc = json.loads(resp.read())
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: {resp.status} {doc}")
        return doc

    def infer(self, app: str, x: np.ndarray, **params):
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                            "data": x.reshape(-1).tolist()}]}
        if params:
            body["parameters"] = params
        doc = self.call("POST", f"/v2/models/{app}/infer", body)
        return np.asarray(doc["outputs"][0]["data"]), doc.get("id"), doc.get("parameters")

    def answers(self, model: str, x: np.ndarray, chunk: int = 1000) -> np.ndarray:
        """A plain model's answers to many rows, a chunk per request."""
        return np.concatenate([self.infer(model, x[i:i + chunk])[0]
                               for i in range(0, len(x), chunk)])

    def feedback(self, app: str, rid: str, labels, context=None):
        item = {"id": rid, "labels": [int(v) for v in labels]}
        if context is not None:
            item["context"] = context
        return self.call("POST", f"/v2/models/{app}/feedback", item)

    def weights(self, app: str) -> list[float]:
        return [m["weight"] for m in self.call("GET", f"/v1/selection/{app}")["members"]]


def rows(ids, truth, group=0) -> np.ndarray:
    ids = np.asarray(ids, np.float32)
    return np.stack([ids, np.asarray(truth, np.float32),
                     np.broadcast_to(np.asarray(group, np.float32), ids.shape)], 1)


# -- Fig. 8: recovery ------------------------------------------------------------------

ERRORS = (0.1, 0.2, 0.25, 0.3, 0.35)
POLICIES = {"exp4": {"policy": "exp4"}, "exp3": {"policy": "exp3"},
            "clipper_exp4": {"policy": "clipper_exp4"},
            "hedge": {"policy": "exp4", "share": 0},
            "thompson_undiscounted": {"policy": "thompson", "discount": 1}}


def setup_recovery(repo: Path, seeds: int, queries: int, policies: list[str]) -> None:
    fail, heal = queries // 4, queries // 2
    for seed in range(seeds):
        names = []
        for i, err in enumerate(ERRORS):
            name = f"r{seed}m{i}"
            add_classifier(repo, name, base_ms=0.2, classes=10, seed=seed, error=err,
                           schedule=[[fail, heal, 0.9]] if i == 0 else [])
            names.append(name)
        for label in policies:
            add_app(repo, f"r{seed}-{label}", names, slo_ms=1000, **POLICIES[label])


def recovery(url: str, seeds: int, queries: int, step: int, policies: list[str],
             batch: int = 1, jobs: int = 1) -> dict:
    """``step`` queries per request, their feedback sent ``batch`` requests at a time;
    ``jobs`` seeds at a time (a client each)."""
    with ThreadPoolExecutor(jobs) as pool:
        per_seed = list(pool.map(lambda seed: recovery_seed(
            Client(url), seed, queries, step, policies, batch), range(seeds)))
    return {label: [one[label] for one in per_seed] for label in policies}


def recovery_seed(client: Client, seed: int, queries: int, step: int, policies: list[str],
                  batch: int) -> dict:
    fail, heal = queries // 4, queries // 2
    out: dict = {}
    truth = np.random.default_rng(seed).integers(0, 10, queries)
    for label in policies:
        app = f"r{seed}-{label}"
        wrong, leaders, items = 0, [], []
        for start in range(0, queries, step):
            ids = np.arange(start, min(start + step, queries))
            answer, rid, _ = client.infer(app, rows(ids, truth[ids]))
            wrong += int((answer != truth[ids]).sum())
            items.append({"id": rid, "labels": truth[ids].tolist()})
            if len(items) >= batch or ids[-1] == queries - 1:
                client.call("POST", f"/v2/models/{app}/feedback", {"feedback": items})
                items = []
            if (start // step) % max(100 // step, 1) == 0:
                w = client.weights(app)
                leaders.append((start, int(np.argmax(w))))
        off = next((q - fail for q, lead in leaders if fail <= q < heal and lead != 0), None)
        back = next((q - heal for q, lead in leaders if q >= heal and lead == 0), None)
        back = back if off is not None else None  # it never left the failed member
        out[label] = {"seed": seed, "error": wrong / queries, "off": off, "back": back}
    # every static member's error on the same stream (the members' own answers)
    static = np.array([float((client.answers(f"r{seed}m{i}", rows(np.arange(queries), truth))
                              != truth).mean()) for i in range(len(ERRORS))])
    for label in policies:
        out[label]["static"] = static.round(4).tolist()
        out[label]["below_every_static"] = bool(out[label]["error"] < static.min())
    return out


def policies_seed(seed: int, queries: int, label: str) -> dict:
    """The recovery stream of ``seed`` through policy ``label`` alone, one query per
    round: the cumulative error, when the leader moved off and back, the weights at the
    failure, the healing and the end, and when each member's weight reached 0 (underflow)."""
    fail, heal = queries // 4, queries // 2
    truth = np.random.default_rng(seed).integers(0, 10, queries)
    x = rows(np.arange(queries), truth)
    preds = np.stack([classify(parse_model_config({"backend": "synthetic", "synthetic": {
        "classifier": {"classes": 10, "seed": seed, "error": err,
                       "schedule": [[fail, heal, 0.9]] if i == 0 else []}}}
    ).synthetic.classifier, f"r{seed}m{i}", x).reshape(-1) for i, err in enumerate(ERRORS)])
    options = {k: v for k, v in POLICIES[label].items() if k != "policy"}
    policy = SelectionPolicy(POLICIES[label]["policy"], len(ERRORS), **options)
    state, rng = policy.fresh(), random.Random(seed)
    wrong, lead, zeroed, snapshots = 0, np.zeros(queries, int), {}, {}
    for q in range(queries):
        asked, probs = policy.select(state, [True] * len(ERRORS), rng)
        answer, _ = policy.combine(state, {i: preds[i, q:q + 1].reshape(1, 1)
                                           for i in asked}, "label")
        wrong += int(answer[0, 0] != truth[q])
        policy.observe(state, {i: float(preds[i, q] != truth[q]) for i in asked}, 1,
                       dict(zip(asked, probs)))
        lead[q] = int(np.argmax(state.weights))
        for i, w in enumerate(state.weights if policy.ensemble else ()):
            if w == 0 and i not in zeroed:
                zeroed[i] = q
        if q + 1 in (fail, heal, queries):
            snapshots[q + 1] = [float(f"{p:.3g}") for p in policy.probabilities(state)]
    off = np.flatnonzero(lead[fail:heal] != 0)
    back = np.flatnonzero(lead[heal:] == 0)
    static = (preds != truth).mean(axis=1)
    return {"seed": seed, "error": wrong / queries,
            "off": int(off[0]) if len(off) else None,
            "back": int(back[0]) if len(back) and len(off) else None,  # never left: None
            "below_every_static": bool(wrong / queries < static.min()),
            "zeroed_at": zeroed, "weights_at": snapshots}


# -- Fig. 7: ensemble and agreement ----------------------------------------------------


def setup_ensemble(repo: Path) -> None:
    for i, err in enumerate(ERRORS):
        add_classifier(repo, f"e{i}", base_ms=0.2, classes=10, seed=99, error=err)
    add_app(repo, "ensemble", [f"e{i}" for i in range(5)], slo_ms=1000)


def ensemble(client: Client, queries: int) -> dict:
    truth = np.random.default_rng(7).integers(0, 10, queries)
    wrong = np.zeros(queries, bool)
    agree = np.zeros(queries)
    for q in range(queries):
        answer, rid, params = client.infer("ensemble", rows([q], truth[q:q + 1]))
        wrong[q] = answer[0] != truth[q]
        agree[q] = params["confidence"]
        client.feedback("ensemble", rid, truth[q:q + 1])
    later = slice(queries // 5, None)  # after the weights settled
    members = [round(float((client.answers(f"e{i}", rows(np.arange(queries), truth))[later]
                            != truth[later]).mean()), 4) for i in range(5)]
    by_agreement = {}
    for k in range(1, 6):
        chosen = agree[later] >= k / 5 - 1e-9
        by_agreement[f">={k}/5"] = {"error": round(float(wrong[later][chosen].mean()), 4)
                                    if chosen.any() else None,
                                    "answered": round(float(chosen.mean()), 4)}
    return {"ensemble_error": round(float(wrong[later].mean()), 4), "members": members,
            "by_agreement": by_agreement}


# -- Fig. 9: stragglers ----------------------------------------------------------------

SIZES = (1, 2, 4, 8, 16)


def setup_stragglers(repo: Path, slo_ms: float, sigma: float) -> None:
    """Members of median 6 ms whose latency is lognormal with ``sigma`` (the paper does
    not give its models' distribution)."""
    for i in range(max(SIZES)):
        add_classifier(repo, f"s{i}", base_ms=6, classes=10, seed=5, error=0.3,
                       jitter={"lognormal_sigma": sigma})
    for n in SIZES:
        members = [f"s{i}" for i in range(n)]
        add_app(repo, f"cut{n}", members, slo_ms=slo_ms, policy="exp4", share=0.5)
        add_app(repo, f"all{n}", members, slo_ms=60_000, policy="exp4", share=0.5)


def stragglers(client: Client, queries: int, slo_ms: float,
               sizes: tuple[int, ...] = SIZES) -> dict:
    """Client-side and the app's own (arrival to answer, ``GET /v1/selection/{app}``)
    latency, accuracy, and the share of requests that answered without a member cut."""
    out = {}
    truth = np.random.default_rng(3).integers(0, 10, queries)
    for n in sizes:
        for mode in ("cut", "all"):
            app = f"{mode}{n}"
            client.infer(app, rows([0], [0]))  # validated, members resident
            latencies, wrong, cut = [], 0, 0
            for q in range(queries):
                started = time.perf_counter()
                answer, _, params = client.infer(app, rows([q], truth[q:q + 1]))
                latencies.append((time.perf_counter() - started) * 1000)
                wrong += int(answer[0] != truth[q])
                cut += bool(params["missing"])
            server = client.call("GET", f"/v1/selection/{app}")["answer_ms"]
            out[app] = {"p50_ms": round(float(np.percentile(latencies, 50)), 2),
                        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
                        "server_p50_ms": server["p50"], "server_p99_ms": server["p99"],
                        "server_max_ms": server["max"],
                        "accuracy": round(1 - wrong / queries, 4),
                        "requests_with_a_member_cut": round(cut / queries, 4)}
    return out


# -- Fig. 10: per-user selection -------------------------------------------------------

GROUPS = 4


def setup_users(repo: Path, users: int) -> None:
    for g in range(GROUPS):
        add_classifier(repo, f"d{g}", base_ms=0.2, classes=10, seed=11, error=0.6,
                       groups={g: 0.1})
    add_classifier(repo, "general", base_ms=0.2, classes=10, seed=11, error=0.3)
    add_app(repo, "users", [f"d{g}" for g in range(GROUPS)] + ["general"], slo_ms=1000,
            max_contexts=users + 10, eta=0.3)


def per_user(client: Client, users: int, per: int) -> dict:
    rng = np.random.default_rng(21)
    group = rng.integers(0, GROUPS, users)
    reported = np.where(rng.random(users) < 0.7, group,
                        (group + rng.integers(1, GROUPS, users)) % GROUPS)
    later = per // 2
    app_wrong = general_wrong = reported_wrong = count = 0
    q = 0
    for turn in range(per):
        for u in range(users):
            truth = int(rng.integers(0, 10))
            x = rows([q], [truth], group[u])
            answer, rid, _ = client.infer("users", x, context=f"user{u}")
            client.feedback("users", rid, [truth])
            if turn >= later:
                count += 1
                app_wrong += int(answer[0] != truth)
                general_wrong += int(client.infer("general", x)[0][0] != truth)
                reported_wrong += int(client.infer(f"d{reported[u]}", x)[0][0] != truth)
            q += 1
    return {"per_user_error": round(app_wrong / count, 4),
            "general_member_error": round(general_wrong / count, 4),
            "reported_group_member_error": round(reported_wrong / count, 4),
            "users": users, "queries_per_user": per, "later_queries": count}


# -- feedback throughput and the budget ------------------------------------------------


def feedback_rate(client: Client, predictions: int, batch: int) -> dict:
    x = rows([1], [1])
    ids = [client.infer("ensemble", x)[1] for _ in range(predictions)]
    started = time.perf_counter()
    half = predictions // 2
    for rid in ids[:half]:
        client.feedback("ensemble", rid, [1])
    single = half / (time.perf_counter() - started)
    started = time.perf_counter()
    rest = ids[half:]
    for i in range(0, len(rest), batch):
        items = [{"id": rid, "labels": [1]} for rid in rest[i:i + batch]]
        client.call("POST", "/v2/models/ensemble/feedback", {"feedback": items})
    batched = len(rest) / (time.perf_counter() - started)
    return {"single_per_s": round(single), f"batched_{batch}_per_s": round(batched)}


def setup_budget(repo: Path) -> None:
    for i, err in enumerate((0.05, 0.25, 0.3, 0.35, 0.4)):
        add_classifier(repo, f"b{i}", base_ms=1, classes=10, seed=4, error=err,
                       size_bytes=100_000_000)
    add_app(repo, "budget", [f"b{i}" for i in range(5)], slo_ms=50)


def budget(client: Client, warmup: int, measured: int) -> dict:
    rng = np.random.default_rng(8)

    def loads():
        return sum(client.call("GET", f"/v1/cache/b{i}")["loads"] for i in range(5))

    def run(n, start):
        latencies = []
        for q in range(start, start + n):
            truth = int(rng.integers(0, 10))
            began = time.perf_counter()
            _, rid, _ = client.infer("budget", rows([q], [truth]))
            latencies.append((time.perf_counter() - began) * 1000)
            client.feedback("budget", rid, [truth])
        return latencies

    run(warmup, 0)
    before = loads()
    latencies = run(measured, warmup)
    return {"loads_per_1000": round((loads() - before) * 1000 / measured, 2),
            "p99_ms": round(float(np.percentile(latencies, 99)), 2), "slo_ms": 50,
            "warmup": warmup, "measured": measured}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--queries", type=int, default=20000)
    ap.add_argument("--rows", type=int, default=1, help="queries per request (recovery)")
    ap.add_argument("--feedback-batch", type=int, default=1,
                    help="requests whose feedback goes in one feedback request (recovery)")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at a time (recovery)")
    ap.add_argument("--users", type=int, default=400)
    ap.add_argument("--per-user", type=int, default=20)
    ap.add_argument("--slo-ms", type=float, default=20)
    ap.add_argument("--straggler-sigma", type=float, default=0.6,
                    help="the stragglers' lognormal sigma (members of median 6 ms)")
    ap.add_argument("--straggler-queries", type=int, default=300,
                    help="queries per ensemble size and mode (stragglers)")
    ap.add_argument("--straggler-sizes", default=",".join(map(str, SIZES)),
                    help="ensemble sizes (stragglers), each one of " + ",".join(map(str, SIZES)))
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="recovery's policies and controls")
    ap.add_argument("--nice", type=int, default=0,
                    help="the agent's and this client's niceness (-10: other work on the "
                         "box does not preempt them; negative needs root)")
    ap.add_argument("--only", default="recovery,ensemble,stragglers,users,feedback,budget",
                    help="parts to run; 'policies' (the recovery stream in-process) too")
    args = ap.parse_args()
    if not set(args.straggler_sizes.split(",")) <= {str(n) for n in SIZES}:
        ap.error(f"--straggler-sizes: each one of {','.join(map(str, SIZES))}")
    parts = set(args.only.split(","))
    if "policies" in parts:
        with ThreadPoolExecutor(args.jobs) as pool:  # numpy releases the GIL little
            for label in args.policies.split(","):
                runs = list(pool.map(lambda seed: policies_seed(seed, args.queries, label),
                                     range(args.seeds)))
                print(f"policies {label:22s} error {np.mean([r['error'] for r in runs]):.4f} "
                      f"below every static in {sum(r['below_every_static'] for r in runs)}"
                      f"/{len(runs)}; off after {[r['off'] for r in runs]}; back after "
                      f"{[r['back'] for r in runs]}", flush=True)
                for r in runs:
                    print(f"  seed {r['seed']}: weights at {r['weights_at']}; "
                          f"reached 0 at {r['zeroed_at']}", flush=True)
        parts.discard("policies")
        if not parts:
            return
    tmp = Path(tempfile.mkdtemp(prefix="bench-selection-"))
    repo = tmp / "models"
    repo.mkdir()
    policies = args.policies.split(",")
    setup_recovery(repo, args.seeds, args.queries, policies)
    setup_ensemble(repo)
    setup_stragglers(repo, args.slo_ms, args.straggler_sigma)
    setup_users(repo, args.users)
    results: dict = {"loadavg": os.getloadavg()[0]}
    before = None
    if args.nice:
        os.nice(args.nice)
        before = f"import os; os.nice({args.nice})"
    agent = Agent(repo, tmp / "data", "--cpu-budget", "2GB", before=before)
    try:
        client = Client(agent.url)
        if "recovery" in parts:
            rec = recovery(agent.url, args.seeds, args.queries, args.rows, policies,
                           args.feedback_batch, args.jobs)
            for label, runs in rec.items():
                below = sum(r["below_every_static"] for r in runs)
                offs = [r["off"] for r in runs]
                backs = [r["back"] for r in runs]
                print(f"recovery {label:22s} error {np.mean([r['error'] for r in runs]):.4f} "
                      f"below every static in {below}/{len(runs)}; off after {offs}; "
                      f"back after {backs}", flush=True)
            print("static members (seed 0):", rec[policies[0]][0]["static"], flush=True)
            results["recovery"] = rec
        if "ensemble" in parts:
            results["ensemble"] = ensemble(client, 2000)
            print("ensemble", json.dumps(results["ensemble"]), flush=True)
        if "stragglers" in parts:
            sizes = tuple(int(n) for n in args.straggler_sizes.split(","))
            results["stragglers"] = stragglers(client, args.straggler_queries, args.slo_ms,
                                               sizes)
            for app, r in results["stragglers"].items():
                print(f"stragglers {app:6s} {json.dumps(r)}", flush=True)
        if "users" in parts:
            results["users"] = per_user(client, args.users, args.per_user)
            print("users", json.dumps(results["users"]), flush=True)
        if "feedback" in parts:
            results["feedback"] = feedback_rate(client, 4000, 500)
            print("feedback", json.dumps(results["feedback"]), flush=True)
    finally:
        agent.stop()
    if "budget" in parts:  # an agent of its own: its budget holds 2 of the 5 members
        small = tmp / "budget"
        small.mkdir()
        setup_budget(small)
        agent = Agent(small, tmp / "data-budget", "--cpu-budget", "250MB", before=before)
        try:
            results["budget"] = budget(Client(agent.url), 1000, 1000)
            print("budget", json.dumps(results["budget"]), flush=True)
        finally:
            agent.stop()
    results["loadavg_end"] = os.getloadavg()[0]
    print(f"load average {results['loadavg']:.2f} -> {results['loadavg_end']:.2f}")
    (tmp / "results.json").write_text(json.dumps(results, indent=1))
    print("results:", tmp / "results.json")


if __name__ == "__main__":
    main()
