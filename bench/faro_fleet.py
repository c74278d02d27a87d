"""Faro fleet benchmark (paper §6.4): SLO violations and lost utility, Faro vs baselines.

Synthetic per-minute traces (seeded): 10 models, one compressed "day" of 360 minutes
(the paper averages 4-minute windows of a day), diurnal sine with random phase and
amplitude, log-normal AR(1) noise and random bursts (1.5–3× for 3–15 minutes), clipped
to 1–1600 requests/minute; p = 180 ms, SLO 720 ms at p99 as in §6. The first 60
minutes are history for the forecasters. Right-sized (RS) capacity is the smallest
cluster in which a per-minute oracle could meet every SLO (max over minutes of the
summed M/D/c needs); SO = 0.89 RS (32/36 in the paper) and HO = 0.45 RS (16/36).

    .venv/bin/python bench/faro_fleet.py [--minutes 360] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agent.coordinator.faro.fleetpolicies import AIAD, FairShare, FaroPolicy, MArkStyle, Oneshot
from agent.coordinator.faro.fleetsim import FleetConfig, simulate
from agent.coordinator.faro.latency import mdc_latency

HISTORY = 60
PROC, SLO, PCT = 0.18, 0.72, 99.0


def synth_traces(n_models: int, minutes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    out = np.empty((n_models, minutes))
    for i in range(n_models):
        base = rng.uniform(150, 700)
        amp = rng.uniform(0.3, 0.8)
        phase = rng.uniform(0, 2 * np.pi)
        noise = np.zeros(minutes)
        for k in range(1, minutes):
            noise[k] = 0.8 * noise[k - 1] + rng.normal(0, 0.08)
        rate = base * (1 + amp * np.sin(2 * np.pi * t / 360 + phase)) * np.exp(noise)
        for _ in range(rng.poisson(3 * minutes / 360)):
            start = rng.integers(0, minutes)
            rate[start:start + rng.integers(3, 16)] *= rng.uniform(1.5, 3.0)
        out[i] = np.clip(rate, 1, 1600)
    return out


def needed(rate_per_s: float) -> int:
    n = 1
    while mdc_latency(PCT, PROC, rate_per_s, n) > SLO:
        n += 1
    return n


def right_size(traces: np.ndarray) -> int:
    per_min = [sum(needed(r / 60.0) for r in traces[:, m]) for m in range(HISTORY, traces.shape[1])]
    return int(max(per_min))


def policies():
    return [FaroPolicy("fairsum"), FaroPolicy("sum"), FaroPolicy("fair"),
            FaroPolicy("penaltysum"), FaroPolicy("penaltyfairsum"),
            FairShare(), Oneshot(), AIAD(), MArkStyle()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=360)
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    traces = synth_traces(args.models, HISTORY + args.minutes, args.seed)
    rs = right_size(traces)
    sizes = {"RS": rs, "SO": int(round(0.89 * rs)), "HO": int(round(0.45 * rs))}
    print(f"{args.models} models, {args.minutes} min, {traces[:, HISTORY:].sum():.0f} "
          f"requests expected; right-sized = {rs} replicas")
    for label, total in sizes.items():
        print(f"\n== {label}: {total} replicas ==")
        print(f"{'policy':<22} {'SLO viol.':>9} {'lost util.':>10} {'sec':>6}")
        rows = []
        for policy in policies():
            config = FleetConfig((PROC,) * args.models, (SLO,) * args.models, total,
                                 percentile=PCT, seed=args.seed)
            start = time.perf_counter()
            result = simulate(traces, HISTORY, policy, config)
            rows.append((policy.name, result.violation_rate, result.lost_utility))
            print(f"{policy.name:<22} {result.violation_rate:9.4f} {result.lost_utility:10.3f} "
                  f"{time.perf_counter() - start:6.1f}", flush=True)
        faro = min(v for name, v, _ in rows if name.startswith("Faro"))
        base = [(name, v) for name, v, _ in rows if not name.startswith("Faro")]
        ratios = ", ".join(f"{name} {v / max(faro, 1e-9):.1f}x" for name, v in base)
        print(f"baseline violations / best Faro: {ratios}")


if __name__ == "__main__":
    main()
