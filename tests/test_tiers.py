"""The simulator's disk tier (cachepolicies/tiers.py): a miss across remote → disk →
memory, the rule that the disk never evicts files in use, the download paid once per
pull, and the penalty the memory policy sees (the download only when not on disk)."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli import main
from cachepolicies import make_policy
from cachepolicies import simulator as simulator_module
from cachepolicies.pool import miss_penalty
from cachepolicies.simulator import simulate
from cachepolicies.tiers import DiskBooks
from cachepolicies.traces import (SimulationInputError, make_profiles, make_trace,
                                  read_profiles)
from cachepolicies.twin import Queueing

LOAD, EXEC = 1.0, 0.1


def tiered(downloads, sizes=None, disk=None, first_exec=None):
    """Profiles of models a, b, c, ... with the given download seconds."""
    names = [chr(ord("a") + i) for i in range(len(downloads))]
    n = len(names)
    return make_profiles(names, sizes or [100] * n, [LOAD] * n, [EXEC] * n, first_exec,
                         download_seconds=downloads, disk_bytes=disk)


def trace_of(profiles, models, step=10.0):
    return make_trace([step * i for i in range(len(models))], list(models), profiles)


def test_miss_penalty_adds_the_download():
    assert miss_penalty(1.0, 1.5, 0.5, 3.0) == pytest.approx(5.0)
    assert miss_penalty(1.0) == pytest.approx(1.0)
    got = miss_penalty(np.array([1.0, 2.0]), None, None, np.array([0.5, 0.0]))
    assert got.tolist() == [1.5, 2.0]


def test_without_a_disk_capacity_downloads_change_nothing():
    """No --disk-capacity: the files are on disk throughout, as before the tier existed."""
    with_column = tiered([5.0, 7.0, 9.0])
    without = make_profiles(["a", "b", "c"], [100] * 3, [LOAD] * 3, [EXEC] * 3)
    models = "abcabcaabbc"
    for queueing in (None, Queueing(workers=2)):
        got = simulate(trace_of(with_column, models), with_column, 200, "lru", queueing=queueing)
        want = simulate(trace_of(without, models), without, 200, "lru", queueing=queueing)
        assert got.to_dict() == want.to_dict()
        assert "downloads" not in got.to_dict()


def test_a_download_is_paid_once_while_the_files_stay_on_disk():
    """Memory holds one model, the disk two: a and b alternate, so every request is a
    memory miss, but each is downloaded once and then loads from disk."""
    profiles = tiered([5.0, 3.0])
    result = simulate(trace_of(profiles, "ababab"), profiles, 100, "lru", disk_capacity=200)
    assert (result.misses, result.downloads) == (6, 2)
    assert result.bytes_downloaded == 200
    assert result.download_delay_seconds == pytest.approx(8.0)
    assert result.load_delay_seconds == pytest.approx(6 * LOAD + 8.0)
    assert result.disk_evictions == 0


def test_a_disk_too_small_for_the_working_set_pulls_again():
    """Disk for one model: a, b, a each miss memory (room for one) and the disk."""
    profiles = tiered([5.0, 3.0])
    result = simulate(trace_of(profiles, "aba"), profiles, 100, "lru", disk_capacity=100)
    assert (result.downloads, result.disk_evictions) == (3, 2)
    assert result.load_delay_seconds == pytest.approx(3 * LOAD + 13.0)


def test_the_disk_evicts_the_files_of_idle_models_before_those_in_memory():
    """Memory (by popularity) keeps a, requested three times; b leaves it for c. For d,
    the disk (LRU) would drop a's files first, but b is idle (not in memory): b's go."""
    profiles = tiered([5.0, 3.0, 2.0, 1.0])
    trace = trace_of(profiles, "aaabcd")
    policy, disk_policy = make_policy("popularity"), make_policy("lru")
    disk = DiskBooks(300, disk_policy, profiles)
    simulator_module._replay(trace, profiles, 200, policy, disk)
    assert sorted(policy.resident()) == [0, 3]         # a and d in memory
    assert disk_policy._candidates(60.0)[0] == 0       # a's files are LRU on disk ...
    assert sorted(disk.pool.resident()) == [0, 2, 3]   # ... yet b's went
    assert disk.downloads == [1, 1, 1, 1]


def test_a_resident_model_whose_files_are_evicted_costs_its_download_again():
    """Memory for two, disk for one: a is pulled; b's pull finds only a's files, a in
    memory, and evicts them (no idle files to take): a's memory penalty now counts its
    download, b's does not."""
    profiles = tiered([5.0, 3.0], first_exec=[1.5, 1.5])
    trace = trace_of(profiles, "abb")
    policy = make_policy("lru")
    disk = DiskBooks(100, make_policy("lru"), profiles)
    simulator_module._replay(trace, profiles, 200, policy, disk)
    surplus = 1.5 - EXEC
    assert policy.penalty_of(0) == pytest.approx(LOAD + surplus + 5.0)
    assert policy.penalty_of(1) == pytest.approx(LOAD + surplus)
    assert list(disk.pool.resident()) == [1]
    assert disk.downloads == [1, 1]


