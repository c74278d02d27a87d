"""Eviction policies compared on the CremeBrulee simulation setup (paper §VI-C, Fig. 8).

Workloads: an hour of synthetic Azure-style invocations (``cachepolicies.workloads``,
the paper's filtering), each function its own model ("distinct" names) with a shipped
CremeBrulee profile chosen by ``quantiles-r`` (popular → fast to load, the paper's
simulation workload) or ``uniform``. Capacities 4 GB … 2048 GB by powers of 2. Prints
the mean model load delay per request for each policy, averaged over ``--seeds``
workloads, and the improvements in the paper's terms ((baseline − policy) / baseline):

- CremeBrulee over popularity at 128 GB and on average (paper: 16.62 %, 7.6 %);
- CremeBrulee-oracle over BeladyMIN at 128 GB and on average (paper: 12.15 %, 6.19 %);
- the best improvement of each over random (paper: 36.34 % and 56.47 %).

    .venv/bin/python bench/policy_comparison.py [--seeds 3] [--plot out.png]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cachepolicies.simulator import simulate
from cachepolicies.traces import cremebrulee_profiles_path, read_profiles
from cachepolicies.workloads import TraceOptions, build_workload, synthetic_invocations

POLICIES = ("random", "lru", "gdsf", "popularity", "cremebrulee",
            "popularity:rate=cumulative", "cremebrulee:rate=cumulative",
            "beladymin", "cremebrulee-oracle")
# (policy, baseline) pairs reported as improvements.
PAIRS = (("cremebrulee", "popularity"),
         ("cremebrulee:rate=cumulative", "popularity:rate=cumulative"),
         ("cremebrulee-oracle", "beladymin"),
         ("cremebrulee", "random"),
         ("cremebrulee-oracle", "random"))
GB = 10**9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=30_000,
                        help="synthetic functions per workload (an hour of them)")
    parser.add_argument("--seeds", type=int, default=3, help="workloads per association")
    parser.add_argument("--associations", default="quantiles-r,uniform")
    parser.add_argument("--plot", default=None, help="PNG of load delay vs capacity")
    args = parser.parse_args()
    shipped = read_profiles(cremebrulee_profiles_path())
    capacities = [2**k * GB for k in range(2, 12)]  # 4 GB .. 2048 GB
    figures = {}
    for association in args.associations.split(","):
        t0 = time.perf_counter()
        delay = np.zeros((len(POLICIES), len(capacities)))
        stats = []
        for seed in range(args.seeds):
            invocations = synthetic_invocations(args.functions, 60, seed=seed)
            workload = build_workload(invocations.with_trigger("http"), shipped,
                                      TraceOptions(association=association, seed=seed))
            trace, profiles = workload.trace, workload.profiles
            stats.append((len(trace), len(profiles), profiles.size_bytes.sum()))
            for i, spec in enumerate(POLICIES):
                for j, capacity in enumerate(capacities):
                    result = simulate(trace, profiles, capacity, spec, seed=seed)
                    delay[i, j] += result.mean_load_delay_seconds / args.seeds
        requests, models, total = np.mean(stats, axis=0)
        print(f"\n== {association}: {requests:,.0f} requests over {models:,.0f} models, "
              f"{total / 1e12:.2f} TB in all (mean of {args.seeds} seeds; "
              f"{time.perf_counter() - t0:.1f} s)")
        _print_table(delay, capacities)
        _print_improvements(delay, capacities)
        figures[association] = delay
    if args.plot:
        _plot(figures, capacities, args.plot)
        print(f"\nplot: {args.plot}")


def _print_table(delay: np.ndarray, capacities: list[int]) -> None:
    print("mean model load delay per request (s)")
    print(f"{'policy':<29}" + "".join(f"{c // GB:>7}G" for c in capacities))
    for i, spec in enumerate(POLICIES):
        print(f"{spec:<29}" + "".join(f"{d:>8.3f}" for d in delay[i]))


def _print_improvements(delay: np.ndarray, capacities: list[int]) -> None:
    at = capacities.index(128 * GB)
    for policy, baseline in PAIRS:
        p, b = delay[POLICIES.index(policy)], delay[POLICIES.index(baseline)]
        gain = np.divide(b - p, b, out=np.zeros_like(b), where=b > 0)
        print(f"{policy} over {baseline}: {gain[at]:+.1%} at 128 GB, "
              f"{gain.mean():+.1%} on average, best {gain.max():+.1%}, "
              f"worst {gain.min():+.1%}")


def _plot(figures: dict[str, np.ndarray], capacities: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(figures), figsize=(6 * len(figures), 4.5), squeeze=False)
    for ax, (association, delay) in zip(axes[0], figures.items()):
        for i, spec in enumerate(POLICIES):
            ax.plot([c / GB for c in capacities], delay[i], marker="o", label=spec)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache capacity (GB)")
        ax.set_ylabel("mean model load delay per request (s)")
        ax.set_title(association)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
