"""The node agent's policy cost per request: the same policy kernels interpreted (what
``edgeagent serve`` runs, ``EDGEAGENT_JIT=0``) and compiled (numba, ``EDGEAGENT_JIT=1``),
driven as the live cache drives them (``record_access`` per request, ``choose_victims``,
``remove`` and ``admit`` on a miss) over a Pareto-popular stream of 200 models, a budget
holding a fifth of them; with ``--timer-share S``, that share of the models are timers
instead (each requested every 1-10 s, the stream advancing 10 ms a request), which the
forecasting policy tracks on its miss path. Prints the cost per request and, apart, per
miss (``choose_victims``, ``remove`` and ``admit``). Each mode runs in a process of its
own; kernels are loaded (or compiled) before the timing.

    .venv/bin/python bench/live_policy.py [--requests 20000] [--reps 5] [--timer-share 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import heapq, json, random, sys, time
from cachepolicies import jit
from cachepolicies.registry import make_policy, prime_policy
requests, reps, timer_share = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])


def stream(rng, keys):
    """(key, now) per request: timers when due, else a Pareto-popular key."""
    timers = int(timer_share * len(keys))
    due = [(rng.uniform(0, 10), rng.uniform(1, 10), k) for k in range(timers)]
    heapq.heapify(due)
    for r in range(requests):
        now = r * 0.01
        if due and due[0][0] <= now:
            _, period, k = heapq.heappop(due)
            heapq.heappush(due, (now + period, period, k))
        else:
            k = timers + min(int(rng.paretovariate(1.2)) - 1, len(keys) - timers - 1)
        yield keys[k], now


out = {"compiled": jit.COMPILED}
for spec in sys.argv[4:]:
    prime_policy(spec)
    times, misses = [], []
    for rep in range(reps):
        rng = random.Random(rep)
        keys = [f"m{i}" for i in range(200)]
        sizes = {k: rng.randrange(1, 100) for k in keys}
        requested = list(stream(rng, keys))
        policy, resident, used, budget = make_policy(spec), set(), 0, sum(sizes.values()) // 5
        miss_time, miss_count = 0.0, 0
        start = time.perf_counter()
        for key, now in requested:
            policy.record_access(key, now)
            if key in resident:
                continue
            began = time.perf_counter()
            if used + sizes[key] > budget:
                for victim in policy.choose_victims(used + sizes[key] - budget, now,
                                                    lambda k: True):
                    policy.remove(victim)
                    resident.discard(victim)
                    used -= sizes[victim]
            policy.admit(key, sizes[key], 1.0, now)
            miss_time += time.perf_counter() - began
            miss_count += 1
            resident.add(key)
            used += sizes[key]
        times.append((time.perf_counter() - start) / requests)
        misses.append(miss_time / miss_count)
    out[spec] = {"request": times, "miss": misses}
print(json.dumps(out))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--policies", default="lru,cremebrulee,gdsf,cremebrulee-forecast")
    parser.add_argument("--timer-share", type=float, default=0.0,
                        help="share of the 200 models that are timers (1-10 s periods)")
    args = parser.parse_args()
    specs = args.policies.split(",")
    results = {}
    for jit in ("0", "1"):
        env = {**os.environ, "EDGEAGENT_JIT": jit}
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.requests), str(args.reps),
                               str(args.timer_share), *specs], env=env, capture_output=True,
                              text=True, check=True)
        results[jit] = json.loads(done.stdout)
    print(f"policy cost per request and per miss, median of {args.reps} runs of "
          f"{args.requests:,} requests (200 models, a fifth fit, {args.timer_share:.0%} timers)")
    print(f"  {'policy':<22}{'interpreted':>13}{'compiled':>11}{'ratio':>8}"
          f"{'miss, interpreted':>20}{'compiled':>11}")
    for spec in specs:
        interpreted, compiled = (statistics.median(results[jit][spec]["request"]) * 1e6
                                 for jit in ("0", "1"))
        miss_interpreted, miss_compiled = (statistics.median(results[jit][spec]["miss"]) * 1e6
                                           for jit in ("0", "1"))
        print(f"  {spec:<22}{interpreted:>10.1f} us{compiled:>8.1f} us"
              f"{interpreted / compiled:>7.2f}x{miss_interpreted:>17.1f} us"
              f"{miss_compiled:>8.1f} us")


if __name__ == "__main__":
    main()
