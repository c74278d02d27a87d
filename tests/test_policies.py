"""Unit tests of the eviction policies through their four verbs."""

from __future__ import annotations

import math

import pytest

from cachepolicies import InsufficientSpace, POLICY_NAMES, make_policy
from cachepolicies.rates import CumulativeRate, DecayedRate

TABLE_I_TRACE = [0, 1, 2, 1, 0, 2, 1, 0, 2, 0, 2, 1, 0, 2]


def run_unit_cache(policy, trace, capacity, penalty=lambda k: 1.0):
    """Drive ``policy`` over ``trace`` with unit-size models; return (misses, cost, evicted)."""
    used = misses = 0
    cost = 0.0
    evicted = []
    for t, key in enumerate(trace):
        policy.record_access(key, float(t))
        if key in policy:
            continue
        misses += 1
        cost += penalty(key)
        victims = policy.choose_victims(used + 1 - capacity, float(t))
        for victim in victims:
            policy.remove(victim)
            used -= 1
        evicted.append(victims)
        policy.admit(key, 1, penalty(key), float(t))
        used += 1
    return misses, cost, evicted


@pytest.mark.parametrize(
    "name, misses, cost", [("beladymin", 8, 17), ("cremebrulee-oracle", 8, 13)]
)
def test_cremebrulee_paper_table_one(name, misses, cost):
    policy = make_policy(name, future=TABLE_I_TRACE)
    got = run_unit_cache(policy, TABLE_I_TRACE, capacity=2, penalty=lambda k: k + 1)
    assert got[:2] == (misses, cost)


def test_table_one_eviction_sequence_of_the_oracle():
    policy = make_policy("cremebrulee-oracle", future=TABLE_I_TRACE)
    _, _, evicted = run_unit_cache(policy, TABLE_I_TRACE, 2, penalty=lambda k: k + 1)
    # The paper's "Evict" column for CremeBrulee-oracle (misses with a full cache).
    assert [v for v in evicted if v] == [[0], [1], [0], [1], [0], [1]]


def test_oracle_refuses_a_request_that_is_not_the_future():
    policy = make_policy("beladymin", future=[1, 2, 3])
    policy.record_access(1, 0.0)
    with pytest.raises(ValueError, match="out of step at request 1"):
        policy.record_access(3, 1.0)


def test_oracle_needs_a_future():
    with pytest.raises(ValueError, match="oracle"):
        make_policy("cremebrulee-oracle")


def test_unknown_policy_and_parameter_are_named():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(ValueError, match="has no parameter 'speed'"):
        make_policy("lru:speed=3")
    with pytest.raises(ValueError, match="half_life='x' is not a valid float"):
        make_policy("cremebrulee:half_life=x")
    with pytest.raises(ValueError, match="unknown rate estimator"):
        make_policy("cremebrulee:rate=hourly")
    with pytest.raises(ValueError, match="expected key=value"):
        make_policy("cremebrulee:rate")


def test_policy_parameters_are_parsed():
    policy = make_policy("cremebrulee:rate=decayed,half_life=30")
    assert (policy.rate, policy.half_life) == ("decayed", 30.0)
    policy.record_access("a", 0.0)  # and the half-life is the one the estimate uses
    assert policy.request_rate("a", 60.0) == pytest.approx(policy.request_rate("a", 30.0) / 2)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_insufficient_space_when_nothing_is_evictable(name):
    policy = make_policy(name, future=["a", "b", "c"])
    for t, key in enumerate(["a", "b"]):
        policy.record_access(key, float(t))
        policy.admit(key, 10, 1.0, float(t))
    policy.record_access("c", 2.0)
    with pytest.raises(InsufficientSpace) as info:
        policy.choose_victims(15, 2.0, evictable=lambda k: k != "a")
    assert info.value.freeable_bytes == 10
    assert policy.choose_victims(15, 2.0) and len(policy) == 2  # nothing was removed


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_admit_twice_and_bad_sizes_are_errors(name):
    policy = make_policy(name, future=["a"])
    policy.record_access("a", 0.0)
    with pytest.raises(ValueError, match="size"):
        policy.admit("a", -1, 1.0, 0.0)
    with pytest.raises(ValueError, match="penalty"):
        policy.admit("a", 1, -1.0, 0.0)
    policy.admit("a", 1, 1.0, 0.0)
    with pytest.raises(ValueError, match="already resident"):
        policy.admit("a", 1, 1.0, 0.0)
    policy.remove("a")
    with pytest.raises(KeyError):
        policy.remove("a")


