"""Three tiers, live against simulated: a short trace over synthetic models (their size,
load and run times set) that a real agent pulls over HTTP (files that a Range server
sends after each model's download seconds) into its disk tier and loads into memory,
and the same trace through ``simulate --queueing --disk-capacity``. Pulls, bytes
pulled and loads agree within 10 % (the bench's floor is 5 % on a longer trace); the
live mean response is not below the simulated one (less 15 %; a loaded box only adds
to it; the twin too has the agent's two pull slots). The longer replay, and its floors, is ``bench/pull.py replay --live``."""

import numpy as np
import pytest

from cachepolicies.simulator import simulate
from cachepolicies.twin import Queueing
from tests.helpers import replay_three_tiers, three_tier_workload


# both with the slow tests (make test-slow, run by CI); the quick suite serves sourced models
# live in tests/test_disk_tier.py and checks the tier rules in tests/test_tiers.py
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lru", "cremebrulee"])
def test_live_three_tiers_agree_with_the_simulator(tmp_path, policy):
    work = three_tier_workload(1, models=10, requests=60, rate=5.0, in_memory=3, on_disk=6,
                               download=(0.05, 0.4))
    sim = simulate(work.trace, work.profiles, work.memory_bytes, policy,
                   queueing=Queueing(workers=64, load_concurrency=32, max_concurrent_pulls=2),
                   disk_capacity=work.disk_bytes)
    assert sim.downloads > 10 and sim.disk_evictions > 5  # the disk does bite
    assert sim.misses > sim.downloads  # and so does memory: loads from disk too

    # two pulls at once: with the loads they feed, they may hold the whole disk; a pull
    # that finds it so waits for room (as the simulator lets it through): no failure.
    results, listing, served = replay_three_tiers(work, policy, tmp_path,
                                                  max_concurrent_pulls=2)
    failed = [status for _, status in results if status != 200]
    assert failed == [], failed
    pulls = [s for s in served if s.sent > 1]  # not the sources' 1-byte size probes
    assert len(pulls) == pytest.approx(sim.downloads, rel=0.1)
    assert sum(s.sent for s in pulls) == pytest.approx(sim.bytes_downloaded, rel=0.1)
    assert sum(m["loads"] for m in listing) == pytest.approx(sim.misses, rel=0.1)
    live_mean = float(np.mean([seconds for seconds, _ in results]))
    assert live_mean >= 0.85 * sim.mean_response_seconds, (live_mean, sim)
