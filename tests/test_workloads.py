"""Workload generation (CremeBrulee §VI-A): Azure CSV reading, synthetic counts, traces."""

from __future__ import annotations

import io

import numpy as np
import pytest
from scipy.stats import spearmanr

from cachepolicies.simulator import simulate
from cachepolicies.traces import make_profiles, read_profiles, read_trace
from cachepolicies.workloads import (
    ID_COLUMNS,
    InvocationCounts,
    TraceOptions,
    WorkloadError,
    associate,
    build_workload,
    filter_by_popularity,
    read_azure_invocations,
    spread_over_minutes,
    synthetic_invocations,
    timer_events,
    write_azure_invocations,
    write_profiles,
    write_trace,
)

# 4 minutes; f4 is the popular one, f5 a one-hit wonder, f7 is idle; t*/q* not HTTP.
AZURE_CSV = """\
HashOwner,HashApp,HashFunction,Trigger,1,2,3,4
o1,a1,f1,http,1,0,2,0
o1,a1,t1,timer,1,1,1,1
o1,a2,f2,http,0,3,0,1
o2,a3,f3,http,2,2,0,0
o2,a3,q1,queue,5,5,5,5
o2,a4,f4,http,9,8,7,9
o3,a5,f5,http,0,0,1,0
o3,a5,f6,http,1,1,1,1
o3,a6,f7,http,0,0,0,0
"""


def _profiles(load: list[float]):
    n = len(load)
    return make_profiles([f"M{i}" for i in range(n)], [1000 * (i + 1) for i in range(n)],
                         load, [0.1] * n)


def _counts(totals: np.ndarray, minutes: int = 1) -> InvocationCounts:
    """One function per total, its invocations all in minute 0."""
    counts = np.zeros((len(totals), minutes), dtype=np.int32)
    counts[:, 0] = totals
    ids = np.array([f"f{i}" for i in range(len(totals))], dtype=object)
    return InvocationCounts(ids, ids, ids, np.full(len(totals), "http", dtype=object), counts)


@pytest.fixture()
def azure_csv(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_CSV)
    return path


# -- reading the Azure CSV ------------------------------------------------------------------
def test_reads_http_functions_only(azure_csv):
    inv = read_azure_invocations(azure_csv)
    assert inv.functions.tolist() == ["f1", "f2", "f3", "f4", "f5", "f6", "f7"]
    assert set(inv.triggers) == {"http"}
    assert inv.counts[3].tolist() == [9, 8, 7, 9]
    assert inv.n_minutes == 4 and inv.start_minute == 0
    everything = read_azure_invocations(azure_csv, trigger=None)
    assert everything.n_functions == 9


def test_reads_a_window_of_minutes(azure_csv):
    inv = read_azure_invocations(azure_csv, start_minute=1, minutes=2)
    assert inv.start_minute == 1
    assert inv.counts[:, :].tolist() == [[0, 2], [3, 0], [2, 0], [8, 7], [0, 1], [1, 1], [0, 0]]
    with pytest.raises(WorkloadError, match="does not fit"):
        read_azure_invocations(azure_csv, start_minute=3, minutes=2)


@pytest.mark.parametrize("text, message", [
    ("HashOwner,HashApp,HashFunction,1,2\no,a,f,1,2\n", r"azure\.csv: missing column 'Trigger'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,3\no,a,f,http,1,2\n",
     r"unexpected column '3'.*expected '2'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1,2\no,a,g,http,1,x\n",
     r"azure\.csv: line 3, column '2': count 'x' is not a non-negative integer"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1,-4\n", r"line 2, column '2'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1.5,2\n", r"line 2, column '1'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,,2\n",
     r"line 2, column '1': count empty"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,,http,1,2\n",
     r"line 2, column 'HashFunction': empty value"),
    ("", r"empty file"),
])
def test_bad_azure_csv_is_named(tmp_path, text, message):
    path = tmp_path / "azure.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        read_azure_invocations(path)


