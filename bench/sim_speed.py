"""Simulator speed: parse time, requests/s per policy, and libCacheSim's LRU as a baseline.

Makes a synthetic Azure-style workload (``cachepolicies.workloads``: heavy-tailed
popularity, a day of invocations, the paper's filtering) with >= 1M requests over >= 30k
models, writes it as the simulator's CSV files, then times (medians of ``--reps`` runs):

- parsing the trace + profiles CSVs (``read_profiles`` + ``read_trace``);
- ``simulate`` per policy at two capacities (a small and a larger one), as requests/s;
- libCacheSim's own C simulator (pip ``libcachesim``) running LRU on the same trace as
  a CSV with a size column (its reader parses while it simulates), and checks that its
  LRU miss count equals ours.

The policies and the replay loop are numba kernels: each policy's first ``simulate`` in
a process compiles them (the first run after an install or an edit) or loads them from
numba's cache; that first call is timed and printed apart, before the timed rounds.

Ratios printed: ours (parse + LRU) / libCacheSim (read + LRU), target <= 1.5; and
cremebrulee / our LRU (simulation only), target <= 2. Then the same as whole processes,
the way a user runs them: ``edgeagent simulate ... --policy lru --json`` (its replay
compiled ahead of time, ``cachepolicies.native``) vs a Python process that imports
libCacheSim, reads the CSV and runs its LRU, target <= 1.0 (issue 40; issue 14's was
1.5), beside the same with numba's JIT (``EDGEAGENT_JIT=1``, as before issue 40); and
the cremebrulee process / the LRU process, target <= 2. Wall times, and for the
processes also their CPU time (user + system): the machine is shared, so expect noise;
the load average is printed. Each process command runs once untimed first (the replay
built, numba's kernel cache and Python's bytecode cache filled, as on a user's second
run), and the processes run without PYTHONDONTWRITEBYTECODE, as a user's shell does.

    .venv/bin/python bench/sim_speed.py [--functions 100000] [--reps 3] [--policies lru,...]
                                        [--processes-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cachepolicies.simulator import simulate
from cachepolicies.traces import cremebrulee_profiles_path, read_profiles, read_trace
from cachepolicies.twin import Queueing
from cachepolicies.workloads import (
    TraceOptions,
    build_workload,
    synthetic_invocations,
    write_profiles,
    write_trace,
)

POLICIES = ("lru", "cremebrulee", "gdsf", "popularity", "random", "beladymin",
            "cremebrulee-oracle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=100_000,
                        help="synthetic functions (all triggers); 100k gives ~1M requests")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per measurement")
    parser.add_argument("--capacity-shares", default="0.04,0.3",
                        help="capacities as shares of all models' bytes, comma-separated "
                             "(0.04 ~ the paper's 128GB of 2.9TB)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--processes-only", action="store_true",
                        help="time only the whole processes (skip the in-process rounds)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where to write the CSVs [default: a temporary directory]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, args.workdir or Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    trace_csv, profiles_csv, lcs_csv = (workdir / "trace.csv", workdir / "profiles.csv",
                                        workdir / "trace-with-sizes.csv")
    t0 = time.perf_counter()
    invocations = synthetic_invocations(args.functions, 1440, seed=1).with_trigger("http")
    workload = build_workload(invocations, read_profiles(cremebrulee_profiles_path()),
                              TraceOptions(association="quantiles-r", seed=1))
    names = workload.model_names()
    write_trace(trace_csv, workload.trace.timestamps, names)
    write_profiles(profiles_csv, workload.profiles)
    sizes = workload.profiles.size_bytes[workload.trace.model_ids]
    _write_sized_csv(lcs_csv, workload.trace.timestamps, names, sizes)
    print(f"workload: {len(names):,} requests over {len(workload.profiles):,} models, "
          f"{workload.profiles.size_bytes.sum() / 1e12:.1f} TB in all "
          f"(generated and written in {time.perf_counter() - t0:.1f} s)")

    profiles = read_profiles(profiles_csv)
    trace = read_trace(trace_csv, profiles)
    n = len(trace)
    total = int(profiles.size_bytes.sum())
    shares = [float(x) for x in args.capacity_shares.split(",")]
    capacities = [max(int(share * total), int(profiles.size_bytes.max())) for share in shares]
    specs = args.policies.split(",")

    if args.processes_only:
        _whole_processes(args, trace_csv, profiles_csv, lcs_csv, capacities, total,
                         [s for s in ("lru", "cremebrulee") if s in specs])
        return

    # The first call per policy, on a few requests (both loops: plain and queueing).
    tiny = dataclasses.replace(trace, timestamps=trace.timestamps[:1000],
                               model_ids=trace.model_ids[:1000])
    for spec in specs:
        t = time.perf_counter()
        simulate(tiny, profiles, capacities[0], spec)
        simulate(tiny, profiles, capacities[0], spec, queueing=Queueing(workers=2))
        print(f"first call (compile or load the kernels) {spec}: {time.perf_counter() - t:.1f} s")

    # Interleaved repetitions: parse, libCacheSim, then every policy, per round, so
    # that load from other processes hits all of them alike; medians over the rounds.
    parse, lcs, sim = [], {c: [] for c in capacities}, {}
    misses, hit_ratio, lcs_misses = {}, {}, {}
    for _ in range(args.reps):
        t = time.perf_counter()
        read_trace(trace_csv, read_profiles(profiles_csv))
        parse.append(time.perf_counter() - t)
        for capacity in capacities:
            seconds, lcs_misses[capacity] = _libcachesim_lru(lcs_csv, capacity, n)
            lcs[capacity].append(seconds)
            for spec in specs:
                t = time.perf_counter()
                result = simulate(trace, profiles, capacity, spec)
                sim.setdefault((spec, capacity), []).append(time.perf_counter() - t)
                misses[spec, capacity] = result.misses
                hit_ratio[spec, capacity] = result.hit_ratio

    med = statistics.median
    print(f"parse (trace + profiles CSV): {med(parse):.3f} s median "
          f"({n / med(parse) / 1e6:.1f} M rows/s); runs: " + _runs(parse))
    for capacity in capacities:
        print(f"\ncapacity {capacity / 1e9:,.0f} GB ({capacity / total:.0%} of all models' bytes)")
        print(f"  {'policy':<22}{'median s':>9}{'req/s':>11}{'hit%':>7}   runs (s)")
        for spec in specs:
            runs = sim[spec, capacity]
            print(f"  {spec:<22}{med(runs):>9.3f}{n / med(runs):>11,.0f}"
                  f"{100 * hit_ratio[spec, capacity]:>7.1f}   " + _runs(runs))
        runs = lcs[capacity]
        print(f"  {'libCacheSim LRU (C)':<22}{med(runs):>9.3f}{n / med(runs):>11,.0f}"
              f"{100 * (1 - lcs_misses[capacity] / n):>7.1f}   " + _runs(runs))
        if "lru" not in specs:
            continue
        ours = misses["lru", capacity]
        agree = "agree" if ours == lcs_misses[capacity] else "DIFFER"
        print(f"  LRU misses: ours {ours:,}, libCacheSim {lcs_misses[capacity]:,} ({agree})")
        lru = sim["lru", capacity]
        end_to_end = [(p + s) / c for p, s, c in zip(parse, lru, runs)]
        print(f"  ours (parse + LRU) / libCacheSim (read + LRU): {med(end_to_end):.2f}x "
              f"median of rounds (target <= 1.5x)")
        print(f"  ours (LRU only)    / libCacheSim (read + LRU): "
              f"{med([s / c for s, c in zip(lru, runs)]):.2f}x")
        if "cremebrulee" in specs:
            cb = sim["cremebrulee", capacity]
            print(f"  cremebrulee / our LRU (simulation): "
                  f"{med([a / b for a, b in zip(cb, lru)]):.2f}x (target <= 2x)")
    _whole_processes(args, trace_csv, profiles_csv, lcs_csv, capacities, total,
                     [s for s in ("lru", "cremebrulee") if s in specs])


# libCacheSim as a process of its own: its Python bindings, the CSV read and LRU.
_LCS_PROCESS = """
import sys
import libcachesim as lcs
params = lcs.ReaderInitParam(has_header=True, delimiter=",", obj_id_is_num=False)
params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
reader = lcs.TraceReader(sys.argv[1], lcs.TraceType.CSV_TRACE, params)
print(lcs.LRU(int(sys.argv[2])).process_trace(reader)[0])
"""


def _whole_processes(args: argparse.Namespace, trace_csv: Path, profiles_csv: Path,
                     lcs_csv: Path, capacities: list[int], total: int,
                     specs: list[str]) -> None:
    """Wall times of whole processes, start-up included, interleaved; medians."""
    edgeagent = Path(sys.executable).with_name("edgeagent")
    if not edgeagent.exists() or not specs:
        print("\nwhole processes: skipped (no edgeagent script or neither lru nor cremebrulee)")
        return

    # Both processes as a user's shell runs them: Python's default bytecode cache, as
    # pip's .pyc files serve libCacheSim (a sandbox's PYTHONDONTWRITEBYTECODE would make
    # edgeagent's own modules, an editable install, compile from source on every run).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def timed(command: list[str]) -> tuple[float, float]:
        """(wall seconds, CPU seconds: user + system of the process and its threads);
        a command starting ``EDGEAGENT_JIT=1`` runs with that variable set."""
        run_env = env
        if command[0].startswith("EDGEAGENT_JIT="):
            run_env = {**env, "EDGEAGENT_JIT": command[0].partition("=")[2]}
            command = command[1:]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=run_env)
        if done.returncode:
            sys.exit(f"{command[:2]} failed: {done.stderr[-2000:]}")
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    runs: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}

    def record(key: tuple[str, int], command: list[str]) -> None:
        wall, seconds = timed(command)
        runs.setdefault(key, []).append(wall)
        cpu.setdefault(key, []).append(seconds)

    def commands(capacity: int) -> dict[str, list[str]]:
        lcs = [sys.executable, "-c", _LCS_PROCESS, str(lcs_csv), str(capacity)]
        ours = {spec: [str(edgeagent), "simulate", "--trace", str(trace_csv), "--profiles",
                       str(profiles_csv), "--capacity", str(capacity), "--policy", spec,
                       "--json"] for spec in specs}
        jit = {} if "lru" not in ours else {"lru, numba's JIT": ["EDGEAGENT_JIT=1", *ours["lru"]]}
        return {"libCacheSim": lcs, **ours, **jit}

    # One untimed run of each first, as a user's second run: numba's cache is filled
    # (compiled after an edit of cachepolicies), and Python's bytecode cache too.
    for name, command in commands(capacities[0]).items():
        wall, _ = timed(command)
        print(f"whole processes: first run of {name} (untimed): {wall:.2f} s")
    load_before = os.getloadavg()
    for _ in range(args.reps):
        for capacity in capacities:
            for name, command in commands(capacity).items():
                record((name, capacity), command)
    load_after = os.getloadavg()
    med = statistics.median
    print("\nwhole processes (start-up, parse and simulation; `edgeagent simulate --json` "
          "vs python + libCacheSim); wall s, then CPU s (user + system, all threads: "
          "steadier on a shared machine)")
    print(f"  load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"{os.cpu_count()} CPUs; both with Python's bytecode cache (no "
          f"PYTHONDONTWRITEBYTECODE)")
    for capacity in capacities:
        lcs, lcs_cpu = runs["libCacheSim", capacity], cpu["libCacheSim", capacity]
        print(f"  capacity {capacity / 1e9:,.0f} GB ({capacity / total:.0%}): "
              f"libCacheSim LRU {med(lcs):.2f} s (" + _runs(lcs) + f"), CPU {med(lcs_cpu):.2f} s")
        for spec in specs:
            print(f"    edgeagent simulate --policy {spec}: {med(runs[spec, capacity]):.2f} s ("
                  + _runs(runs[spec, capacity]) + f"), CPU {med(cpu[spec, capacity]):.2f} s")
        if "lru" in specs:
            jit, jit_cpu = runs["lru, numba's JIT", capacity], cpu["lru, numba's JIT", capacity]
            print(f"    EDGEAGENT_JIT=1 edgeagent simulate --policy lru (numba's JIT, as "
                  f"before): {med(jit):.2f} s (" + _runs(jit) + f"), CPU {med(jit_cpu):.2f} s")
            lru, lru_cpu = runs["lru", capacity], cpu["lru", capacity]
            print(f"    edgeagent LRU / libCacheSim LRU: "
                  f"{med([a / b for a, b in zip(lru, lcs)]):.2f}x wall, "
                  f"{med([a / b for a, b in zip(lru_cpu, lcs_cpu)]):.2f}x CPU (target <= 1.0x)")
            print(f"    with numba's JIT / libCacheSim LRU: "
                  f"{med([a / b for a, b in zip(jit, lcs)]):.2f}x wall, "
                  f"{med([a / b for a, b in zip(jit_cpu, lcs_cpu)]):.2f}x CPU")
            if "cremebrulee" in specs:
                cb, cb_cpu = runs["cremebrulee", capacity], cpu["cremebrulee", capacity]
                print(f"    edgeagent cremebrulee / edgeagent LRU: "
                      f"{med([a / b for a, b in zip(cb, lru)]):.2f}x wall, "
                      f"{med([a / b for a, b in zip(cb_cpu, lru_cpu)]):.2f}x CPU (target <= 2x)")


def _runs(times: list[float]) -> str:
    return " ".join(f"{t:.2f}" for t in times)


def _write_sized_csv(path: Path, timestamps: np.ndarray, names: list[str],
                     sizes: np.ndarray) -> None:
    """The trace with a size column, for libCacheSim's CSV reader (time,obj_id,size)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("timestamp,model,size_bytes\n")
        f.writelines(map("{:.6f},{},{}\n".format, timestamps.tolist(), names, sizes.tolist()))


def _libcachesim_lru(path: Path, capacity: int, requests: int) -> tuple[float, int]:
    """Wall time of libCacheSim reading ``path`` and simulating LRU, and its miss count."""
    import libcachesim as lcs

    t = time.perf_counter()
    params = lcs.ReaderInitParam(has_header=True, delimiter=",", obj_id_is_num=False)
    params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
    reader = lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, params)
    miss_ratio, _ = lcs.LRU(capacity).process_trace(reader)
    return time.perf_counter() - t, round(miss_ratio * requests)


if __name__ == "__main__":
    main()
