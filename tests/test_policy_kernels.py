"""The compiled side of the policies: ids, array growth, the kernels' arithmetic and RNG,
and the simulator's compiled loop deciding exactly as the policies' Python verbs.

The test process runs the kernels interpreted (``edgeagent serve``'s mode, conftest.py);
the last test runs every test here again in a child process that compiles them."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepolicies import POLICY_NAMES, kernels, make_policy
from cachepolicies import simulator as simulator_module
from cachepolicies.base import INITIAL_CAPACITY, Ids
from cachepolicies.jit import COMPILED
from cachepolicies.rates import CumulativeRate, DecayedRate
from cachepolicies.simulator import simulate
from cachepolicies.sourcestamp import package_stamp
from cachepolicies.traces import make_profiles, make_trace
from cachepolicies.twin import Queueing
from tests.helpers import run_pytest_compiled


def drive(policy, trace, size_of, capacity, evictable=None):
    """A byte-capacity cache over ``(key, now)`` requests; returns every victim list."""
    used = 0
    evicted = []
    for key, now in trace:
        policy.record_access(key, now)
        if key in policy:
            continue
        victims = policy.choose_victims(used + size_of(key) - capacity, now, evictable)
        for victim in victims:
            used -= policy.size_of(victim)
            policy.remove(victim)
        evicted.append(victims)
        policy.admit(key, size_of(key), 1.0 + len(str(key)) % 7, now)
        used += size_of(key)
    return evicted


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_ids_grow_beyond_the_initial_arrays_without_changing_decisions(name):
    rng = random.Random(5)
    n_keys = 5 * INITIAL_CAPACITY
    trace = [(f"m:{min(int(rng.paretovariate(0.7)), n_keys)}", t * 0.5) for t in range(3000)]
    keys = [key for key, _ in trace]
    sizes = {key: 1 + sum(map(ord, key)) % 9 for key in keys}
    growing = make_policy(name, future=keys, seed=2)
    presized = make_policy(name, future=keys, seed=2)
    presized._intern_all(sorted(set(keys)))  # every id known before the first request
    capacity = 3 * INITIAL_CAPACITY  # dozens resident while the arrays grow
    got = drive(growing, trace, sizes.__getitem__, capacity)
    assert got == drive(presized, trace, sizes.__getitem__, capacity)
    assert len(growing._ids) > INITIAL_CAPACITY and growing._capacity >= len(growing._ids)
    assert growing.resident() == presized.resident()
    now = trace[-1][1]
    assert [growing.priority(k, now) for k in keys[:200]] == [
        presized.priority(k, now) for k in keys[:200]]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_keys_of_mixed_types(name):
    keys = [1, "1", (1, "a"), 2.5, None, frozenset({3}), b"x", ("mlp", 2)]
    trace = [(keys[i % len(keys)], float(t)) for t, i in enumerate([0, 1, 2, 3, 4, 5, 6, 7, 0,
                                                                    2, 4, 6, 1, 3, 5, 7, 0])]
    policy = make_policy(name, future=[k for k, _ in trace], seed=1)
    evicted = drive(policy, trace, lambda key: 1, capacity=5)
    for victims in evicted:
        assert all(any(v is k for k in keys) for v in victims)  # the very key objects
    assert len(policy) == 5 and set(policy.resident()) <= set(keys)
    assert ("never", "seen") not in policy
    interned = len(policy._ids)
    assert policy.priority(("never", "seen"), 20.0) in (0.0, -math.inf)
    assert len(policy._ids) == interned  # asking about a key does not intern it
    with pytest.raises(KeyError):
        policy.size_of(("never", "seen"))
    with pytest.raises(KeyError):
        policy.remove("never")
    victim = policy.resident()[0]
    policy.remove(victim)
    assert victim not in policy and len(policy) == 4


def decayed_log_sum(times, k):
    """The decayed estimator's recurrence in plain Python floats."""
    total = None
    for t in times:
        x = t * k
        if total is None:
            total = x
        elif total >= x:
            total = total + math.log1p(math.exp(x - total))
        else:
            total = x + math.log1p(math.exp(total - x))
    return total


