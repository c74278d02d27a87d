"""MArk provisioning (Algorithm 1): FILL, scale-in, the exhaustive and peak baselines,
``edgeagent plan provision``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.coordinator.provisioning import (InstanceType, Provisioner, ProvisioningError,
                                            fill, optimal_cost, peak_cost,
                                            problem_from_dict, random_cases, simulate)

SMALL = InstanceType("small", 0.10, 40.0, launch_s=120)
BIG = InstanceType("big", 0.30, 180.0, launch_s=120)
GPU = InstanceType("gpu", 0.90, 800.0, launch_s=300, batch_ms=80)


def test_fill_takes_the_lowest_cost_per_request():
    # 160 req/s short for one step: one big serves 160 at $0.30/h (0.30/160 per req/s),
    # cheaper than a small's 0.10/40.
    assert fill([SMALL, BIG], [160.0], {}, 60.0) == {"small": 0, "big": 1}
    # 40 req/s: one small (0.10/40) beats a mostly idle big (0.30/40).
    assert fill([SMALL, BIG], [40.0], {}, 60.0) == {"small": 1, "big": 0}


def test_running_instances_carry_no_launch_overhead():
    pricey_launch = InstanceType("a", 0.10, 40.0, launch_s=3600)
    other = InstanceType("b", 0.09, 40.0, launch_s=3600)
    # b is cheaper per hour but a is running: its zero overhead wins.
    assert fill([pricey_launch, other], [40.0], {"a": 1}, 60.0) == {"a": 1, "b": 0}
    assert fill([pricey_launch, other], [40.0], {}, 60.0) == {"a": 0, "b": 1}


def test_redundant_instances_are_dropped():
    plan = fill([SMALL, BIG], [200.0, 200.0], {}, 60.0)
    capacity = plan["small"] * 40 + plan["big"] * 180
    assert capacity >= 200 and capacity - 40 < 200 or plan["small"] == 0


def test_slo_removes_slow_types_and_none_left_is_an_error():
    p = Provisioner([SMALL, GPU], slo_ms=50)
    assert [t.name for t in p.types] == ["small"]
    with pytest.raises(ProvisioningError):
        fill([], [10.0], {}, 60.0)


def test_cool_down_waits_for_six_plans():
    p = Provisioner([SMALL], step_s=60, scale_in_plans=6)
    assert p.step([200.0]).plan == {"small": 5}
    stops = []
    for _ in range(7):
        d = p.step([40.0])
        stops.append(sum(d.stop.values()))
    # the 200 req/s target is among the last six plans for five more steps
    assert stops == [0, 0, 0, 0, 0, 4, 0]
    assert p.running == {"small": 1}
    quick = Provisioner([SMALL], step_s=60)   # no cool-down by default
    quick.step([200.0])
    assert quick.step([40.0]).stop == {"small": 4}


def test_break_even_scale_in_keeps_what_the_forecast_needs_soon():
    # SMALL's overhead is 120 s of its price: an instance idle for one or two 60 s steps
    # before it is needed again is kept, one idle for three is stopped.
    for gap, kept in ((1, 4), (2, 4), (3, 0)):
        p = Provisioner([SMALL], step_s=60)
        p.step([200.0])
        d = p.step([40.0] * gap + [200.0])
        assert d.stop == ({} if kept else {"small": 4}), gap
        assert d.plan == {"small": 1 + kept}
    # the paper's rule (break_even=False) stops it whatever comes next
    p = Provisioner([SMALL], step_s=60, break_even=False)
    p.step([200.0])
    assert p.step([40.0, 200.0]).stop == {"small": 4}


def test_exhaustive_on_a_hand_case():
    # one step, 100 req/s: 1 big (0.30/h for a minute + 0.01 launch) vs 3 small.
    cost = optimal_cost([SMALL, BIG], [100.0], step_s=60)
    assert cost == pytest.approx(min(0.30 / 60 + BIG.overhead, 3 * (0.10 / 60 + SMALL.overhead)))


def test_greedy_vs_exhaustive_and_peak_on_small_cases():
    """Issue 12's target: within 5 % of the exhaustive optimum while meeting demand. Over
    these 28 cases (6-step perfect forecast) the default (break-even scale-in and the
    rollout step) is 0.3 % above on average, all 28 within 5 %, worst 3.8 %; the
    paper's greedy alone 5.6 % (worst 31.6 %), with the break-even scale-in 0.4 % (worst
    5.9 %), with the 6-plan cool-down 12.3 %, "always the peak" 17.3 %."""
    gaps, paper, peaks = [], [], []
    for types, demand in random_cases(28):
        best = optimal_cost(types, demand)
        cost, unmet = simulate(types, demand, horizon=6)
        assert unmet == 0 and cost >= best - 1e-12
        gaps.append(cost / best - 1)
        cost, unmet = simulate(types, demand, horizon=6, break_even=False, lookahead=False)
        assert unmet == 0
        paper.append(cost / best - 1)
        peaks.append(peak_cost(types, demand) / best - 1)
    assert np.mean(gaps) < 0.01 and max(gaps) < 0.05
    assert np.mean(gaps) < np.mean(paper) < np.mean(peaks)


def test_greedy_on_cases_it_was_not_developed_on():
    """200 further seeded cases (seeds 28-227): still within 5 % of the optimum in at
    least 95 % of them and 1 % above on average (the worst, seed 40, is 22.8 % over:
    recorded in the module docstring), demand always met."""
    gaps = []
    for types, demand in list(random_cases(228))[28:]:
        cost, unmet = simulate(types, demand, horizon=6)
        assert unmet == 0
        gaps.append(cost / optimal_cost(types, demand) - 1)
    assert np.mean(gaps) < 0.01 and sum(g <= 0.05 for g in gaps) >= 190


def test_exhaustive_is_exact_on_a_two_step_case():
    # 100 then 30 req/s: one big for both steps, one big then a new small, or three
    # small then one of them (the cheapest: no launch in the second step)
    cost = optimal_cost([SMALL, BIG], [100.0, 30.0], step_s=60)
    big = 2 * 0.30 / 60 + BIG.overhead
    switch = 0.30 / 60 + BIG.overhead + 0.10 / 60 + SMALL.overhead
    small = 3 * (0.10 / 60 + SMALL.overhead) + 0.10 / 60
    assert cost == pytest.approx(small) and small < min(big, switch)


def test_rollout_step_prices_the_whole_window():
    # case 2 of random_cases: a type cheap per request with a long launch (t2) is what
    # FILL picks at step 1, but a running t0 is needed again for the peak at the end;
    # the rollout step keeps it and the trace costs less
    types, demand = list(random_cases(3))[2]
    plain = simulate(types, demand, horizon=6, lookahead=False)[0]
    rolled = simulate(types, demand, horizon=6)[0]
    best = optimal_cost(types, demand)
    assert rolled < plain and rolled / best - 1 < 0.05 < plain / best - 1
    # a candidate is never short of the target step's demand
    p = Provisioner(types)
    for k in range(len(demand)):
        plan = p.step(demand[k:k + 6]).plan
        assert sum(t.capacity_rps * plan[t.name] for t in types) >= demand[k] - 1e-9


PROBLEM = {"types": [{"name": "c5.large", "price_per_hour": 0.085, "capacity_rps": 40,
                      "launch_s": 120},
                     {"name": "c5.2xlarge", "price_per_hour": 0.34, "capacity_rps": 180,
                      "launch_s": 150},
                     {"name": "p2.xlarge", "price_per_hour": 0.9, "batch_size": 64,
                      "batch_ms": 80, "launch_s": 300}],
           "slo_ms": 200, "step_s": 60, "forecast": [300, 420, 520, 500, 380, 250],
           "running": {"c5.large": 3}, "recent_targets": [250, 280]}


def test_cli_provision(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROBLEM))
    r = CliRunner().invoke(main, ["plan", "provision", "--problem", str(path), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out) == {"plan", "launch", "stop", "cost_per_hour_before",
                        "cost_per_hour_after", "target_rps", "held_rps"}
    assert out["plan"] == {"c5.large": 3, "c5.2xlarge": 1, "p2.xlarge": 0}
    assert out["launch"] == {"c5.2xlarge": 1} and out["stop"] == {}
    assert out["cost_per_hour_before"] == pytest.approx(0.255)
    assert out["cost_per_hour_after"] == pytest.approx(0.595)
    text = CliRunner().invoke(main, ["plan", "provision", "--problem", str(path)])
    assert text.exit_code == 0 and "$0.255/h -> $0.595/h" in text.output
    path.write_text(json.dumps({**PROBLEM, "forecast": []}))
    bad = CliRunner().invoke(main, ["plan", "provision", "--problem", str(path)])
    assert bad.exit_code != 0 and "forecast" in bad.output


@pytest.mark.parametrize("change", [{"types": []}, {"tau": 9}, {"running": {"x": 1}},
                                    {"slo_ms": 10, "types": PROBLEM["types"][2:]},
                                    {"step_s": 0}, {"scale_in_plans": 0},
                                    {"running": {"c5.large": True}}])
def test_bad_problems(change):
    with pytest.raises(ProvisioningError):
        problem_from_dict({**PROBLEM, **change})