def test_lru_evicts_least_recent_in_order_until_enough():
    policy = make_policy("lru")
    for t, (key, size) in enumerate([("a", 5), ("b", 3), ("c", 8)]):
        policy.record_access(key, float(t))
        policy.admit(key, size, 1.0, float(t))
    policy.record_access("a", 3.0)  # b is now the oldest, then c, then a
    assert policy.choose_victims(2, 4.0) == ["b"]
    assert policy.choose_victims(4, 4.0) == ["b", "c"]


def test_cremebrulee_keeps_costly_small_popular_models():
    policy = make_policy("cremebrulee:rate=cumulative")
    # cheap: popular but cheap to reload; costly: same rate, 20x penalty
    for t in range(4):
        for key in ("cheap", "costly"):
            policy.record_access(key, float(t))
    policy.admit("cheap", 100, 0.5, 4.0)
    policy.admit("costly", 100, 10.0, 4.0)
    assert policy.choose_victims(50, 5.0) == ["cheap"]
    assert policy.priority("costly", 5.0) > policy.priority("cheap", 5.0)


def test_cremebrulee_trims_eviction_set_to_the_largest_that_suffice():
    policy = make_policy("cremebrulee:rate=cumulative")
    # Lowest utility first: s1 (size 10), s2 (size 10), big (size 30); need 25.
    for key, size, penalty in [("s1", 10, 0.1), ("s2", 10, 0.2), ("big", 30, 1.0), ("keep", 10, 99)]:
        policy.record_access(key, 0.0)
        policy.admit(key, size, penalty, 0.0)
    assert policy.choose_victims(25, 1.0) == ["big"]


def test_lru_does_not_trim_its_eviction_order():
    policy = make_policy("lru")
    for t, (key, size) in enumerate([("s1", 10), ("s2", 10), ("big", 30)]):
        policy.record_access(key, float(t))
        policy.admit(key, size, 1.0, float(t))
    assert policy.choose_victims(25, 5.0) == ["s1", "s2", "big"]


def test_gdsf_inflation_lets_new_entries_overtake_old_frequent_ones():
    policy = make_policy("gdsf")
    policy.record_access("old", 0.0)
    policy.admit("old", 1, 0.9, 0.0)
    for t in range(1, 4):
        policy.record_access("old", float(t))  # freq 4 -> priority 3.6
    evicted = []
    for i, key in enumerate(["x1", "x2", "x3", "x4", "x5"]):  # capacity: 2 entries
        policy.record_access(key, 10.0 + i)
        if len(policy) == 2:
            (victim,) = policy.choose_victims(1, 10.0 + i)
            policy.remove(victim)
            evicted.append(victim)
        policy.admit(key, 1, 1.0, 10.0 + i)
    # Each eviction raises L by one; by x5 a fresh entry (L + 1 = 4) outranks "old".
    assert evicted == ["x1", "x2", "x3", "old"]


def test_random_is_seeded():
    def victims(seed):
        policy = make_policy("random", seed=seed)
        for i in range(20):
            policy.record_access(i, 0.0)
            policy.admit(i, 1, 1.0, 0.0)
        return policy.choose_victims(5, 1.0)

    assert victims(1) == victims(1)
    assert victims(1) != victims(2)


def test_decayed_rate_halves_after_one_half_life_and_keeps_order():
    rates = DecayedRate(half_life=10.0)
    for t in (0.0, 1.0, 2.0):
        rates.record("a", t)
    rates.record("b", 5.0)
    r1 = rates.rate("a", 20.0)
    assert rates.rate("a", 30.0) == pytest.approx(r1 / 2)
    # The log score ranks keys as the rate does at any later time.
    for now in (6.0, 50.0, 500.0):
        assert (rates.log_score("a") > rates.log_score("b")) == (
            rates.rate("a", now) > rates.rate("b", now)
        )
    # Huge timestamps stay finite (log domain).
    rates.record("c", 1e9)
    assert math.isfinite(rates.log_score("c"))


def test_cumulative_rate_counts_since_first_request():
    rates = CumulativeRate()
    for t in (100.0, 110.0, 120.0):
        rates.record("a", t)
    assert rates.rate("a", 130.0) == pytest.approx(3 / 30)
    assert rates.rate("never", 130.0) == 0.0


def _timer_and_steady(spec: str):
    """``timer`` requested every 60 s (0 … 240), ``steady`` at irregular times, more
    often; both cost the same to reload."""
    policy = make_policy(spec)
    for t in range(0, 241, 10):
        if t % 60 == 0:
            policy.record_access("timer", float(t))
        if t in (20, 50, 100, 120, 170, 200, 230):
            policy.record_access("steady", float(t))
    for key in ("timer", "steady"):
        policy.admit(key, 100, 2.0, 240.0)
    return policy