@pytest.mark.parametrize("start", [0.0, 1e9, 1.7e9, 1e12, 1e15])
def test_decayed_rate_with_huge_timestamps(start):
    half_life = 600.0
    rates = DecayedRate(half_life)
    times = [start, start + 300.0, start + 600.0]
    for t in times:
        rates.record("a", t)
    rates.record("b", start + 600.0)
    k = math.log(2.0) / half_life
    assert rates.log_score("a") == decayed_log_sum(times, k)  # the same arithmetic, exactly
    assert math.isfinite(rates.log_score("a")) and rates.log_score("never") == -math.inf
    now = start + 600.0
    assert rates.rate("b", now) == pytest.approx(k, rel=1e-6)
    if start < 1e12:  # L = t·ln2/h keeps ~16 digits: at 1e12 s the sub-second terms blur
        assert rates.rate("a", now) == pytest.approx(k * (1 + 2 ** -0.5 + 0.5), rel=1e-6)
    policy = make_policy("cremebrulee")
    for t in times:
        policy.record_access("m", t)
    policy.admit("m", 10, 2.0, now)
    assert math.isfinite(policy.priority("m", now)) and policy.priority("m", now) > 0


def test_cumulative_rate_starts_its_clock_at_the_first_request():
    rates = CumulativeRate()
    assert rates.rate("a", 5.0) == 0.0
    rates.record("a", 10.0)
    rates.record("b", 10.5)
    assert rates.rate("a", 10.2) == 1.0  # one-second floor on the elapsed time
    assert rates.rate("b", 30.0) == pytest.approx(1 / 20)
    assert rates.log_score("a") == 0.0 and rates.log_score("c") == -math.inf


def lazy_shuffle_victims(order, rng, count):
    """The random policy's rule: a lazy Fisher-Yates shuffle over its dense list."""
    victims = []
    for i in range(count):
        j = rng.randrange(i, len(order))
        order[i], order[j] = order[j], order[i]
        victims.append(order[i])
    return victims


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**40 + 7])
def test_random_draws_are_cpython_random_randrange(seed):
    policy = make_policy("random", seed=seed)
    rng = random.Random(seed)
    order: list[int] = []  # the policy's dense list: admissions append, removals swap-pop
    for key in range(1500):  # > 624 draws: the twister regenerates its state
        policy.record_access(key, 0.0)
        policy.admit(key, 1, 1.0, 0.0)
        order.append(key)
    for round_ in range(40):
        count = 1 + round_ % 7
        expected = lazy_shuffle_victims(order, rng, count)
        assert policy.choose_victims(count, 1.0) == expected
        for victim in expected[: round_ % 3]:
            policy.remove(victim)
            i = order.index(victim)
            last = order.pop()
            if i < len(order):
                order[i] = last


@pytest.mark.parametrize("name", [n for n in POLICY_NAMES if n != "random"])
def test_choose_victims_changes_nothing(name):
    keys = list(range(30))
    policy = make_policy(name, future=keys * 2, seed=1)
    for t, key in enumerate(keys):
        policy.record_access(key, float(t))
        policy.admit(key, 1 + key % 4, 1.0 + key % 3, float(t))
    first = policy.choose_victims(20, 30.0)
    assert policy.choose_victims(20, 30.0) == first
    assert policy.choose_victims(20, 30.0, evictable=lambda k: k not in first[:1]) != first
    assert policy.choose_victims(20, 30.0) == first


def test_interning_numpy_arrays_matches_the_keys():
    for keys in (np.array([7, 3, 7, 9, 0]), np.array([10**12, -5, 10**12]),
                 np.array([3, 3], dtype=np.uint32), np.array([], dtype=np.int64)):
        ids = Ids()
        got = ids.intern_many(keys)
        assert [ids.keys[i] for i in got.tolist()] == keys.tolist()
        assert sorted(set(got.tolist())) == list(range(len(set(keys.tolist()))))


@pytest.mark.skipif(not COMPILED, reason="numba's on-disk caches: the compiled child runs it "
                    "(test_every_test_here_with_compiled_kernels)")
def test_kernel_caches_are_stamped_with_the_whole_package(tmp_path):
    for dispatcher in (kernels.access, kernels.choose, kernels.grow_state):
        assert dispatcher._cache._cache_file._source_stamp == kernels._STAMP
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    (root / "b.py").write_text("y = 2\n")
    before = package_stamp(root)
    (root / "b.py").write_text("y = 3\n")  # another module than the kernel's own
    assert package_stamp(root) != before