def test_a_model_evicted_from_disk_but_in_memory_is_served_and_pulled_again_to_reload():
    """a's files go for b's while a stays in memory: a's requests are hits (nothing
    pulled); once a has left memory, its next request pulls it again."""
    profiles = tiered([5.0, 3.0, 1.0])
    result = simulate(trace_of(profiles, "abaa"), profiles, 200, "lru", disk_capacity=100)
    assert (result.hits, result.misses, result.downloads) == (2, 2, 2)
    again = simulate(trace_of(profiles, "abaaca"), profiles, 200, "lru", disk_capacity=100)
    # c takes b's files (b in memory) and a's place in memory: a's reload pulls again
    assert (again.hits, again.misses, again.downloads) == (2, 4, 4)
    assert again.load_delay_seconds == pytest.approx(4 * LOAD + 5.0 + 3.0 + 1.0 + 5.0)


def test_queueing_a_cold_miss_waits_for_download_load_and_run():
    profiles = tiered([4.0, 2.0])
    result = simulate(trace_of(profiles, "aa", step=20.0), profiles, 100, "lru", queueing=Queueing(workers=1),
                      disk_capacity=100)
    assert result.mean_response_seconds == pytest.approx(((4.0 + LOAD + EXEC) + EXEC) / 2)
    # a request arriving during the pull waits for it (single flight): one download
    profiles = tiered([4.0])
    trace = make_trace([0.0, 1.0], ["a", "a"], profiles)
    result = simulate(trace, profiles, 100, "lru", queueing=Queueing(workers=2), disk_capacity=100)
    assert result.downloads == 1
    assert result.mean_response_seconds == pytest.approx(((5 + EXEC) + (4 + EXEC)) / 2)


def test_queueing_keeps_the_files_of_a_model_being_loaded():
    """b's files must stay while b loads, even though b is not yet in memory."""
    profiles = tiered([0.5, 0.5, 0.5])
    trace = make_trace([0.0, 0.1, 0.2], ["a", "b", "c"], profiles)
    result = simulate(trace, profiles, 300, "lru", queueing=Queueing(workers=3), disk_capacity=200)
    # a, b kept; c's pull finds a and b loading: streamed, nothing evicted
    assert (result.downloads, result.disk_evictions) == (3, 0)


def test_twin_a_download_does_not_hold_a_load_slot():
    """The agent's load task pulls first, then takes a load slot: with one slot, b (a
    0 s download) loads while a still downloads, and a's wait for the slot does not
    count its download."""
    profiles = tiered([3.0, 0.0])
    trace = make_trace([0.0, 0.0], ["a", "b"], profiles)
    result = simulate(trace, profiles, 200, "lru", disk_capacity=200,
                      queueing=Queueing(load_concurrency=1))
    # b: load 1 + run 0.1 at once; a: download 3, then its slot is free: load 1 + run 0.1
    assert result.mean_response_seconds == pytest.approx(((3 + LOAD + EXEC) + (LOAD + EXEC)) / 2)
    assert result.load_wait_seconds == pytest.approx(0.0)
    assert (result.downloads, result.misses) == (2, 2)
    # a pull waiting on a slot taken by a long load starts its load when the slot frees
    profiles = tiered([0.5, 0.0], first_exec=[EXEC, 5.0 + EXEC])  # b's load: 6 s
    trace = make_trace([0.0, 0.0], ["b", "a"], profiles)
    waited = simulate(trace, profiles, 200, "lru", disk_capacity=200,
                      queueing=Queueing(load_concurrency=1))
    assert waited.load_wait_seconds == pytest.approx(6.0 - 0.5)  # from its pull's end
    assert waited.mean_response_seconds == pytest.approx(((6 + EXEC) + (6 + LOAD + EXEC)) / 2)


