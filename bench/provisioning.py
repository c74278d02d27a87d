"""MArk provisioning benchmark: Algorithm 1's greedy vs "always the peak" vs the
exhaustive optimum, on small seeded cases (2-3 instance types, 8 one-minute steps).

Greedy variants: scale-in by break-even time (the default), the paper's (stop what
the plan leaves out), and either with the artifact's 6-plan cool-down. The greedy
re-plans every step with a perfect forecast of the next ``--horizon`` steps;
the exhaustive optimum is a dynamic programme over per-step counts that knows the whole
trace (running price plus launch overhead of every instance added). Costs in dollars;
gaps relative to the optimum.

    .venv/bin/python bench/provisioning.py [--cases 28] [--horizon 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

from agent.coordinator.provisioning import (optimal_cost, peak_cost, random_cases,
                                            simulate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=28)
    ap.add_argument("--horizon", type=int, default=6)
    args = ap.parse_args()
    t0 = time.perf_counter()
    variants = {"greedy, break-even scale-in": (1, True),
                "greedy, paper's scale-in": (1, False),
                "greedy, 6-plan cool-down": (6, True)}
    gaps: dict[str, list[float]] = {key: [] for key in variants}
    gaps["always the peak"] = []
    unmet = 0
    for types, demand in random_cases(args.cases):
        best = optimal_cost(types, demand)
        for key, (plans, break_even) in variants.items():
            cost, u = simulate(types, demand, horizon=args.horizon, scale_in_plans=plans,
                               break_even=break_even)
            unmet += u
            gaps[key].append(cost / best - 1)
        gaps["always the peak"].append(peak_cost(types, demand) / best - 1)
    print(f"{args.cases} cases; cost above the exhaustive optimum")
    print(f"{'method':<32} {'mean':>6} {'median':>7} {'worst':>6}  within 5 %")
    for key, g in gaps.items():
        print(f"{key:<32} {100 * statistics.mean(g):5.1f}% {100 * statistics.median(g):6.1f}%"
              f" {100 * max(g):5.1f}%  {sum(x <= 0.05 for x in g):>3}/{len(g)}")
    print(f"steps with demand unmet by the greedy: {unmet}  "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
