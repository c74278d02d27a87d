"""The matched fleet simulator: sanity of the M/D/c servers, tail drop and policies."""

import numpy as np

from agent.coordinator.faro.fleetpolicies import AIAD, FairShare, FaroPolicy
from agent.coordinator.faro.fleetsim import FleetConfig, simulate


def flat(rate_per_min, models=2, minutes=20):
    return np.full((models, minutes), float(rate_per_min))


def test_ample_static_capacity_meets_slo_and_overload_violates():
    config = FleetConfig((0.18, 0.18), (0.72, 0.72), total_replicas=20, seed=1)
    ok = simulate(flat(600), 5, FairShare(), config)  # 10 req/s, 10 replicas each
    assert ok.requests > 15_000
    # the first minute runs on one warm replica while the others cold-start
    assert ok.violation_rate < 0.1 and ok.minute_utility[2:].min() == 1.0
    tight = FleetConfig((0.18, 0.18), (0.72, 0.72), total_replicas=2, seed=1)
    bad = simulate(flat(600), 5, FairShare(), tight)
    assert bad.violation_rate > 0.9 and bad.lost_utility > 1.5


def test_faro_beats_aiad_on_a_step_up():
    rates = np.concatenate([np.full((2, 30), 120.0), np.full((2, 30), 900.0)], axis=1)
    config = FleetConfig((0.18, 0.18), (0.72, 0.72), total_replicas=16, seed=2)
    faro = simulate(rates, 10, FaroPolicy("fairsum"), config)
    aiad = simulate(rates, 10, AIAD(), config)
    assert faro.violation_rate < aiad.violation_rate
