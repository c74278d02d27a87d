"""Batch tuning without sleeping: AIMD and MArk's window rule driven with recorded
latencies of a synthetic profile (T(b) = base + per_item × b) on an injected clock."""

import math
import random

import numpy as np
import pytest

from agent.node.batch_tuner import (WAIT_GAIN, AimdLimit, BatchTuner, TunerSettings,
                                    delay_window)
from agent.node.latency_stats import BatchProfile, LatencyWindow, RateMeter


def n_star(budget, base, per_item):
    return math.floor((budget - base) / per_item + 1e-9)


def drive_full_batches(tuner, base, per_item, batches, noise=0.0, rng=None, now=0.0):
    """Steady load: every batch is full at the current limit. Returns the limits seen."""
    seen = []
    for _ in range(batches):
        size = tuner.limit
        t = base + per_item * size
        if noise:
            t *= 1 + rng.uniform(-noise, noise)
        now += t
        tuner.observe_batch(now, size, t, full=True)
        seen.append(tuner.limit)
    return seen, now


PROFILES = [  # base s, per_item s, slo s, step, max_batch_size
    (0.010, 0.004, 0.120, 2, 64),
    (0.005, 0.001, 0.100, 1, 128),
    (0.020, 0.0005, 0.080, 4, 256),
    (0.001, 0.002, 0.050, 2, 64),
    (0.030, 0.010, 0.100, 1, 64),
]


@pytest.mark.parametrize("base, per_item, slo, step, max_batch", PROFILES)
def test_aimd_settles_within_one_step_of_n_star_and_stays(base, per_item, slo, step,
                                                          max_batch):
    settings = TunerSettings(max_batch_size=max_batch, slo=slo, aimd_step=step)
    tuner = BatchTuner(settings)
    target = min(n_star(settings.budget, base, per_item), max_batch)
    seen, now = drive_full_batches(tuner, base, per_item, 300)
    assert abs(tuner.limit - target) <= step, (seen[-20:], target)
    steady, _ = drive_full_batches(tuner, base, per_item, 2000, now=now)
    assert all(abs(limit - target) <= step for limit in steady), (min(steady), max(steady))
    assert max(seen + steady) <= max_batch


