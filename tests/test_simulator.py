"""The trace-driven simulator and its input files (cachepolicies.simulator, .traces)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepolicies import POLICY_NAMES, make_policy
from cachepolicies import simulator as simulator_module
from cachepolicies.heap import (
    grow_heap, heap_first, heap_next, heap_order, heap_remove, heap_set, new_heap)
from cachepolicies.simulator import PolicyContractError, simulate, sweep
from cachepolicies.traces import (
    SimulationInputError,
    cremebrulee_profiles_path,
    make_profiles,
    make_trace,
    read_profiles,
    read_trace,
)
from cachepolicies.twin import Queueing

TABLE_I = [0, 1, 2, 1, 0, 2, 1, 0, 2, 0, 2, 1, 0, 2]


def table_one():
    """CremeBrulee Table I: three unit-size models, model i costs i + 1 to reload."""
    profiles = make_profiles(["m0", "m1", "m2"], [1, 1, 1], [1.0, 2.0, 3.0], [0.1] * 3)
    trace = make_trace([float(t) for t in range(len(TABLE_I))], [f"m{i}" for i in TABLE_I],
                       profiles)
    return trace, profiles


@pytest.mark.parametrize("policy, cost", [("beladymin", 17.0), ("cremebrulee-oracle", 13.0)])
def test_paper_table_one_through_the_simulator(policy, cost):
    trace, profiles = table_one()
    result = simulate(trace, profiles, 2, policy)
    assert (result.requests, result.hits, result.misses) == (14, 6, 8)
    assert result.load_delay_seconds == cost
    assert result.mean_load_delay_seconds == pytest.approx(cost / 14)
    assert result.evictions == 6  # 8 loads, 2 models resident at the end
    assert result.bytes_loaded == 8


# -- never over capacity, counts consistent --------------------------------------------------
def spy_on_capacity(monkeypatch, capacity, log):
    """Wrap every policy the simulator builds so that admit/remove track used bytes."""
    real_make = simulator_module.make_policy

    def make(spec, **kwargs):
        policy = real_make(spec, **kwargs)
        used = {"bytes": 0}
        admit, remove = policy.admit, policy.remove

        def spied_admit(key, size, penalty, now):
            used["bytes"] += size
            assert used["bytes"] <= capacity, "over capacity"
            log.append(("admit", key))
            admit(key, size, penalty, now)

        def spied_remove(key):
            used["bytes"] -= policy.size_of(key)
            log.append(("remove", key))
            remove(key)

        policy.admit, policy.remove = spied_admit, spied_remove
        return policy

    monkeypatch.setattr(simulator_module, "make_policy", make)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=120),
    st.lists(st.integers(0, 50), min_size=10, max_size=10),
    st.lists(st.floats(0, 30), min_size=10, max_size=10),
    st.integers(50, 200),
)
def test_never_over_capacity_and_counts_add_up(trace_ids, sizes, loads, capacity):
    names = [f"m{i}" for i in range(10)]
    profiles = make_profiles(names, sizes, loads, [0.5] * 10)
    trace = make_trace(np.arange(len(trace_ids)) * 0.5, [names[i] for i in trace_ids], profiles)
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in POLICY_NAMES:
            log: list = []
            spy_on_capacity(monkeypatch, capacity, log)
            result = simulate(trace, profiles, capacity, name, seed=1)
            admits = [k for op, k in log if op == "admit"]
            assert result.hits + result.misses == result.requests == len(trace_ids)
            assert result.misses == len(admits)
            assert result.evictions == sum(op == "remove" for op, _ in log)
            assert result.bytes_loaded == sum(sizes[k] for k in admits)
            assert result.load_delay_seconds == pytest.approx(sum(loads[k] for k in admits))
            assert result.misses >= len(set(trace_ids))  # every model misses once at least


def test_a_policy_that_frees_too_little_is_an_error(monkeypatch):
    trace, profiles = table_one()
    real_make = simulator_module.make_policy

    def make(spec, **kwargs):
        policy = real_make(spec, **kwargs)
        policy.choose_victims = lambda need, now, evictable=None: []
        return policy

    monkeypatch.setattr(simulator_module, "make_policy", make)
    with pytest.raises(PolicyContractError, match="freed too little"):
        simulate(trace, profiles, 2, "lru")


def test_a_model_larger_than_the_capacity_is_an_error_before_the_run():
    profiles = make_profiles(["small", "big"], [10, 100], [1.0, 1.0], [0.1, 0.1])
    trace = make_trace([0.0, 1.0], ["small", "big"], profiles)
    with pytest.raises(SimulationInputError, match="'big' needs 100 bytes.*capacity of 99"):
        simulate(trace, profiles, 99, "lru")
    # A profile the trace never requests may be larger than the capacity.
    assert simulate(make_trace([0.0], ["small"], profiles), profiles, 10, "lru").misses == 1


def test_random_is_seeded_through_the_simulator():
    rng = random.Random(4)
    names = [f"m{i}" for i in range(30)]
    profiles = make_profiles(names, [1] * 30, [1.0] * 30, [0.1] * 30)
    trace = make_trace(list(range(500)), [rng.choice(names) for _ in range(500)], profiles)
    runs = [simulate(trace, profiles, 10, "random", seed=s).misses for s in (1, 1, 2)]
    assert runs[0] == runs[1]


# -- sweeps ----------------------------------------------------------------------------------
def test_sweep_is_policy_major_in_the_order_given():
    trace, profiles = table_one()
    results = sweep(trace, profiles, [3, 2], ["lru", "cremebrulee:rate=cumulative"],
                    progress=False)
    assert [(r.policy, r.capacity_bytes) for r in results] == [
        ("lru", 3), ("lru", 2), ("cremebrulee:rate=cumulative", 3),
        ("cremebrulee:rate=cumulative", 2)]
    assert results[0].misses == 3  # everything fits: only cold misses


def test_sweep_checks_every_spec_and_capacity_before_running(monkeypatch):
    trace, profiles = table_one()
    calls = []
    monkeypatch.setattr(simulator_module, "simulate", lambda *a, **k: calls.append(a))
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        sweep(trace, profiles, [2], ["lru", "nope"], progress=False)
    with pytest.raises(SimulationInputError, match="capacity"):
        sweep(trace, profiles, [2, 0], ["lru"], progress=False)
    assert calls == []


# -- queueing mode ---------------------------------------------------------------------------
def one_model(load=2.0, exec_=0.5, first_exec=None):
    return make_profiles(["m"], [10], [load], [exec_],
                         None if first_exec is None else [first_exec])


def test_queueing_with_ample_capacity_response_is_exec_time_after_a_cold_miss():
    profiles = one_model(load=2.0, exec_=0.5)
    trace = make_trace([0.0, 10.0, 20.0, 30.0], ["m"] * 4, profiles)
    result = simulate(trace, profiles, 100, "lru", queueing=Queueing(workers=1))
    # One cold miss (2.0 + 0.5), then three warm requests of 0.5 s each.
    assert result.misses == 1 and result.workers == 1
    assert result.mean_response_seconds == pytest.approx((2.5 + 3 * 0.5) / 4)
    assert result.p99_response_seconds == pytest.approx(np.percentile([2.5, .5, .5, .5], 99))


def test_queueing_cold_first_execution_surplus_is_part_of_the_penalty():
    profiles = one_model(load=2.0, exec_=0.5, first_exec=1.5)
    assert profiles.penalty_seconds[0] == pytest.approx(3.0)
    trace = make_trace([0.0], ["m"], profiles)
    result = simulate(trace, profiles, 100, "lru", queueing=Queueing(workers=1))
    assert result.mean_response_seconds == pytest.approx(3.5)  # load + cold first run
    assert result.load_delay_seconds == pytest.approx(3.0)


def test_queueing_one_worker_requests_wait_in_fifo_order():
    profiles = one_model(load=2.0, exec_=1.0)
    trace = make_trace([0.0, 0.0, 0.0], ["m"] * 3, profiles)
    result = simulate(trace, profiles, 100, "lru", queueing=Queueing(workers=1))
    assert result.mean_response_seconds == pytest.approx((3.0 + 4.0 + 5.0) / 3)


def test_queueing_concurrent_requests_share_one_load():
    profiles = one_model(load=2.0, exec_=1.0)
    trace = make_trace([0.0, 0.5], ["m"] * 2, profiles)
    result = simulate(trace, profiles, 100, "lru", queueing=Queueing(workers=2))
    # The second request waits for the load in progress (single flight): no second miss.
    assert (result.misses, result.hits) == (1, 1)
    assert result.mean_response_seconds == pytest.approx((3.0 + 2.5) / 2)


def test_queueing_never_evicts_a_model_with_requests_in_flight():
    profiles = make_profiles(["a", "b"], [10, 10], [1.0, 2.0], [5.0, 1.0])
    trace = make_trace([0.0, 0.5], ["a", "b"], profiles)
    result = simulate(trace, profiles, 10, "lru", queueing=Queueing(workers=2))
    # a runs until 6.0; b cannot evict it before then: b starts at 6, loads 2, runs 1.
    assert result.misses == 2 and result.evictions == 1
    assert result.mean_response_seconds == pytest.approx((6.0 + (9.0 - 0.5)) / 2)


def test_without_queueing_there_are_no_response_fields():
    trace, profiles = table_one()
    d = simulate(trace, profiles, 2, "lru").to_dict()
    assert {"policy", "capacity_bytes", "requests", "hits", "misses", "load_delay_seconds",
            "mean_load_delay_seconds", "evictions", "bytes_loaded"} == set(d)


# -- input files -----------------------------------------------------------------------------
PROFILES = "model,size_bytes,load_seconds,exec_seconds\na,10,1.5,0.1\nb,20,2.5,0.2\n"
TRACE = "timestamp,model\n0.0,a\n1.0,b\n1.0,a\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_files_and_interns_model_names(tmp_path):
    profiles = read_profiles(write(tmp_path, "p.csv", PROFILES))
    trace = read_trace(write(tmp_path, "t.csv", TRACE), profiles)
    assert profiles.names == ["a", "b"] and profiles.size_bytes.tolist() == [10, 20]
    assert profiles.penalty_seconds.tolist() == [1.5, 2.5]
    assert trace.model_ids.tolist() == [0, 1, 0]
    assert trace.timestamps.tolist() == [0.0, 1.0, 1.0]


def test_extra_columns_are_ignored(tmp_path):
    profiles = read_profiles(write(
        tmp_path, "p.csv", "disk_mb,model,size_bytes,load_seconds,exec_seconds,x\n"
                           "1,a,10,1.5,0.1,y\n"))
    trace = read_trace(write(tmp_path, "t.csv", "model,note,timestamp\na,hi,3.5\n"), profiles)
    assert trace.model_ids.tolist() == [0] and trace.timestamps.tolist() == [3.5]


def test_first_exec_seconds_adds_the_cold_run_surplus(tmp_path):
    profiles = read_profiles(write(
        tmp_path, "p.csv",
        "model,size_bytes,load_seconds,exec_seconds,first_exec_seconds\n"
        "a,1,2.0,0.5,1.25\n"   # surplus 0.75
        "b,1,2.0,0.5,0.25\n"   # faster cold run: no surplus, never a discount
        "c,1,2.0,0.5,\n"))     # not measured
    assert profiles.penalty_seconds.tolist() == [2.75, 2.0, 2.0]


def test_shipped_cremebrulee_profiles():
    path = cremebrulee_profiles_path()
    profiles = read_profiles(path)
    assert len(profiles) == 26 and "ResNet50" in profiles.index
    assert profiles.size_bytes.sum() == pytest.approx(21.7e9, rel=0.01)
    assert path.name == "cremebrulee-profiles.csv"


PROFILE_ERRORS = [
    ("", "the file is empty"),
    ("model,size_bytes,load_seconds\na,1,1\n", "missing column(s) 'exec_seconds'"),
    ("model,size_bytes,load_seconds,exec_seconds\n", "no models after the header"),
    ("model,size_bytes,load_seconds,exec_seconds\na,1,1,1\nb,x1,1,1\n",
     "line 3, column 'size_bytes': 'x1' is not a number"),
    ("model,size_bytes,load_seconds,exec_seconds\na,-5,1,1\n",
     "line 2, column 'size_bytes': -5.0 is negative"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,1,-0.5\n",
     "line 2, column 'exec_seconds': -0.5 is negative"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,-1,1\n",
     "line 2, column 'load_seconds': -1.0 is negative"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,nan,1\n",
     "line 2, column 'load_seconds': nan is not a finite number"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5.5,1,1\n",
     "line 2, column 'size_bytes': 5.5 is not a whole number of bytes"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,1,1\nb,5,1,1\na,6,1,1\n",
     "line 4, column 'model': model 'a' is listed twice (first on line 2)"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,1,\n",
     "line 2, column 'exec_seconds': missing value"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,1,1\n\nb,5,1,1\n", "line 3: empty row"),
    ("model,size_bytes,load_seconds,exec_seconds\na,5,1\n",
     "line 2: 3 fields, the header has 4"),
]


@pytest.mark.parametrize("text, message", PROFILE_ERRORS)
def test_bad_profiles_name_file_line_column_and_problem(tmp_path, text, message):
    path = write(tmp_path, "p.csv", text)
    with pytest.raises(SimulationInputError) as info:
        read_profiles(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


TRACE_ERRORS = [
    ("", "the file is empty"),
    ("time,model\n0,a\n", "missing column(s) 'timestamp'"),
    ("timestamp,model\n", "no requests after the header"),
    ("timestamp,model\n0,a\nsoon,b\n", "line 3, column 'timestamp': 'soon' is not a number"),
    ("timestamp,model\n0,a\n2,b\n1,a\n",
     "line 4, column 'timestamp': 1.0 is earlier than 2.0 on line 3"),
    ("timestamp,model\n-1,a\n", "line 2, column 'timestamp': -1.0 is negative"),
    ("timestamp,model\n0,a\n1,zzz\n2,yyy\n",
     "line 3, column 'model': model 'zzz' is not in the profiles"),
    ("timestamp,model\n0,a\n1,\n", "line 3, column 'model': empty model name"),
    ("timestamp,model\n0,a\n,b\n", "line 3, column 'timestamp': missing value"),
    ("timestamp,model\n0,a\n\n1,a\n", "line 3: empty row"),
    ("timestamp,model\n0,a,x\n", "line 2: 3 fields, the header has 2"),
]


@pytest.mark.parametrize("text, message", TRACE_ERRORS)
def test_bad_traces_name_file_line_column_and_problem(tmp_path, text, message):
    profiles = read_profiles(write(tmp_path, "p.csv", PROFILES))
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(SimulationInputError) as info:
        read_trace(path, profiles)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_unknown_models_are_counted(tmp_path):
    profiles = read_profiles(write(tmp_path, "p.csv", PROFILES))
    path = write(tmp_path, "t.csv", "timestamp,model\n0,x\n1,y\n2,x\n")
    with pytest.raises(SimulationInputError, match="model 'x'.*1 other unknown"):
        read_trace(path, profiles)


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        read_profiles(tmp_path / "nope.csv")


# -- policy internals the simulator relies on for speed -------------------------------------
def test_indexed_heap_orders_like_a_full_sort_by_priority_then_touch_order():
    rng = random.Random(7)
    heap = new_heap(8)
    grow_heap(heap, 40)  # ids go up to 39
    truth: dict[int, tuple[float, int]] = {}  # id -> (priority, touch counter)
    touch = 0
    for _ in range(3000):
        op = rng.random()
        key = rng.randrange(40)
        if key not in truth:
            heap_set(heap, key, 0.0)
            truth[key] = (0.0, touch)
        elif op < 0.6:
            priority = float(rng.randint(-5, 5))  # many ties, rises and falls
            heap_set(heap, key, priority)
            truth[key] = (priority, touch)
        elif op < 0.7:
            assert heap_order(heap).tolist() == sorted(truth, key=truth.get)
        elif op < 0.8:  # a walk abandoned part way leaves the heap as it was
            walked = [heap_first(heap)]
            while walked[-1] >= 0 and len(walked) < 3:
                walked.append(heap_next(heap, walked[-1]))
            walked = [i for i in walked if i >= 0]
            assert walked == sorted(truth, key=truth.get)[: len(walked)]
        else:
            heap_remove(heap, key)
            del truth[key]
        touch += 1


def test_oracle_candidates_follow_utility_then_farthest_next_use():
    rng = random.Random(3)
    future = [rng.randrange(12) for _ in range(400)]
    policy = make_policy("cremebrulee-oracle", future=future)
    sizes = {k: rng.randint(1, 4) for k in range(12)}
    penalties = {k: rng.choice([0.0, 1.0, 2.0, rng.uniform(0, 5)]) for k in range(12)}
    nxt = {}
    for i, key in enumerate(future):
        policy.record_access(key, float(i))
        later = future[i + 1:]
        nxt[key] = i + 1 + later.index(key) if key in later else float("inf")
        if key in policy:
            continue
        if len(policy) >= 6:
            resident = policy.resident()  # insertion (admission) order
            expected = sorted(resident, key=lambda k: (
                penalties[k] / (max(sizes[k], 1) * (nxt[k] - i)), -nxt[k]))
            assert policy._candidates(float(i)) == expected
            for victim in policy.choose_victims(sizes[key], float(i)):
                policy.remove(victim)
        policy.admit(key, sizes[key], penalties[key], float(i))
