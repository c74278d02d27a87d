"""The live penalty is the one docs/agent.md and ``cachepolicies.pool.miss_penalty``
describe: load + the cold first run's surplus over a warm run (+ the download while the
files are off disk), with the warm run the serving layer measured. The policy's penalty
of a real ONNX model is compared with ``miss_penalty`` and with what the simulator makes
of the same measurements (the node's own profile line, as ``simulate --from`` reads it)."""

import numpy as np
import pytest

from cachepolicies.pool import miss_penalty
from cachepolicies.traces import make_profiles
from tests.helpers import add_mlp, call_model, start_serving, stop_serving


async def test_the_live_penalty_is_miss_penalty_of_the_measured_runs(repo):
    add_mlp(repo, "m", inputs=4, hidden=64, layers=3, outputs=2)
    cache, serving = await start_serving(repo)
    x = np.full((1, 4), 0.5, np.float32)
    for _ in range(40):  # one row at a time: warm runs the serving layer measures
        await call_model(serving, "m", x)
    entry = cache.entry("m")
    account, policy = entry.account, cache.pools["cpu"].policy
    warm = account.warm_run_seconds
    assert warm is not None and warm > 0  # told to the cache once measured: repriced
    live = policy.penalty_of(entry.id)
    assert live == pytest.approx(float(miss_penalty(
        account.load_seconds, account.first_run_seconds, warm)), abs=1e-9)
    # not the whole cold first run, as before the warm run reached the penalty
    assert live < account.load_seconds + account.first_run_seconds

    await cache.evict("m")  # the next load is priced with what its last residency ran
    await cache.ensure_loaded("m")
    live = policy.penalty_of(entry.id)
    warm = serving.runtime(entry).warm_run_seconds()
    assert account.warm_run_seconds == warm
    assert live == pytest.approx(float(miss_penalty(
        account.load_seconds, account.first_run_seconds, warm)), abs=1e-9)
    assert cache.penalty(entry) == pytest.approx(live, abs=1e-9)

    # the simulator, on the node's own profile line, prices a miss the same
    line = next(p for p in serving.profiles() if p["model"] == "m:1")
    profiles = make_profiles(["m:1"], [line["size_bytes"]], [line["load_seconds"]],
                             [line["exec_seconds"]], [line["first_exec_seconds"]])
    assert profiles.penalty_seconds[0] == pytest.approx(live, abs=2e-6)
    await stop_serving(cache, serving)