# -- the compiled simulator loop against the Python verbs ----------------------------------
def python_driven(monkeypatch, captured):
    """Make the simulator's policies drive through their Python methods (a verb override)."""
    real_make = simulator_module.make_policy

    def make(spec, **kwargs):
        policy = real_make(spec, **kwargs)
        policy.record_access = policy.record_access  # an instance override: Python loop
        captured.append(policy)
        return policy

    monkeypatch.setattr(simulator_module, "make_policy", make)


def compiled(monkeypatch, captured):
    real_make = simulator_module.make_policy

    def make(spec, **kwargs):
        policy = real_make(spec, **kwargs)
        captured.append(policy)
        return policy

    monkeypatch.setattr(simulator_module, "make_policy", make)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 11), min_size=1, max_size=150),
    st.lists(st.integers(0, 60), min_size=12, max_size=12),
    st.lists(st.floats(0, 20), min_size=12, max_size=12),
    st.lists(st.floats(0, 3), min_size=12, max_size=12),
    st.integers(60, 250),
    st.sampled_from([None, 1, 3]),
    st.floats(0, 5),
)
def test_the_compiled_loop_decides_as_the_python_verbs(
    trace_ids, sizes, loads, execs, capacity, workers, gap
):
    names = [f"m{i}" for i in range(12)]
    profiles = make_profiles(names, sizes, loads, execs)
    trace = make_trace(np.arange(len(trace_ids)) * gap, [names[i] for i in trace_ids], profiles)
    queueing = None if workers is None else Queueing(workers=workers)
    for name in [*POLICY_NAMES, "cremebrulee:rate=cumulative", "popularity:half_life=2"]:
        results, policies = [], []
        for drive_with in (compiled, python_driven):
            with pytest.MonkeyPatch.context() as monkeypatch:
                captured: list = []
                drive_with(monkeypatch, captured)
                results.append(simulate(trace, profiles, capacity, name, seed=4,
                                        queueing=queueing))
                policies.append(captured[0])
        assert simulator_module._runs_compiled(policies[0])
        assert not simulator_module._runs_compiled(policies[1])
        assert results[0] == results[1], name
        end = float(trace.timestamps[-1])
        assert policies[0].resident() == policies[1].resident()
        assert [policies[0].priority(k, end) for k in range(12)] == [
            policies[1].priority(k, end) for k in range(12)]


def test_the_forecasts_discount_decides_alike_compiled_and_interpreted():
    # Timers (periods 20-50 s) beside Poisson models: the discount is at work.
    rng = np.random.default_rng(3)
    names = [f"m{i}" for i in range(30)]
    profiles = make_profiles(names, rng.integers(5, 40, 30), rng.uniform(0.5, 5, 30),
                             np.zeros(30))
    times, ids = [], []
    for i, period in enumerate(rng.uniform(20, 50, 10)):
        fires = np.arange(rng.uniform(0, period), 2000, period)
        times.append(fires + rng.uniform(-0.2, 0.2, len(fires)))
        ids.append(np.full(len(fires), i))
    for i in range(10, 30):
        n = rng.poisson(2000 / (5 * (i - 8)))
        times.append(rng.uniform(0, 2000, n))
        ids.append(np.full(n, i))
    order = np.argsort(np.concatenate(times))
    trace = make_trace(np.concatenate(times)[order],
                       [names[i] for i in np.concatenate(ids)[order]], profiles)
    results, policies = [], []
    for drive_with, spec in ((compiled, "cremebrulee-forecast"),
                             (python_driven, "cremebrulee-forecast"),
                             (compiled, "cremebrulee-forecast:discount=0")):
        with pytest.MonkeyPatch.context() as monkeypatch:
            captured: list = []
            drive_with(monkeypatch, captured)
            results.append(simulate(trace, profiles, 120, spec))
            policies.append(captured[0])
    assert results[0] == results[1]
    end = float(trace.timestamps[-1])
    assert [policies[0].priority(k, end) for k in range(30)] == [
        policies[1].priority(k, end) for k in range(30)]
    discounted, plain = ([p.request_rate(k, end) for k in range(10, 30)]
                         for p in (policies[0], policies[2]))
    assert all(a <= b for a, b in zip(discounted, plain)) and discounted != plain


@pytest.mark.skipif(COMPILED, reason="this process compiles its kernels: the tests above did")
def test_every_test_here_with_compiled_kernels():
    """The tests above again with the kernels compiled (numba: the simulator's mode)."""
    run_pytest_compiled(__file__, "--deselect",
                        f"{__file__}::test_every_test_here_with_compiled_kernels")
