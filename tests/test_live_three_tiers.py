"""Three tiers, live against simulated: a short trace over real ONNX models that a real
agent pulls over HTTP (a Range server that waits each file's download seconds) into its
disk tier and loads into memory, with LRU on both tiers, and the same trace through
``simulate --queueing --disk-capacity`` with the models' measured profiles. The pulls
and loads agree within 25 %: a miss downloading every time, or a disk keeping nothing,
is far outside that, while a busy box's timing (loads slowed, pulls bunched) and the
agent's memory measurements (which count a pull's buffers in flight) move a few
decisions; the live mean response is not below the simulated one (less 15 %). The
longer replay with the penalty-aware policy, and its floors (5 %, 15 %), is
``bench/pull.py replay --live``."""

import numpy as np
import pytest

from cachepolicies.simulator import simulate
from tests.helpers import real_models, replay_three_tiers, three_tier_workload


def test_live_three_tiers_agree_with_the_simulator(tmp_path):
    remote = tmp_path / "remote"
    # room on disk for 5 of the 6 models' files: a pull finds the disk held by others
    # (pulling, or loading, which a busy box's slow loads make many) only when all
    # five are; the live agent refuses it then (507), the simulator lets it through
    work = three_tier_workload(2, models=6, requests=40, rate=3.0, zipf=0.6, in_memory=2,
                               on_disk=5, download=(0.05, 0.4),
                               measured=real_models(remote, models=6))
    sim = simulate(work.trace, work.profiles, work.memory_bytes, "lru", queueing=256,
                   disk_capacity=work.disk_bytes)
    assert sim.downloads > 10 and sim.disk_evictions > 5  # the disk does bite
    assert sim.misses > sim.downloads  # and so does memory: loads from disk too

    results, listing, served = replay_three_tiers(work, "lru", remote, tmp_path / "live",
                                                  max_concurrent_pulls=2)
    assert [status for _, status in results] == [200] * len(results)
    pulls = [s for s in served if s.sent > 1]  # not the sources' 1-byte size probes
    assert len(pulls) == pytest.approx(sim.downloads, rel=0.25)
    assert {s.sent for s in pulls} == set(work.profiles.disk_bytes.tolist())  # whole files
    loads = sum(m["loads"] for m in listing)
    assert loads == pytest.approx(sim.misses, rel=0.25)
    live_mean = float(np.mean([seconds for seconds, _ in results]))
    # pulls wait for one of the two slots live, never in the simulator: only a lower bound
    assert live_mean >= 0.85 * sim.mean_response_seconds, (live_mean, sim)
