"""``bench/forecast_policy.py --informed`` (issue 40): the ranking given what no online
policy knows is replayed in plain Python, so its figure is only as good as that replay.
With the oracle's boundary the replay must take exactly the compiled oracle's loads, on
a periodic workload at three capacities; given each timer's next firing and the other
models' true rates it must beat the online forecast, which knows less."""

from __future__ import annotations

import numpy as np
import pytest

from bench.forecast_policy import (ORACLE, informed_boundary, oracle_boundary, periodic,
                                   ranked_replay)
from cachepolicies.simulator import simulate
from cachepolicies.traces import cremebrulee_profiles_path, read_profiles


@pytest.fixture(scope="module")
def workload():
    return periodic(read_profiles(cremebrulee_profiles_path()), 0, 0.5, "uniform")


@pytest.mark.parametrize("share", [0.05, 0.1, 0.2])
def test_the_replay_with_the_oracles_boundary_is_the_oracle(workload, share):
    trace, profiles = workload
    capacity = int(share * profiles.size_bytes.sum())
    oracle = simulate(trace, profiles, capacity, ORACLE)
    loads = ranked_replay(trace, profiles, capacity, oracle_boundary)
    assert int(loads.sum()) == oracle.misses
    assert float(loads @ profiles.penalty_seconds) == pytest.approx(
        oracle.load_delay_seconds, rel=1e-12)


def test_knowing_the_timers_and_the_rates_beats_the_online_forecast(workload):
    trace, profiles = workload
    capacity = int(0.2 * profiles.size_bytes.sum())
    boundary = informed_boundary(trace, len(profiles))
    loads = ranked_replay(trace, profiles, capacity, boundary)
    forecast = simulate(trace, profiles, capacity, "cremebrulee-forecast").load_delay_seconds
    assert loads @ profiles.penalty_seconds < forecast
    requested = np.bincount(trace.model_ids, minlength=len(profiles)) > 0
    assert (loads[requested] >= 1).all() and not loads[~requested].any()