def test_aimd_with_noisy_latencies_stays_around_n_star():
    settings = TunerSettings(max_batch_size=64, slo=0.120, aimd_step=2)
    tuner, rng = BatchTuner(settings), random.Random(7)
    target = n_star(settings.budget, 0.010, 0.004)  # 12
    _, now = drive_full_batches(tuner, 0.010, 0.004, 300, noise=0.03, rng=rng)
    steady, _ = drive_full_batches(tuner, 0.010, 0.004, 3000, noise=0.03, rng=rng, now=now)
    within = sum(abs(limit - target) <= 2 for limit in steady) / len(steady)
    assert within >= 0.9 and sorted(steady)[len(steady) // 2] in range(target - 2, target + 1)


def test_limit_follows_the_model_when_it_slows_down_and_speeds_up():
    settings = TunerSettings(max_batch_size=128, slo=0.100, aimd_step=2)
    tuner = BatchTuner(settings)
    _, now = drive_full_batches(tuner, 0.005, 0.001, 300)
    assert abs(tuner.limit - 45) <= 2
    _, now = drive_full_batches(tuner, 0.005, 0.002, 300, now=now)   # twice as slow
    assert abs(tuner.limit - n_star(0.05, 0.005, 0.002)) <= 2          # 22
    _, now = drive_full_batches(tuner, 0.005, 0.001, 300, now=now)   # fast again
    assert abs(tuner.limit - 45) <= 2


def test_aimd_rules_increase_only_on_full_batches_and_cut_by_ten_percent():
    aimd = AimdLimit(max_size=100, budget=0.05, step=3, start=40)
    assert aimd.observe(10, 0.01, full=False) == 40   # not full: no evidence
    assert aimd.observe(40, 0.01, full=True) == 43    # full, within budget: + step
    assert aimd.observe(43, 0.06, full=True) == 38    # over budget: floor(43 × 0.9)
    assert aimd.ceiling == 42
    assert aimd.observe(38, 0.02, full=True) == 41
    assert aimd.observe(41, 0.02, full=True) == 42    # up to the ceiling, not past it
    assert aimd.observe(42, 0.02, full=True) == 42    # no profile: no evidence of room
    small = AimdLimit(max_size=100, budget=0.05, step=1, start=5)
    assert small.observe(5, 0.09, full=True) == 4     # below 10 the cut is still >= 1
    assert small.observe(200, 0.09, full=True) == 4   # an oversized request: no cut
    capped = AimdLimit(max_size=8, budget=1.0, step=5)
    for _ in range(5):
        capped.observe(capped.limit, 0.001, full=True)
    assert capped.limit == 8


def test_one_stalled_first_batch_does_not_pin_the_limit_at_one():
    # The CI failure this guards: the machine stalled during the model's very first
    # batch (size 1, 150 ms against a 60 ms budget), which set a ceiling of 1; with only
    # size 1 ever measured there was no line to show room, and the limit stayed at 1.
    # n* = floor((60 - 10) / 4) = 12.
    tuner = BatchTuner(TunerSettings(max_batch_size=64, slo=0.120, aimd_step=2))
    tuner.observe_batch(0.15, 1, 0.150, full=True)
    assert tuner.limit == 1 and tuner.aimd.ceiling == 1
    seen, _ = drive_full_batches(tuner, 0.010, 0.004, 200, now=0.15)
    assert abs(seen[-1] - 12) <= 2, seen
    # a model too slow for a second row (50 ms at 1, 70 ms at 2) settles at 1 after
    # a few probes (the line needs a refit to see the stall for an outlier), then stays
    slow = BatchTuner(TunerSettings(max_batch_size=64, slo=0.120, aimd_step=2))
    slow.observe_batch(0.15, 1, 0.150, full=True)
    seen, _ = drive_full_batches(slow, 0.030, 0.020, 200, now=0.15)
    assert set(seen[-180:]) == {1}, seen
    assert slow.aimd.decreases < 10, slow.aimd.decreases   # the probes stop


def linear_profile(base, per_item, sizes=(1, 2, 4, 8, 16, 32), samples=5):
    profile = BatchProfile()
    for b in sizes:
        for _ in range(samples):
            profile.observe(b, base + per_item * b)
    return profile


def test_profile_fits_a_line_and_predicts_unseen_sizes():
    profile = linear_profile(0.02, 0.001)
    base, per_item = profile.line()
    assert base == pytest.approx(0.02) and per_item == pytest.approx(0.001)
    assert profile.predict(100) == pytest.approx(0.12)
    assert profile.predict(4) == pytest.approx(0.024)
    assert BatchProfile().predict(3) is None
    one = BatchProfile()
    one.observe(5, 0.01)
    assert one.predict(50) == 0.01 and one.line() is None  # optimistic until a 2nd size
    # ... both ways: a smaller size scaled down, a lower bound of any line through (5, 10 ms)
    # with base, per_item >= 0 (not the 5-row median: 60,000 rows must not price 32)
    assert one.predict(1) == pytest.approx(0.002) and one.predict(0) == 0.0
    big = BatchProfile()
    for _ in range(3):
        big.observe(60_000, 0.15)
    assert big.predict(32) == pytest.approx(0.15 * 32 / 60_000)
    assert big.predict(120_000) == 0.15 and big.predict(60_000) == 0.15
    for _ in range(40):  # a window of recent samples: the figures follow a change
        profile.observe(4, 0.05)
    assert profile.typical(4) == pytest.approx(0.05) == profile.means()[4]
    profile.observe(4, 5.0)  # one stalled batch: reported in the mean, not predicted
    assert profile.predict(4) == pytest.approx(0.05) and profile.means()[4] > 0.15


def test_predict_high_is_the_measured_time_at_the_slo_percentile():
    rng = np.random.default_rng(3)
    profile = BatchProfile(percentile=90)
    profile.observe(8, 0.010)
    assert profile.predict_high(8) == profile.predict(8)  # too few samples: typical
    times = 0.010 * (1 + rng.exponential(0.1, 400))       # a right-skewed batch time
    for t in times:
        profile.observe(8, float(t))
    expected = np.percentile(times[-BatchProfile.EXCESSES:], 90)
    assert profile.predict_high(8) == pytest.approx(expected, rel=0.1)
    profile.observe(1, 0.0002)  # a tiny batch: its high time is not blown up tenfold
    assert profile.predict_high(1) < 0.0002 + 0.005
    assert profile.predict(8) < profile.predict_high(8)
    profile.percentile = 50   # a median SLO plans with about the median
    assert profile.predict_high(8) == pytest.approx(profile.predict(8), rel=0.05)


@pytest.mark.parametrize("base, per_item, rate, waits", [
    (0.020, 0.001, 500.0, True),    # high fixed cost, requests every 2 ms: wait
    (0.0002, 0.002, 500.0, False),  # low fixed cost: never worth waiting
    (0.020, 0.001, 20.0, False),    # high fixed cost but requests every 50 ms
])
def test_mark_window_rule(base, per_item, rate, waits):
    profile = linear_profile(base, per_item)
    rt_max, window_max = 0.16, 0.1
    b, w = delay_window(profile, rate, 64, rt_max, window_max)
    assert (w > 0) == waits and (b > 1) == waits
    if waits:
        t1 = profile.predict(1)
        assert w == pytest.approx((b - 1) / rate)
        assert w + profile.predict(b) <= rt_max
        assert w + profile.predict(b) <= (1 - WAIT_GAIN) * b * t1
        nxt = b + 1
        w2 = (nxt - 1) / rate
        assert (w2 + profile.predict(nxt) > rt_max or w2 > window_max
                or w2 + profile.predict(nxt) > (1 - WAIT_GAIN) * nxt * t1 or nxt > 64)


def test_mark_window_without_measurements_or_arrivals_is_zero():
    assert delay_window(BatchProfile(), 500.0, 64, 0.1, 0.1) == (1, 0.0)
    assert delay_window(linear_profile(0.02, 0.001), 0.0, 64, 0.1, 0.1) == (1, 0.0)
    assert delay_window(linear_profile(0.02, 0.001), 500.0, 64, 0.1, 0.0) == (1, 0.0)


def test_tuner_finds_by_itself_whether_waiting_pays():
    """Replay a load with an injected clock: arrivals at 400/s, batches of what queued."""
    def replay(base, per_item):
        tuner = BatchTuner(TunerSettings(max_batch_size=64, slo=0.2))
        now, queued = 0.0, 0
        for _ in range(400):
            for _ in range(8):
                now += 1 / 400
                tuner.observe_arrival(now)
                queued += 1
            size = min(queued, tuner.limit)
            queued -= size
            t = base + per_item * size
            tuner.observe_batch(now + t, size, t, full=queued > 0)
        tuner.retune(now)
        return tuner
    high, low = replay(0.020, 0.001), replay(0.0003, 0.002)
    assert high.window > 0 and high.target > 1
    assert low.window == 0 and low.target == 1


def test_static_tuner_uses_the_configured_limit_and_window():
    tuner = BatchTuner(TunerSettings(max_batch_size=16, slo=0.1, window_max=0.005,
                                     adaptive=False))
    tuner.observe_batch(1.0, 16, 0.5, full=True)  # way over budget: static ignores it
    assert (tuner.limit, tuner.target, tuner.window) == (16, 16, 0.005)


def test_rate_meter_and_latency_window():
    meter = RateMeter(tau=1.0)
    t = 0.0
    for _ in range(1000):
        t += 0.01
        meter.add(t)
    assert meter.rate(t) == pytest.approx(100, rel=0.02)
    assert meter.rate(t + 1) == pytest.approx(100 / math.e, rel=0.03)
    assert RateMeter().rate(5.0) == 0.0
    window = LatencyWindow(size=100)
    assert window.percentile(99) is None
    for i in range(1, 201):
        window.add(i / 1000)
    assert len(window) == 100
    p = window.percentiles((50, 99))
    assert p[50] == pytest.approx(0.1505) and p[99] == pytest.approx(0.199, abs=1e-3)