def test_forecast_keeps_a_timer_that_is_about_to_fire():
    # Just before the timer's next firing (300 s) it is worth more than the steady model,
    # which CremeBrulee, ranking by rate alone, keeps instead.
    crm, forecast = _timer_and_steady("cremebrulee"), _timer_and_steady("cremebrulee-forecast")
    assert crm.choose_victims(50, 290.0) == ["timer"]
    assert forecast.choose_victims(50, 290.0) == ["steady"]
    assert forecast.period("timer") == pytest.approx(60.0)
    assert forecast.period("steady") == 0.0
    assert forecast.priority("timer", 290.0) == pytest.approx(2.0 / 100 / 10.0)
    # Right after a firing its next use is a period away: worth less, by as much.
    forecast.record_access("timer", 300.0)
    assert forecast.priority("timer", 301.0) == pytest.approx(2.0 / 100 / 59.0)


def test_forecast_detects_jittered_periods_and_forgets_broken_ones():
    policy = make_policy("cremebrulee-forecast")  # tolerance 5 % of the period, confirm 3
    for t in (0.0, 100.0, 198.0, 301.0):  # gaps within 3 % of their mean
        policy.record_access("t", t)
    assert policy.period("t") == 0.0  # two gaps matched the first: not yet three
    policy.record_access("t", 399.0)
    assert policy.period("t") == pytest.approx((100 + 98 + 103 + 98) / 4)
    policy.admit("t", 10, 1.0, 399.0)
    due = 399.0 + policy.period("t")
    assert policy.priority("t", due - 10) == pytest.approx(1.0 / 10 / 10)
    # Overdue by more than the tolerance (a skipped firing): back to the rate.
    late = due + 0.06 * policy.period("t")
    assert policy.priority("t", late) == pytest.approx(policy.request_rate("t", late) / 10)
    policy.record_access("t", due + 200.0)  # a gap far from the period: not periodic
    assert policy.period("t") == 0.0
    assert policy.choose_victims(5, due + 201.0) == ["t"]


def test_forecast_rates_are_unbiased_while_the_decayed_count_warms_up():
    # A steady model requested twice every 2 s from t = 0 (gaps 0.5 and 1.5 s: no
    # period): the decayed count has seen 100 s of a 600 s half-life, so it holds
    # 1 − 2^(−100/600) of the steady state's; the forecast scales that back to ~1
    # request/s, CremeBrulee does not.
    crm, forecast = make_policy("cremebrulee"), make_policy("cremebrulee-forecast")
    for t in sorted([*range(0, 100, 2), *(t + 0.5 for t in range(0, 100, 2))]):
        for policy in (crm, forecast):
            policy.record_access("steady", float(t))
    assert forecast.request_rate("steady", 100.0) == pytest.approx(1.0, rel=0.02)
    assert crm.request_rate("steady", 100.0) == pytest.approx(1 - 2 ** (-100 / 600), rel=0.02)
    for policy in (crm, forecast):
        policy.admit("steady", 10, 2.0, 100.0)
    assert forecast.priority("steady", 100.0) == pytest.approx(
        2.0 * forecast.request_rate("steady", 100.0) / 10)


def test_forecast_merges_periodic_and_rate_ranked_models_by_utility():
    policy = make_policy("cremebrulee-forecast:rate=cumulative")
    for t in range(5):  # p0, p1: period 10 s; r0..r2: 4 requests each, no period
        for key in ("p0", "p1"):
            policy.record_access(key, 10.0 * t)
        for i, key in enumerate(("r0", "r1", "r2")):
            if t < 4:
                policy.record_access(key, 10.0 * t + 1 + i + t * i)
    for key, size in (("p0", 10), ("p1", 80), ("r0", 10), ("r1", 20), ("r2", 40)):
        policy.admit(key, size, 1.0, 41.0)
    assert policy.period("p0") == pytest.approx(10.0) and policy.period("r0") == 0.0
    order = policy._candidates(45.0)  # p0, p1: 5 s to their next request
    utilities = [policy.priority(key, 45.0) for key in order]
    assert order == ["r2", "p1", "r1", "r0", "p0"]  # the two kinds interleave
    assert utilities == sorted(utilities)


