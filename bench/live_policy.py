"""The node agent's policy cost per request: the same policy kernels interpreted (what
``edgeagent serve`` runs, ``EDGEAGENT_JIT=0``) and compiled (numba, ``EDGEAGENT_JIT=1``),
driven as the live cache drives them (``record_access`` per request, ``choose_victims``,
``remove`` and ``admit`` on a miss) over a Pareto-popular stream of 200 models, a budget
holding a fifth of them. Each mode runs in a process of its own; kernels are loaded (or
compiled) before the timing.

    .venv/bin/python bench/live_policy.py [--requests 20000] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, random, sys, time
from cachepolicies import jit
from cachepolicies.registry import make_policy, prime_policy
requests, reps = int(sys.argv[1]), int(sys.argv[2])
out = {"compiled": jit.COMPILED}
for spec in sys.argv[3:]:
    prime_policy(spec)
    times = []
    for rep in range(reps):
        rng = random.Random(rep)
        keys = [f"m{i}" for i in range(200)]
        sizes = {k: rng.randrange(1, 100) for k in keys}
        policy, resident, used, budget = make_policy(spec), set(), 0, sum(sizes.values()) // 5
        start = time.perf_counter()
        for r in range(requests):
            key, now = keys[min(int(rng.paretovariate(1.2)) - 1, 199)], r * 0.01
            policy.record_access(key, now)
            if key in resident:
                continue
            if used + sizes[key] > budget:
                for victim in policy.choose_victims(used + sizes[key] - budget, now,
                                                    lambda k: True):
                    policy.remove(victim)
                    resident.discard(victim)
                    used -= sizes[victim]
            policy.admit(key, sizes[key], 1.0, now)
            resident.add(key)
            used += sizes[key]
        times.append((time.perf_counter() - start) / requests)
    out[spec] = times
print(json.dumps(out))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--policies", default="lru,cremebrulee,gdsf")
    args = parser.parse_args()
    specs = args.policies.split(",")
    results = {}
    for jit in ("0", "1"):
        env = {**os.environ, "EDGEAGENT_JIT": jit}
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.requests), str(args.reps),
                               *specs], env=env, capture_output=True, text=True, check=True)
        results[jit] = json.loads(done.stdout)
    print(f"policy cost per request, median of {args.reps} runs of {args.requests:,} requests "
          "(200 models, a fifth fit)")
    print(f"  {'policy':<14}{'interpreted':>13}{'compiled':>11}{'ratio':>8}")
    for spec in specs:
        interpreted = statistics.median(results["0"][spec]) * 1e6
        compiled = statistics.median(results["1"][spec]) * 1e6
        print(f"  {spec:<14}{interpreted:>10.1f} us{compiled:>8.1f} us{interpreted / compiled:>7.2f}x")


if __name__ == "__main__":
    main()
