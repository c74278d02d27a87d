"""The live agent's mean response time against ``simulate --queueing``'s on the same
trace (tests/test_live_vs_simulator.py's workload: Zipf over 12 synthetic models,
Poisson arrivals, a budget of 35 % of the models, replayed in real time over HTTP on an
agent in this process). Prints both, their ratio and the counts; not a test.

Target: live within 15 % of the simulated mean (the test held it as an assertion until a
loaded box broke it; the test keeps the counts within 5 % and the live mean not below
the simulated one less 15 %). Run it on an otherwise idle machine.

    .venv/bin/python bench/live_vs_simulator.py [--policy cremebrulee --policy lru]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachepolicies.simulator import simulate  # noqa: E402
from cachepolicies.twin import Queueing  # noqa: E402
from tests.helpers import (AgentServer, add_workload_models, replay_live,  # noqa: E402
                           zipf_workload)

TARGET = 0.15


def run(policy: str, work: Path) -> None:
    from agent.config import AgentConfig

    names, sizes, loads, execs, trace, profiles = zipf_workload()
    repo = work / policy / "models"
    add_workload_models(repo, names, sizes, loads, execs)
    budget = int(sizes.sum() * 0.35)
    agent = AgentServer(AgentConfig(repository=repo, data_dir=work / policy / "data",
                                    cpu_budget=budget, infer_threads=2, policy=policy,
                                    load_concurrency=32), budgets={"cpu": budget})
    try:
        results = asyncio.run(replay_live(agent.url, trace, names))
        listing = agent.request("GET", "/v1/cache")[2]
    finally:
        agent.close()
    live_mean = float(np.mean([seconds for seconds, _ in results]))
    sim = simulate(trace, profiles, budget, policy,
                   queueing=Queueing(workers=64, load_concurrency=32))
    ratio = live_mean / sim.mean_response_seconds
    print(f"{policy:<12} live {live_mean:.3f} s  simulated {sim.mean_response_seconds:.3f} s"
          f"  ratio {ratio:.3f} (target within {1 - TARGET:.2f}-{1 + TARGET:.2f}: "
          f"{'ok' if abs(ratio - 1) <= TARGET else 'MISSED'})  loads "
          f"{sum(m['loads'] for m in listing)} / {sim.misses}, evictions "
          f"{sum(m['evictions'] for m in listing)} / {sim.evictions}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append", help="default: cremebrulee and lru")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policy or ["cremebrulee", "lru"]:
            run(policy, Path(tmp))


if __name__ == "__main__":
    main()
