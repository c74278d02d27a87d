"""``edgeagent simulate`` pays no start-up it does not need (issue 14's whole-process
simulator): the trace is dictionary-encoded by the CSV reader (no ``pyarrow.compute``),
pandas never loads, and cached kernels load without numba's implementation registries
(``cachepolicies.jit``: no arraymath, hence no ``scipy.linalg``, no polynomials, random
generators or typed containers). A process that compiles the kernels (a cold cache)
still skips ``scipy.linalg``; a kernel that does use BLAS (``np.dot``) and one that needs
the skipped registries (a typed dict) still compile in the same process afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = '''
import json, sys
from agent.cli import main
try:
    main(["simulate", "--trace", sys.argv[1], "--profiles", sys.argv[2], "--capacity", "25",
          "--policy", "lru", "--json"], standalone_mode=False)
except SystemExit:
    pass
loaded = [m for m in ("scipy.linalg", "numpy.f2py", "pyarrow.compute", "pandas",
                      "numba.np.arraymath", "numba.np.polynomial.polynomial_core", "numba.np.random.generator_core",
                      "numba.typed.typeddict")
          if m in sys.modules]
import numpy as np
from numba import njit

@njit
def dot(a, b):
    return np.dot(a, b)

@njit
def counts(keys):
    seen = {keys[0]: 0}
    for k in keys:
        seen[k] = seen.get(k, 0) + 1
    return len(seen)

print(json.dumps({"loaded": loaded,
                  "dot": float(dot(np.arange(3.0), np.arange(3.0))),
                  "counts": counts(np.array([1, 2, 2, 5]))}))
'''


def test_simulate_process_imports_and_blas(tmp_path):
    trace, profiles = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    profiles.write_text("model,size_bytes,load_seconds,exec_seconds\n"
                        "a,10,1,0.1\nb,10,2,0.1\nc,10,3,0.1\n")
    trace.write_text("timestamp,model\n" + "".join(
        f"{t},{m}\n" for t, m in enumerate("abcabcaabbcc")))
    # A cache of its own: the first process compiles the kernels, the second loads them;
    # numba's JIT (EDGEAGENT_JIT=1), the path where no ahead-of-time replay is had.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "EDGEAGENT_JIT": "1"}
    reports = []
    for _ in ("compiles", "loads"):
        done = subprocess.run([sys.executable, "-c", CHILD, str(trace), str(profiles)],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.strip().splitlines()
        result = json.loads("\n".join(lines[:-1]))
        assert result[0]["policy"] == "lru" and result[0]["misses"] == 9  # 2 of 3 fit: thrash
        reports.append(json.loads(lines[-1]))
    compiled, loaded = reports
    assert "scipy.linalg" not in compiled["loaded"] and "numpy.f2py" not in compiled["loaded"]
    assert "numba.np.arraymath" in compiled["loaded"]  # compiling installs every registry
    assert loaded["loaded"] == []
    for report in reports:
        assert report["dot"] == 5.0
        assert report["counts"] == 3


def test_the_trace_readers_load_without_numba():
    """``edgeagent simulate`` parses the CSVs in a thread while the main thread imports
    the policies; that overlap needs the readers (and the pool) free of numba."""
    child = ("import sys, cachepolicies.traces, cachepolicies.pool\n"
             "print('numba' in sys.modules)\n"
             "from cachepolicies import InsufficientSpace, make_policy\n"
             "from cachepolicies.base import InsufficientSpace as raised\n"
             "print('numba' in sys.modules, raised is InsufficientSpace)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EDGEAGENT_JIT", None)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True", "True"]


# -- the replays compiled ahead of time (cachepolicies.native) ---------------------------
def _c_compiler() -> str | None:
    """The C compiler setuptools would run (numba.pycc builds the modules with it)."""
    import shutil
    import sysconfig

    command = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(command.split()[0])


needs_a_c_compiler = pytest.mark.skipif(
    _c_compiler() is None, reason="no C compiler: simulate falls back to numba's JIT "
    "(test_a_failed_build_leaves_a_note_and_numba_replays)")

RUN_CLI = '''
import json, sys
from agent.cli import main
try:
    main(["simulate", "--trace", sys.argv[1], "--profiles", sys.argv[2], "--capacity",
          sys.argv[3], *[arg for spec in sys.argv[4:] for arg in ("--policy", spec)],
          "--json"], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps({"numba": "numba" in sys.modules, "llvmlite": "llvmlite" in sys.modules}))
'''


def _workload(tmp_path: Path) -> tuple[Path, Path]:
    """A trace of 400 requests over 12 models of several sizes and penalties."""
    import random

    rng = random.Random(4)
    profiles, trace = tmp_path / "profiles.csv", tmp_path / "trace.csv"
    profiles.write_text("model,size_bytes,load_seconds,exec_seconds\n" + "".join(
        f"m{i},{10 + 7 * (i % 5)},{1 + i % 4},0.1\n" for i in range(12)))
    trace.write_text("timestamp,model\n" + "".join(
        f"{t * 0.5},m{min(int(rng.paretovariate(0.9)), 12) - 1}\n" for t in range(400)))
    return trace, profiles


def _simulate_in_child(env: dict[str, str], trace: Path, profiles: Path, capacity: int,
                       *specs: str) -> tuple[list[dict], dict]:
    done = subprocess.run([sys.executable, "-c", RUN_CLI, str(trace), str(profiles),
                           str(capacity), *specs], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return json.loads("\n".join(lines[:-1])), json.loads(lines[-1])


def _expected(trace: Path, profiles: Path, capacity: int, *specs: str) -> list[dict]:
    """The same runs in this process (kernels interpreted, conftest.py)."""
    from cachepolicies.simulator import sweep
    from cachepolicies.traces import read_profiles, read_trace

    read = read_profiles(profiles)
    return [r.to_dict() for r in sweep(read_trace(trace, read), read, [capacity],
                                       list(specs), progress=False)]


@needs_a_c_compiler
def test_simulate_runs_its_replay_compiled_ahead_of_time_without_numba(tmp_path,
                                                                        monkeypatch):
    from cachepolicies import native

    trace, profiles = _workload(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("EDGEAGENT_JIT", None)
    monkeypatch.setenv("NUMBA_CACHE_DIR", env["NUMBA_CACHE_DIR"])
    module = native.module_path("lru")
    module.parent.mkdir(parents=True)
    module.write_bytes(b"not a shared library")  # a broken file is rebuilt, not trusted
    expected = _expected(trace, profiles, 60, "lru")
    for run in ("builds", "loads"):
        results, imported = _simulate_in_child(env, trace, profiles, 60, "lru")
        assert results == expected, run
        assert imported == {"numba": False, "llvmlite": False}, run
        if run == "builds":
            built = module.stat().st_mtime_ns
    assert module.stat().st_mtime_ns == built  # the second process only loaded it
    assert native.load("lru", module) is not None
    assert not native.failure_note(module).exists()


def test_a_failed_build_leaves_a_note_and_numba_replays(tmp_path, monkeypatch):
    """Where the replay cannot be compiled ahead of time (here an earlier build failed
    for these sources: its note), simulate replays with numba's JIT, as before."""
    from cachepolicies import native

    trace, profiles = _workload(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("EDGEAGENT_JIT", None)
    monkeypatch.setenv("NUMBA_CACHE_DIR", env["NUMBA_CACHE_DIR"])
    note = native.failure_note(native.module_path("lru"))
    note.parent.mkdir(parents=True)
    note.write_text("exit status 1: no C compiler")
    results, imported = _simulate_in_child(env, trace, profiles, 60, "lru")
    assert results == _expected(trace, profiles, 60, "lru")
    assert imported["numba"] is True
    assert not native.module_path("lru").exists()


@pytest.mark.slow
def test_a_build_without_a_c_compiler_falls_back_to_the_jit(tmp_path, monkeypatch):
    from cachepolicies import native

    trace, profiles = _workload(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "CC": "false", "CXX": "false"}  # setuptools' compiler: a command that fails
    env.pop("EDGEAGENT_JIT", None)
    monkeypatch.setenv("NUMBA_CACHE_DIR", env["NUMBA_CACHE_DIR"])
    results, imported = _simulate_in_child(env, trace, profiles, 60, "gdsf")
    assert results == _expected(trace, profiles, 60, "gdsf")
    assert imported["numba"] is True
    note = native.failure_note(native.module_path("gdsf"))
    assert "exit status" in note.read_text()
    assert not native.module_path("gdsf").exists()


@pytest.mark.slow
@needs_a_c_compiler
def test_every_policys_native_replay_decides_as_numbas_jit(tmp_path):
    """Each policy, with parameters other than its defaults where it has some, on two
    capacities: the ahead-of-time replay against numba's JIT, result for result."""
    trace, profiles = _workload(tmp_path)
    from cachepolicies.registry import POLICY_NAMES

    specs = [{"cremebrulee": "cremebrulee:rate=cumulative",
              "popularity": "popularity:half_life=30",
              "cremebrulee-forecast": "cremebrulee-forecast:confirm=1,tolerance=0.3"}
             .get(name, name) for name in POLICY_NAMES]
    child = f'''
import json, sys
from cachepolicies import native
from cachepolicies.registry import POLICY_NAMES
from cachepolicies.simulator import sweep
from cachepolicies.traces import read_profiles, read_trace
profiles = read_profiles(sys.argv[2])
trace = read_trace(sys.argv[1], profiles)
modules = native.ensure(POLICY_NAMES)
assert modules is not None, [p.read_text() for p in native.cache_directory().glob("*.failed")]
runs = [sweep(trace, profiles, [40, 90], {specs!r}, seed=7, progress=False, native=n)
        for n in (None, modules)]
print(json.dumps([[r.to_dict() for r in results] for results in runs]))
'''
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "EDGEAGENT_JIT": "1"}
    done = subprocess.run([sys.executable, "-c", child, str(trace), str(profiles)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    jit, ahead = json.loads(done.stdout.strip().splitlines()[-1])
    assert ahead == jit
    assert len({r["misses"] for r in jit}) > 3  # the policies did decide differently