def test_missing_file_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read"):
        read_azure_invocations(tmp_path / "nope.csv")


# -- synthetic counts -----------------------------------------------------------------------
def test_synthetic_round_trips_through_the_azure_format(tmp_path):
    inv = synthetic_invocations(300, 30, seed=4)
    path = tmp_path / "azure.csv"
    write_azure_invocations(path, inv)
    header = path.read_text().splitlines()[0].split(",")
    assert header == [*ID_COLUMNS, *map(str, range(1, 31))]
    back = read_azure_invocations(path, trigger=None)
    assert np.array_equal(back.counts, inv.counts)
    assert back.functions.tolist() == inv.functions.tolist()
    assert back.triggers.tolist() == inv.triggers.tolist()
    http = read_azure_invocations(path)
    assert np.array_equal(http.counts, inv.with_trigger("http").counts)


def test_synthetic_is_seeded_heavy_tailed_and_mixed():
    a = synthetic_invocations(5000, 240, seed=7)
    b = synthetic_invocations(5000, 240, seed=7)
    assert np.array_equal(a.counts, b.counts) and a.functions.tolist() == b.functions.tolist()
    assert not np.array_equal(a.counts, synthetic_invocations(5000, 240, seed=8).counts)
    assert {"http", "timer", "queue"} <= set(a.triggers)
    assert 0.4 < np.mean(a.triggers == "http") < 0.7
    totals = np.sort(a.with_trigger("http").totals())[::-1]
    top_1_percent = totals[: len(totals) // 100].sum() / totals.sum()
    assert top_1_percent > 0.25, "the top 1% of functions should get a large share"
    assert np.median(totals) < totals.mean() / 5


def test_synthetic_has_a_daily_rhythm():
    inv = synthetic_invocations(4000, 1440, seed=1, diurnal_amplitude=0.8)
    per_hour = inv.with_trigger("http").counts.sum(axis=0).reshape(24, 60).sum(axis=1)
    assert per_hour.max() > 2 * per_hour.min()


def test_synthetic_scales_to_a_million_requests():
    inv = synthetic_invocations(30_000, 1440, seed=0).with_trigger("http")
    assert inv.totals().sum() >= 1_000_000
    built = build_workload(inv, read_profiles_default(), TraceOptions(quantile=1.0))
    assert len(built.trace) == inv.totals().sum() - np.count_nonzero(inv.totals() == 1)
    assert np.all(np.diff(built.trace.timestamps) >= 0)


def read_profiles_default():
    from cachepolicies.traces import cremebrulee_profiles_path

    return read_profiles(cremebrulee_profiles_path())


# -- popularity filter, event spreading, downsampling ---------------------------------------
def test_popularity_filter_drops_above_quantile_and_one_hit_wonders():
    totals = np.array([0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 50])
    result = filter_by_popularity(totals, quantile=0.9)
    invoked = totals[totals > 0]
    assert result.threshold == pytest.approx(np.quantile(invoked, 0.9))
    assert result.keep.tolist() == [t > 1 and t <= result.threshold for t in totals]
    assert result.too_popular == 1 and result.one_hit == 2 and result.invoked == 11
    kept_one_hit = filter_by_popularity(totals, quantile=0.9, drop_one_hit=False)
    assert kept_one_hit.keep[1] and kept_one_hit.keep[2] and not kept_one_hit.keep[0]
    assert filter_by_popularity(totals, quantile=1.0).keep.sum() == 9


def test_workload_applies_the_filters(azure_csv):
    inv = read_azure_invocations(azure_csv)
    built = build_workload(inv, _profiles([1.0, 2.0]), TraceOptions(quantile=0.8, names="real"))
    # totals: f1 3, f2 4, f3 4, f4 33, f5 1, f6 4, f7 0 -> f4 is above the 0.8 quantile,
    # f5 a one-hit wonder, f7 idle.
    assert built.functions == 4
    assert built.popularity.too_popular == 1 and built.popularity.one_hit == 1
    assert len(built.trace) == 3 + 4 + 4 + 4


def test_events_stay_in_their_minute_and_counts_match():
    rng = np.random.default_rng(0)
    counts = rng.poisson(3.0, size=(20, 15))
    times, rows = spread_over_minutes(counts, np.random.default_rng(1))
    assert len(times) == counts.sum()
    assert np.all(np.diff(times) >= 0)
    minute = np.floor(times / 60).astype(int)
    rebuilt = np.zeros_like(counts)
    np.add.at(rebuilt, (rows, minute), 1)
    assert np.array_equal(rebuilt, counts)
    again, again_rows = spread_over_minutes(counts, np.random.default_rng(1))
    assert np.array_equal(times, again) and np.array_equal(rows, again_rows)
    # Times spread over the whole minute, not bunched at its start.
    within = times - minute * 60
    assert within.min() < 6 and within.max() > 54


def test_timestamps_start_at_the_window():
    counts = np.zeros((2, 3), dtype=np.int32)
    counts[:, 2] = 4
    ids = np.array(["a", "b"], dtype=object)
    inv = InvocationCounts(ids, ids, ids, ids, counts).window(2, 1)
    assert inv.start_minute == 2 and inv.counts.tolist() == [[4], [4]]
    built = build_workload(inv, _profiles([1.0]), TraceOptions(names="real"))
    assert len(built.trace) == 8
    assert 0 <= built.trace.timestamps.min() and built.trace.timestamps.max() < 60
    with pytest.raises(WorkloadError, match="not inside"):
        InvocationCounts(ids, ids, ids, ids, counts).window(2, 5)


def test_downsampling_keeps_the_fraction_and_is_seeded():
    inv = _counts(np.full(500, 20))
    profiles = _profiles([1.0, 2.0, 3.0])
    full = build_workload(inv, profiles, TraceOptions(seed=3))
    tenth = build_workload(inv, profiles, TraceOptions(seed=3, downsample=0.1))
    assert len(full.trace) == 10_000
    assert len(tenth.trace) == 1000
    same = build_workload(inv, profiles, TraceOptions(seed=3, downsample=0.1))
    assert np.array_equal(tenth.trace.timestamps, same.trace.timestamps)
    assert tenth.model_names() == same.model_names()
    other = build_workload(inv, profiles, TraceOptions(seed=4, downsample=0.1))
    assert not np.array_equal(tenth.trace.timestamps, other.trace.timestamps)
    # Uniform: every function keeps about a tenth of its 20 requests (binomial-ish).
    per_model = np.bincount(tenth.trace.model_ids)
    assert per_model.mean() == pytest.approx(2.0, rel=0.25)
    # Nested: a fifth of the same seed holds all of the tenth's requests.
    fifth = build_workload(inv, profiles, TraceOptions(seed=3, downsample=0.2))
    assert set(tenth.trace.timestamps) <= set(fifth.trace.timestamps)


# -- timers ---------------------------------------------------------------------------------
def _schedule(times: np.ndarray) -> tuple[float, float]:
    """(period, largest deviation from the fitted schedule) of one timer's firings."""
    k = np.arange(len(times))
    period, phase = np.polyfit(k, times, 1)
    return period, float(np.abs(times - (phase + period * k)).max())


def test_timers_fire_once_a_period_within_their_jitter():
    rng = np.random.default_rng(2)
    times, rows = timer_events(40, 3600.0, rng, periods=(30.0, 600.0), jitter=0.02)
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < 3600
    assert set(rows.tolist()) == set(range(40))
    periods = []
    for timer in range(40):
        fired = times[rows == timer]
        period, off = _schedule(fired)
        periods.append(period)
        assert 30 * 0.99 <= period <= 600 * 1.01
        # not accumulated: every firing near its schedule (a random walk of 2 % steps
        # would stray ~10 % of a period over a hundred firings)
        assert off <= 0.03 * period, timer
        assert abs(len(fired) - 3600 / period) <= 1.5
    assert min(periods) < 60 and max(periods) > 300  # log-uniform over the range
    exact, _ = timer_events(3, 600.0, np.random.default_rng(1), jitter=0.0)
    again, _ = timer_events(3, 600.0, np.random.default_rng(1), jitter=0.0)
    assert np.array_equal(exact, again)


def test_a_share_of_the_functions_become_timers():
    inv = synthetic_invocations(3000, 60, seed=4).with_trigger("http")
    profiles = _profiles([1.0, 2.0, 3.0])
    plain = build_workload(inv, profiles, TraceOptions(seed=4))
    timed = build_workload(inv, profiles, TraceOptions(seed=4, timer_share=0.5))
    assert plain.timers == 0 and timed.timers == round(0.5 * timed.functions)
    assert timed.functions == plain.functions and len(timed.profiles) == len(plain.profiles)
    regular = []
    for model in range(len(timed.profiles)):
        fired = timed.trace.timestamps[timed.trace.model_ids == model]
        if len(fired) >= 4 and _schedule(fired)[1] <= 0.03 * _schedule(fired)[0]:
            regular.append(model)
    assert abs(len(regular) - timed.timers) <= 0.05 * timed.timers  # a few Poisson lookalikes
    assert len(timed.trace) > 2 * len(plain.trace)  # 30-600 s periods fire often
    # timer_share=0 is the workload as before, request for request
    again = build_workload(inv, profiles, TraceOptions(seed=4, timer_share=0.0))
    assert np.array_equal(again.trace.timestamps, plain.trace.timestamps)


@pytest.mark.parametrize("options, message", [
    (dict(timer_share=1.5), "timer share"), (dict(timer_share=-0.1), "timer share"),
    (dict(timer_periods=(0.0, 10.0)), "timer periods"),
    (dict(timer_periods=(60.0, 30.0)), "timer periods"),
    (dict(timer_jitter=0.5), "timer jitter")])
def test_bad_timer_options_are_named(options, message):
    with pytest.raises(WorkloadError, match=message):
        TraceOptions(**options)


# -- association ----------------------------------------------------------------------------
LOADS = [3.0, 9.0, 1.0, 5.0, 7.0, 2.0]


def _popularity(n: int = 3000) -> np.ndarray:
    return np.random.default_rng(5).zipf(1.7, size=n)


@pytest.mark.parametrize("method, sign", [("quantiles", 1), ("quantiles-r", -1)])
def test_quantile_associations_correlate_popularity_and_load(method, sign):
    popularity = _popularity()
    chosen = associate(popularity, np.array(LOADS), method, np.random.default_rng(0))
    rho = spearmanr(popularity, np.array(LOADS)[chosen]).statistic
    assert sign * rho > 0.6
    # Every profile serves about the same number of functions.
    assert np.bincount(chosen, minlength=len(LOADS)).min() >= len(popularity) // len(LOADS) - 1
    # The most popular function gets the slowest (quantiles) or fastest (-r) model.
    top = int(np.argmax(popularity))
    assert LOADS[chosen[top]] == (max(LOADS) if sign > 0 else min(LOADS))


def test_uniform_association_is_uncorrelated():
    popularity = _popularity()
    chosen = associate(popularity, np.array(LOADS), "uniform", np.random.default_rng(0))
    assert abs(spearmanr(popularity, np.array(LOADS)[chosen]).statistic) < 0.1
    assert set(chosen) == set(range(len(LOADS)))


def test_round_robin_cycles_by_decreasing_load():
    chosen = associate(np.ones(14), np.array(LOADS), "round-robin", np.random.default_rng(0))
    slowest_first = [1, 4, 3, 0, 5, 2]
    assert chosen.tolist() == [slowest_first[i % 6] for i in range(14)]


def test_unknown_association_is_rejected():
    with pytest.raises(WorkloadError, match="unknown association 'zipf'"):
        associate(np.ones(3), np.array(LOADS), "zipf", np.random.default_rng(0))
    with pytest.raises(WorkloadError, match="unknown association"):
        TraceOptions(association="zipf")


# -- names and output files -----------------------------------------------------------------
def test_real_names_share_the_profile_name():
    inv = _counts(np.arange(2, 40))
    profiles = _profiles(LOADS)
    built = build_workload(inv, profiles, TraceOptions(names="real", association="round-robin",
                                                            quantile=1.0))
    assert set(built.model_names()) == set(profiles.names)
    assert len(built.profiles) == len(LOADS)
    for name, size in zip(built.profiles.names, built.profiles.size_bytes):
        assert size == profiles.size_bytes[profiles.index[name]]


def test_distinct_names_give_one_model_per_function():
    inv = _counts(np.arange(2, 40))
    profiles = _profiles(LOADS)
    built = build_workload(inv, profiles, TraceOptions(names="distinct", association="quantiles",
                                                            quantile=1.0))
    assert len(built.profiles) == built.functions == 38
    for i, name in enumerate(built.profiles.names):
        base, _, number = name.rpartition("-")
        assert number.isdigit() and base in profiles.index
        source = profiles.index[base]
        assert built.profiles.size_bytes[i] == profiles.size_bytes[source]
        assert built.profiles.load_seconds[i] == profiles.load_seconds[source]
        assert built.profiles.exec_seconds[i] == profiles.exec_seconds[source]
    # Each model's requests are its function's: counts 2..39, one model each.
    assert sorted(np.bincount(built.trace.model_ids).tolist()) == list(range(2, 40))


@pytest.mark.parametrize("names", ["distinct", "real"])
def test_written_files_read_back_and_simulate(tmp_path, names):
    inv = synthetic_invocations(2000, 60, seed=2).with_trigger("http")
    built = build_workload(inv, read_profiles_default(),
                           TraceOptions(association="quantiles-r", names=names, seed=1))
    trace_path, profiles_path = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    write_trace(trace_path, built.trace.timestamps, built.model_names())
    write_profiles(profiles_path, built.profiles)
    assert trace_path.read_text().startswith("timestamp,model\n")
    assert profiles_path.read_text().startswith("model,size_bytes,load_seconds,exec_seconds\n")
    profiles = read_profiles(profiles_path)
    trace = read_trace(trace_path, profiles)
    assert len(trace) == len(built.trace)
    assert np.all(np.diff(trace.timestamps) >= 0)
    assert np.allclose(trace.timestamps, built.trace.timestamps, atol=1e-6)
    assert [profiles.names[i] for i in trace.model_ids] == built.model_names()
    capacity = int(profiles.size_bytes.sum() // 4)
    result = simulate(trace, profiles, max(capacity, int(profiles.size_bytes.max())), "lru")
    assert result.requests == len(trace) and result.misses > 0


def test_write_profiles_keeps_first_exec():
    profiles = make_profiles(["a", "b"], [10, 20], [1.5, 2.0], [0.1, 0.2], [0.3, float("nan")])
    out = io.StringIO()
    write_profiles(out, profiles)
    assert out.getvalue() == ("model,size_bytes,load_seconds,exec_seconds,first_exec_seconds\n"
                              "a,10,1.5,0.1,0.3\nb,20,2,0.2,\n")


def test_names_with_commas_are_quoted(tmp_path):
    profiles = make_profiles(["plain", 'odd, "one"'], [10, 20], [1.0, 2.0], [0.1, 0.2])
    write_profiles(tmp_path / "p.csv", profiles)
    write_trace(tmp_path / "t.csv", np.array([0.0, 1.0, 2.0]), ["plain", 'odd, "one"', "plain"])
    back = read_profiles(tmp_path / "p.csv")
    assert back.names == profiles.names
    trace = read_trace(tmp_path / "t.csv", back)
    assert trace.model_ids.tolist() == [0, 1, 0]