def _rare_and_steady(spec: str, timers: int):
    """``timers`` models every 60 s from 0 to 600 s, ``steady`` every 7 or 13 s (never
    periodic), ``rare`` once at 590 s."""
    policy = make_policy(spec)
    times = [(float(t), f"timer{j}") for t in range(0, 601, 60) for j in range(timers)]
    steady, t = [], 0.0
    while t < 590:
        steady.append((t, "steady"))
        t += 7.0 if len(steady) % 2 else 13.0
    for now, key in sorted([*times, *steady, (590.0, "rare")]):
        policy.record_access(key, now)
    return policy


def test_forecast_discounts_a_rare_models_latest_request_where_timers_are():
    # Up to the rare model's request, 24 of the 100 requests came from models found
    # periodic (the four timers' firings from 240 s on, after three matching gaps): d ≈
    # 0.24 − 0.01 (the floor) of the latest request is taken out of each count, nearly a
    # quarter of the rare model's one request but a small part of the steady model's.
    plain, discounted = (_rare_and_steady(spec, 4) for spec in (
        "cremebrulee-forecast:discount=0", "cremebrulee-forecast"))
    assert discounted.period("timer0") == pytest.approx(60.0)
    ratio = {key: discounted.request_rate(key, 600.0) / plain.request_rate(key, 600.0)
             for key in ("rare", "steady")}
    assert 1 - ratio["rare"] == pytest.approx(24 / 100 - 0.01, rel=0.02)
    assert 0.98 < ratio["steady"] < 1.0
    for policy in (plain, discounted):
        for key in ("rare", "steady"):
            policy.admit(key, 10, 1.0, 600.0)
    assert discounted.priority("rare", 600.0) == pytest.approx(
        plain.priority("rare", 600.0) * ratio["rare"])


def test_forecast_without_timers_ranks_as_cremebrulee():
    crm, plain, discounted = (_rare_and_steady(spec, 0) for spec in (
        "cremebrulee", "cremebrulee-forecast:discount=0", "cremebrulee-forecast"))
    for key in ("rare", "steady"):
        assert discounted.request_rate(key, 600.0) == plain.request_rate(key, 600.0)
        for policy in (crm, plain, discounted):
            policy.admit(key, 10, 1.0, 600.0)
    assert crm.choose_victims(5, 600.0) == discounted.choose_victims(5, 600.0) == ["rare"]
    assert discounted.priority("rare", 600.0) == plain.priority("rare", 600.0)


def _late_timer(spec: str, timers: int):
    """``_rare_and_steady``'s requests, then ``late`` every 45 s from 600 s: at 600, 645,
    690 and 735 s (each timer fires at 600 s too)."""
    policy = _rare_and_steady(spec, timers)
    for now in (600.0, 645.0, 690.0, 735.0):
        policy.record_access("late", now)
        if now == 690.0:
            found_at_690 = policy.period("late")
    return found_at_690, policy.period("late")


@pytest.mark.parametrize("spec, timers, found_at_690, found_at_735", [
    # Four timers make ~a quarter of the requests: prior odds ≈ 0.3, and a gap that
    # matches is 27x likelier from a timer than from a Poisson model (tolerance 5 %),
    # so one matching gap (the third request) passes odds of 1; odds of 30 need two.
    ("cremebrulee-forecast", 4, 45.0, 45.0),
    ("cremebrulee-forecast:odds=30", 4, 0.0, 45.0),
    ("cremebrulee-forecast:odds=0", 4, 0.0, 0.0),  # confirm: three matching gaps
    # Without timers the prior is 0: three matching gaps, whatever the odds.
    ("cremebrulee-forecast", 0, 0.0, 0.0)])
def test_forecast_finds_timers_sooner_where_timers_are_common(spec, timers, found_at_690,
                                                              found_at_735):
    assert _late_timer(spec, timers) == (pytest.approx(found_at_690),
                                         pytest.approx(found_at_735))


@pytest.mark.parametrize("spec, message", [
    ("cremebrulee-forecast:odds=-1", "odds"),
    ("cremebrulee-forecast:odds=nan", "odds"),
    ("cremebrulee-forecast:discount=nan", "discount"),
    ("cremebrulee-forecast:discount=-0.1", "discount"),
    ("cremebrulee-forecast:tolerance=1.5", "tolerance"),
    ("cremebrulee-forecast:tolerance=0", "tolerance"),
    ("cremebrulee-forecast:confirm=0", "confirm"),
    ("cremebrulee-forecast:rate=sometimes", "rate estimator")])
def test_forecast_parameters_are_checked(spec, message):
    with pytest.raises(ValueError, match=message):
        make_policy(spec)
