"""Ribbon on the live-fleet evaluator (``ribbon/fleet.py``): BO vs pruned random search.

Seeded synthetic fleets that no test or tuning used: 3 kinds of node (price, cores,
speed, max count drawn at random) and 8 catalogued models (rate, processing time, SLO
drawn at random; each kind is up to 2x faster or slower on each model). For each fleet: the optimum by
exhaustive search, then over ``--seeds`` seeds how often BO and pruned random search
find it within 100 samples and their median samples to it; the time of one
measurement (Faro's allocator and the M/D/c shares); the optimum's saving against the
cheapest pool of one kind that meets QoS ("-": none does).

    .venv/bin/python bench/fleet_sizing.py [--fleets 8] [--seeds 10]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from agent.coordinator.faro import JobSpec
from agent.coordinator.ribbon.fleet import FleetEvaluator, PoolType
from agent.coordinator.ribbon.search import search

BUDGET = 100


def make_fleet(seed: int) -> FleetEvaluator:
    rng = np.random.default_rng(1000 + seed)
    models = []
    for i in range(8):
        proc = float(rng.uniform(0.005, 0.05))
        models.append(JobSpec(f"m{i}", rate=float(rng.uniform(10, 150)), proc_s=proc,
                                slo_s=proc * float(rng.uniform(4, 12))))
    types = []
    for k in range(3):
        cores = float(rng.choice([2, 4, 8, 16]))
        speed = float(rng.uniform(0.5, 2.0))      # > 1: faster than the models' base
        price = cores * float(rng.uniform(0.02, 0.06)) * speed ** 0.7
        types.append(PoolType(f"k{k}", round(price, 3), int(rng.integers(4, 9)), cores,
                              cores * 2e9, {m.name: m.proc_s / speed
                                            * float(rng.uniform(0.5, 2.0)) for m in models}))
    return FleetEvaluator(types, models)


def samples_to(evaluator, method: str, seeds: int, opt: float) -> list[float]:
    out = []
    for seed in range(seeds):
        r = search(evaluator, method, seed=seed, max_samples=BUDGET,
                   until=lambda res: res.best is not None and res.best.price <= opt + 1e-9)
        hit = r.best is not None and abs(r.best.price - opt) < 1e-9
        out.append(float(r.samples_to_best) if hit else math.inf)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"{'fleet':<6} {'size':>5} {'optimum':>14} {'bo found':>8} {'median':>6}"
          f" {'random found':>12} {'median':>6} {'ms/measure':>10} {'vs one kind':>11}")
    ratios = []
    for f in range(args.fleets):
        ev = make_fleet(f)
        t = time.perf_counter()
        every = search(ev, "exhaustive")
        per_ms = (time.perf_counter() - t) / every.samples * 1000
        if every.best is None:
            print(f"f{f:<5} {ev.space.size:5d}  no pool meets QoS")
            continue
        opt = every.best.price
        homogeneous = [s.price for s in every.history if s.qos_percent >= 99
                       and sum(1 for c in s.counts if c) == 1]
        saving = 1 - opt / min(homogeneous) if homogeneous else math.nan
        bo = samples_to(FleetEvaluator(ev.types, ev.models), "bo", args.seeds, opt)
        rnd = samples_to(FleetEvaluator(ev.types, ev.models), "random", args.seeds, opt)
        med_bo, med_rnd = statistics.median(bo), statistics.median(rnd)
        ratios.append(med_bo / med_rnd)
        print(f"f{f:<5} {ev.space.size:5d} {str(list(every.best.counts)):>8} ${opt:5.2f}"
              f" {sum(math.isfinite(x) for x in bo):>5}/{args.seeds} {med_bo:6.1f}"
              f" {sum(math.isfinite(x) for x in rnd):>9}/{args.seeds} {med_rnd:6.1f}"
              f" {per_ms:10.1f} {'-' if math.isnan(saving) else f'{100 * saving:.1f}%':>11}")
    if ratios:
        print(f"median samples, bo / random: {statistics.median(ratios):.2f} "
              f"(per fleet {', '.join(f'{r:.2f}' for r in ratios)}); "
              f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
