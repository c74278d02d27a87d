"""Property tests: policies against naive reference implementations on random traces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepolicies import InsufficientSpace, POLICY_NAMES, make_policy

traces = st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=80)
sizes = st.lists(st.integers(min_value=1, max_value=40), min_size=8, max_size=8)


def drive(policy, trace, size_of, capacity, penalty_of=lambda k: 1.0, evictable=None):
    """Run a byte-capacity cache over ``trace``; return misses. Checks invariants as it goes."""
    resident: dict[int, int] = {}
    misses = 0
    for t, key in enumerate(trace):
        now = float(t)
        policy.record_access(key, now)
        assert (key in policy) == (key in resident)
        if key in resident:
            continue
        misses += 1
        need = sum(resident.values()) + size_of(key) - capacity
        victims = policy.choose_victims(need, now, evictable)
        freed = sum(resident[v] for v in victims)
        if need > 0:
            assert freed >= need, "victims must free enough"
            # Taken in order, the last victim was needed: never more than that.
            assert freed - resident[victims[-1]] < need, "never more than needed"
        else:
            assert victims == []
        for victim in victims:
            assert evictable is None or evictable(victim)
            policy.remove(victim)
            del resident[victim]
        policy.admit(key, size_of(key), penalty_of(key), now)
        resident[key] = size_of(key)
        assert sum(resident.values()) <= capacity
    return misses


def reference_lru_misses(trace, size_of, capacity):
    order: list[int] = []  # least recent first
    misses = 0
    for key in trace:
        if key in order:
            order.remove(key)
            order.append(key)
            continue
        misses += 1
        while sum(size_of(k) for k in order) + size_of(key) > capacity:
            order.pop(0)
        order.append(key)
    return misses


def reference_belady_misses(trace, capacity):
    cache: set[int] = set()
    misses = 0
    for i, key in enumerate(trace):
        if key in cache:
            continue
        misses += 1
        if len(cache) == capacity:
            def next_use(k):
                rest = trace[i + 1:]
                return rest.index(k) if k in rest else len(trace)
            cache.remove(max(cache, key=next_use))
        cache.add(key)
    return misses


@settings(max_examples=200, deadline=None)
@given(traces, sizes, st.integers(min_value=40, max_value=150))
def test_lru_matches_the_naive_reference_with_byte_sizes(trace, size_list, capacity):
    size_of = size_list.__getitem__
    assert drive(make_policy("lru"), trace, size_of, capacity) == reference_lru_misses(
        trace, size_of, capacity
    )


@settings(max_examples=200, deadline=None)
@given(traces, st.integers(min_value=1, max_value=6))
def test_belady_matches_the_naive_reference_with_unit_sizes(trace, capacity):
    policy = make_policy("beladymin", future=trace)
    assert drive(policy, trace, lambda k: 1, capacity) == reference_belady_misses(trace, capacity)


@settings(max_examples=100, deadline=None)
@given(traces, st.integers(min_value=1, max_value=6))
def test_oracle_with_equal_costs_and_unit_sizes_is_belady(trace, capacity):
    # Paper §V-A: with homogeneous sizes and penalties CremeBrulee reduces to BeladyMIN.
    policy = make_policy("cremebrulee-oracle", future=trace)
    assert drive(policy, trace, lambda k: 1, capacity) == reference_belady_misses(trace, capacity)


@settings(max_examples=60, deadline=None)
@given(
    traces,
    sizes,
    st.lists(st.floats(min_value=0.01, max_value=20), min_size=8, max_size=8),
    st.integers(min_value=40, max_value=150),
)
def test_no_policy_exceeds_capacity_or_evicts_more_than_needed(trace, size_list, pens, capacity):
    for name in POLICY_NAMES:
        policy = make_policy(name, future=trace, seed=3)
        drive(policy, trace, size_list.__getitem__, capacity, pens.__getitem__)


@settings(max_examples=60, deadline=None)
@given(traces, sizes, st.sets(st.integers(min_value=0, max_value=7), max_size=3))
def test_no_policy_evicts_a_non_evictable_entry(trace, size_list, in_use):
    capacity = 150  # >= 3 pinned entries of at most 40 bytes + the largest newcomer
    evictable = lambda key: key not in in_use  # noqa: E731
    for name in POLICY_NAMES:
        policy = make_policy(name, future=trace, seed=5)
        drive(policy, trace, size_list.__getitem__, capacity, evictable=evictable)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=10),
       st.integers(min_value=1, max_value=600))
def test_choose_victims_frees_enough_or_raises(size_list, need):
    for name in POLICY_NAMES:
        keys = list(range(len(size_list)))
        policy = make_policy(name, future=keys, seed=1)
        for key in keys:
            policy.record_access(key, float(key))
            policy.admit(key, size_list[key], 1.0, float(key))
        total = sum(size_list)
        if need > total:
            try:
                policy.choose_victims(need, 100.0)
            except InsufficientSpace as error:
                assert error.freeable_bytes == total
            else:
                raise AssertionError(f"{name} claimed to free {need} of {total} bytes")
        else:
            victims = policy.choose_victims(need, 100.0)
            assert sum(size_list[v] for v in victims) >= need
            assert len(set(victims)) == len(victims)