def test_twin_pulls_wait_for_a_pull_slot_in_turn_and_keep_to_the_bandwidth():
    """The agent's ``max_concurrent_pulls`` (a semaphore: first come, first served) and
    ``pull_bandwidth`` (a cap per pull): three models asked at once with one pull slot
    download one after the other; two slots, two at a time; a cap stretches each."""
    profiles = tiered([2.0, 2.0, 2.0])
    trace = make_trace([0.0, 0.0, 0.0], ["a", "b", "c"], profiles)

    def responses(**settings):
        result = simulate(trace, profiles, 300, "lru", disk_capacity=300,
                          queueing=Queueing(workers=1, load_concurrency=3, **settings))
        assert result.downloads == 3
        return result.mean_response_seconds, result.download_delay_seconds

    run = LOAD + EXEC
    assert responses()[0] == pytest.approx(2 + run)  # unbounded: all at once
    assert responses(max_concurrent_pulls=1)[0] == pytest.approx((2 + 4 + 6) / 3 + run)
    assert responses(max_concurrent_pulls=2)[0] == pytest.approx((2 + 2 + 4) / 3 + run)
    # 100 bytes at 25 bytes/s: 4 s a pull, at least; its measured 2 s where faster
    assert responses(max_concurrent_pulls=1, pull_bandwidth=25) == pytest.approx(
        ((4 + 8 + 12) / 3 + run, 12.0))
    assert responses(max_concurrent_pulls=1, pull_bandwidth=1000) == pytest.approx(
        ((2 + 4 + 6) / 3 + run, 6.0))
    with pytest.raises(ValueError, match="max_concurrent_pulls must be >= 1"):
        Queueing(max_concurrent_pulls=0)
    with pytest.raises(ValueError, match="pull_bandwidth must be > 0"):
        Queueing(pull_bandwidth=0)


def lru_reference(trace, sizes, disk_sizes, memory, disk):
    """Memory and disk as two LRU dicts, written out independently of the pools: a miss
    pulls first, making room from idle files (not in memory) when they suffice, else
    from any (a resident model whose files go is re-admitted: most recent in memory);
    then memory evicts least recent first. (loads, downloads)."""
    mem, files = OrderedDict(), OrderedDict()
    loads = downloads = 0
    for key in trace:
        if key in files:
            files.move_to_end(key)
        if key in mem:
            mem.move_to_end(key)
            continue
        if key not in files:
            downloads += 1
            need = disk_sizes[key] - (disk - sum(disk_sizes[k] for k in files))
            idle = [k for k in files if k not in mem]
            pick = idle if sum(disk_sizes[k] for k in idle) >= need else list(files)
            for k in pick:
                if need <= 0:
                    break
                del files[k]
                need -= disk_sizes[k]
                if k in mem:
                    mem.move_to_end(k)
            files[key] = True
        while sum(sizes[k] for k in mem) + sizes[key] > memory:
            mem.popitem(last=False)
        mem[key] = True
        loads += 1
    return loads, downloads


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60),
       st.lists(st.integers(1, 4), min_size=6, max_size=6),
       st.lists(st.integers(1, 4), min_size=6, max_size=6),
       st.integers(4, 12), st.integers(4, 16))
def test_lru_on_both_tiers_matches_a_reference(picks, sizes, disk_sizes, memory, disk):
    profiles = tiered([1.0 + i for i in range(6)], sizes=[s * 10 for s in sizes],
                      disk=[s * 10 for s in disk_sizes])
    trace = trace_of(profiles, [chr(ord("a") + p) for p in picks], step=1.0)
    result = simulate(trace, profiles, memory * 10, "lru", disk_capacity=disk * 10)
    want = lru_reference(picks, [s * 10 for s in sizes], [s * 10 for s in disk_sizes],
                         memory * 10, disk * 10)
    assert (result.misses, result.downloads) == want


@pytest.mark.parametrize("policy", ["cremebrulee", "gdsf", "beladymin", "cremebrulee-oracle"])
def test_every_policy_runs_on_both_tiers_and_the_books_add_up(policy):
    rng = np.random.default_rng(3)
    profiles = tiered(rng.uniform(0.5, 5, 8).tolist(), sizes=rng.integers(10, 40, 8).tolist())
    picks = rng.choice(8, 300, p=np.arange(8, 0, -1) / 36)
    trace = trace_of(profiles, [chr(ord("a") + int(p)) for p in picks], step=0.5)
    result = simulate(trace, profiles, 80, policy, disk_capacity=150)
    assert result.misses >= result.downloads >= len(set(picks.tolist()))
    assert result.load_delay_seconds == pytest.approx(
        result.misses * LOAD + result.download_delay_seconds)
    # the same memory decisions as one tier (files are kept; nothing streams here)
    one_tier = simulate(trace, profiles, 80, policy)
    assert result.misses == one_tier.misses


