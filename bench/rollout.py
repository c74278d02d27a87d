"""Rollouts on a real fleet (issue 37): six ``edgeagent serve`` processes, one
``edgeagent coordinator serve`` process, moto's S3 server, loopback
(``tests/rollout_fleet.py``), a client at ``--rate`` requests a second on every node
throughout. One model; each scenario rolls the next version out from where the last
left the fleet:

1. ``good``: a good version in three waves (a canary of two, two waves of two): each
   wave's start, the time its nodes all served the new version and the time its bake
   passed, from the catalog change; failed requests.
2. ``broken``: a version that fails to load: where it stopped, the time to the
   rollback, whether it is marked bad; failed requests.
3. ``slow``: a version three times slower (the same weights run three times as often):
   the time from the canary's switch to the rollback and the requests the slow version
   answered, those slower than the old version's p90 as the clients measured it before
   ("late"); then, as the baseline in the same run, the same version to every node at
   once for as long, aborted after: its answers and late ones, and the ratio.
4. ``restart``: the coordinator killed (SIGKILL) in wave 2 and started again on its
   state: the wave before and after, and when the rollout completed.
5. ``offline``: a node of wave 1 stopped as the rollout starts and started after wave 2
   completed, with a newer version in the source: the version it serves.

    .venv/bin/python bench/rollout.py [--rate 3] [--bake-s 30] [--only good,slow]

Prints the load average before and after (the figures are only as quiet as the box).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.rollout_fleet import SLO_PERCENTILE, RolloutFleet, failed  # noqa: E402
from tests.servers import s3_server  # noqa: E402

SCENARIOS = ("good", "broken", "slow", "restart", "offline")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def at(r: dict, key: str, wave: dict) -> str:
    value = wave.get(key)
    return "-" if value is None else f"{value - r['created']:6.1f}s"


class Bench:
    def __init__(self, fleet: RolloutFleet, settings: dict) -> None:
        self.fleet, self.settings = fleet, settings
        self.published = 1
        self.version = 1

    def next(self, kind: str) -> int:
        self.published += 1
        self.fleet.publish(self.published, kind)
        return self.published

    def failed_since(self, since: float) -> int:
        return sum(1 for _, a in failed(self.fleet.answers()) if a.sent >= since)

    def answers_of(self, version: int, since: float) -> list:
        return [a for xs in self.fleet.answers().values() for a in xs
                if a.sent >= since and a.version == str(version)]

    def run(self, version: int, **extra) -> dict:
        doc = self.fleet.set_version(version, **{**self.settings, **extra})
        return self.fleet.wait_rollout(doc["rollout_id"], ("completed", "rolled_back",
                                                           "aborted"), timeout=900)

    def good(self) -> None:
        since = time.monotonic()
        version = self.next("good")
        r = self.run(version)
        print(f"good: version {self.version} -> {version}, {r['state']} in "
              f"{r['updated'] - r['created']:.1f} s, "
              f"{len(r['waves'])} waves; failed requests: {self.failed_since(since)}"
              + (f"\n  reason: {r['reason']}" if r["reason"] else ""))
        for wave in r["history"]:
            print(f"  wave {wave['wave']} {','.join(wave['nodes']):<16} started "
                  f"{at(r, 'started', wave)}  all serving {at(r, 'serving', wave)}  "
                  f"bake passed {at(r, 'completed', wave)}")
        if r["state"] == "completed":
            self.version = version

    def broken(self) -> None:
        since = time.monotonic()
        version = self.next("broken")
        r = self.run(version)
        bad = [b["version"] for b in self.fleet.get("/v1/models/m")["bad_versions"]]
        print(f"broken: version {version}: {r['state']} in wave {r['wave']} after "
              f"{r['updated'] - r['created']:.1f} s; marked bad: {version in bad}; "
              f"served by {len(self.answers_of(version, since))} requests; failed "
              f"requests: {self.failed_since(since)}\n  reason: {r['reason']}")

    def slow(self) -> None:
        before = [a.seconds for xs in self.fleet.answers().values() for a in xs
                  if a.version == str(self.version)][-600:]
        p90 = statistics.quantiles(before, n=10)[-1] if len(before) >= 10 else 0.0
        since = time.monotonic()
        version = self.next("slow")
        r = self.run(version)
        canary = r["history"][0]
        served = self.answers_of(version, since)
        late = sum(1 for a in served if a.seconds > p90)
        took = r["updated"] - (canary.get("serving") or r["created"])
        print(f"slow: version {version}: {r['state']} in wave {r['wave']}, "
              f"{took:.1f} s after the canary switched (bake {self.settings['bake_s']} s); "
              f"answered {len(served)}, late {late} (over the old p90 {p90 * 1000:.1f} ms); "
              f"failed requests: {self.failed_since(since)}\n  reason: {r['reason']}")
        # the baseline: the same version to every node at once, as long, then aborted
        clear = self.fleet.url + f"/v1/models/m/bad-versions/{version}"
        from tests.helpers import request

        request(clear, "DELETE")
        since = time.monotonic()
        doc = self.fleet.set_version(version, **{**self.settings, "waves": [],
                                                 "bake_s": 3600})
        time.sleep(max(took, 1.0) + 5.0)  # as long as the canary ran, and its switch
        request(f"{self.fleet.url}/v1/rollouts/{doc['rollout_id']}/abort", "POST")
        self.fleet.wait_serving(self.version, timeout=120)
        all_at_once = self.answers_of(version, since)
        late_all = sum(1 for a in all_at_once if a.seconds > p90)
        print(f"  all at once for as long (baseline): answered {len(all_at_once)}, late "
              f"{late_all}; canary/baseline late: "
              f"{late / late_all if late_all else float('nan'):.2f}; failed requests: "
              f"{self.failed_since(since)}")
        request(clear, "DELETE")  # left as it was found: not bad, the old one served

    def restart(self) -> None:
        since = time.monotonic()
        version = self.next("good")
        doc = self.fleet.set_version(version, **self.settings)
        rollout_id = doc["rollout_id"]
        while self.fleet.rollout(rollout_id)["wave"] < 2:
            time.sleep(0.25)
        before = self.fleet.rollout(rollout_id)
        self.fleet.kill_coordinator()
        killed = time.monotonic()
        time.sleep(2.0)
        self.fleet.start_coordinator()
        back = time.monotonic()
        after = self.fleet.rollout(rollout_id)
        r = self.fleet.wait_rollout(rollout_id, ("completed", "rolled_back"), timeout=900)
        print(f"restart: killed in wave {before['wave']} ({before['phase']}), down "
              f"{back - killed:.1f} s, back in wave {after['wave']} ({after['phase']}), wave "
              f"2 started at the same time: "
              f"{after['history'][1]['started'] == before['history'][1]['started']}; "
              f"{r['state']} {r['updated'] - r['created']:.1f} s after it began; failed "
              f"requests: {self.failed_since(since)}"
              + (f"\n  reason: {r['reason']}" if r["reason"] else ""))
        if r["state"] == "completed":
            self.version = version

    def offline(self) -> None:
        since = time.monotonic()
        version = self.next("good")
        newest = self.next("good")
        doc = self.fleet.set_version(version, **self.settings)
        r = self.fleet.rollout(doc["rollout_id"])
        node = r["waves"][0][-1]
        self.fleet.stop_agent(node)
        while True:
            r = self.fleet.rollout(doc["rollout_id"])
            if r["state"] != "running" or r["wave"] == 3:
                break
            time.sleep(0.25)
        self.fleet.start_agent(node)
        self.fleet.start_client(node)
        started = time.monotonic()
        self.fleet.wait_serving(version, [node], timeout=120)
        caught_up = time.monotonic() - started
        r = self.fleet.wait_rollout(doc["rollout_id"], ("completed", "rolled_back"),
                                    timeout=900)
        print(f"offline: {node} stopped in wave 1, started after wave 2 ({r['state']}): "
              f"serves version {self.fleet.served(node)} ({caught_up:.1f} s after its "
              f"start; the source's newest is {newest}, served by "
              f"{len(self.answers_of(newest, since))} requests); failed requests: "
              f"{self.failed_since(since)}"
              + (f"\n  reason: {r['reason']}" if r["reason"] else ""))
        if r["state"] == "completed":
            self.version = version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s per node")
    parser.add_argument("--bake-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--only", default=",".join(SCENARIOS),
                        help=f"scenarios, in order: {','.join(SCENARIOS)}")
    args = parser.parse_args()
    chosen = [s for s in args.only.split(",") if s]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}: pick from {SCENARIOS}")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    settings = {"waves": [2, 2], "bake_s": args.bake_s, "settle_s": args.settle_s,
                "wave_timeout_s": 120,
                "gates": {"min_latency_increase_ms": 2, "min_requests": 50}}
    print(f"load average before: {loadavg()}")
    print(f"6 agents, a coordinator, moto's S3 server; {args.rate:g} requests/s per node; "
          f"waves {settings['waves']} + the rest, bake {args.bake_s:g} s "
          f"(window from {args.settle_s:g} s), the model's SLO at p{SLO_PERCENTILE}")
    with tempfile.TemporaryDirectory(prefix="edgeagent-rollout-") as tmp:
        tmp = Path(tmp)
        with s3_server(tmp / "aws") as s3, RolloutFleet(tmp, s3, rate=args.rate) as fleet:
            fleet.start_fleet(1, **settings)
            bench = Bench(fleet, settings)
            for name in chosen:
                getattr(bench, name)()
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
