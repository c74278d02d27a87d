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
    # A cache of its own: the first process compiles the kernels, the second loads them.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("EDGEAGENT_JIT", None)
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