def test_profiles_read_the_disk_columns_and_name_bad_values(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("model,size_bytes,load_seconds,exec_seconds,download_seconds,disk_bytes\n"
                    "a,100,1,0.1,2.5,40\nb,100,1,0.1,0,60\n")
    profiles = read_profiles(path)
    assert profiles.download_seconds.tolist() == [2.5, 0.0]
    assert profiles.disk_bytes.tolist() == [40, 60]
    path.write_text("model,size_bytes,load_seconds,exec_seconds,download_seconds\n"
                    "a,100,1,0.1,2\nb,100,1,0.1,-1\n")
    with pytest.raises(SimulationInputError, match=r"line 3, column 'download_seconds'"):
        read_profiles(path)
    path.write_text("model,size_bytes,load_seconds,exec_seconds,disk_bytes\na,100,1,0.1,1.5\n")
    with pytest.raises(SimulationInputError, match="column 'disk_bytes': 1.5 is not a whole"):
        read_profiles(path)


def test_a_model_larger_than_the_disk_is_an_error_before_the_run():
    profiles = tiered([1.0, 1.0], disk=[50, 500])
    with pytest.raises(SimulationInputError, match="'b' needs 500 bytes on disk"):
        simulate(trace_of(profiles, "ab"), profiles, 200, "lru", disk_capacity=100)


@pytest.fixture
def files(tmp_path):
    profiles = tmp_path / "profiles.csv"
    profiles.write_text("model,size_bytes,load_seconds,exec_seconds,download_seconds\n"
                        "a,100,1,0.1,5\nb,100,1,0.1,2\nc,100,1,0.1,0.5\n")
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model\n" + "".join(
        f"{i},{m}\n" for i, m in enumerate("abcabcabca")))
    return ["--trace", trace, "--profiles", profiles, "--capacity", "200"]


def run(*args):
    return CliRunner().invoke(main, ["simulate", *map(str, args)])


def test_cli_disk_capacity_and_policy(files):
    result = run(*files, "--policy", "cremebrulee", "--disk-capacity", "200",
                 "--disk-policy", "lru", "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["disk_capacity_bytes"] == 200 and row["disk_policy"] == "lru"
    assert row["downloads"] >= 3
    table = run(*files, "--policy", "lru", "--disk-capacity", "300B", "--queueing")
    assert table.exit_code == 0, table.output
    header, line = table.output.splitlines()
    assert header.split()[-6:] == ["disk", "disk_policy", "downloads", "download_s",
                                   "pulled", "disk_evictions"]
    assert line.split()[-6:-3] == ["300B", "lru", "3"]  # each pulled once, kept


@pytest.mark.parametrize("args, message", [
    (["--disk-policy", "lru"], "--disk-policy needs --disk-capacity"),
    (["--disk-capacity", "lots"], "--disk-capacity"),
    (["--disk-capacity", "50"], "needs 100 bytes on disk"),
    (["--disk-capacity", "1GB", "--disk-policy", "nosuch"], "nosuch"),
])
def test_cli_bad_disk_options_are_named(files, args, message):
    result = run(*files, "--policy", "lru", *args)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_workload_keeps_the_disk_columns_of_its_profiles():
    """``workload trace`` pairs functions with profiles: their downloads come along."""
    from cachepolicies.workloads import TraceOptions, build_workload, synthetic_invocations

    base = tiered([1.0, 2.0, 3.0], sizes=[100, 200, 300], disk=[10, 20, 30])
    invocations = synthetic_invocations(300, 30, seed=4).with_trigger("http")
    for names in ("real", "distinct"):
        work = build_workload(invocations, base, TraceOptions(names=names, seed=1))
        p = work.profiles
        assert len(p) > 0
        # each model carries the download and disk bytes of the profile it was given
        by_size = {100: (1.0, 10), 200: (2.0, 20), 300: (3.0, 30)}
        assert [by_size[s] for s in p.size_bytes.tolist()] == list(
            zip(p.download_seconds.tolist(), p.disk_bytes.tolist()))
