"""CLI start-up: wall time of ``edgeagent --help`` and ``edgeagent CMD --help`` as
processes, against ``python -c "import click"`` (the floor: an interpreter and click).

Medians of ``--reps`` runs, interleaved so that a busy machine slows both alike. Targets:
every ratio <= 3 (issue 14), ``edgeagent --help`` <= 1.3 (issue 40). Runs the ``edgeagent`` console script next to this
interpreter (``.venv/bin/edgeagent``), as a user does.

Then (where the sim extra is installed) ``edgeagent simulate --demo`` with its compiled
code at hand, wall time and peak RSS: as shipped (the replays compiled ahead of time,
``cachepolicies.native``: no numba), with numba's JIT (``EDGEAGENT_JIT=1``: kernels from
numba's cache, loaded by ``cachepolicies/jit.py``'s lean patch) and with numba's own
``Cache.load_overload`` put back (issue 28: the patch stays, numba pinned to the tested
range).

    .venv/bin/python bench/cli_startup.py [--reps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.cli import COMMANDS  # noqa: E402

TARGET = 3.0
HELP_TARGET = 1.3


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


# `edgeagent simulate --demo` in a child; argv[1] "numba": numba's own cache loading.
SIMULATE = """
import sys
if sys.argv[1] != "shipped":
    import os
    os.environ["EDGEAGENT_JIT"] = "1"
if sys.argv[1] == "numba":
    from numba.core.caching import Cache
    own = Cache.load_overload
    import cachepolicies.jit
    Cache.load_overload = own
from agent.cli import main
main(["simulate", "--demo", "--no-progress"], standalone_mode=False)
"""


def peak_rss_mib(command: list[str]) -> float:
    """The peak RSS of one run of ``command`` (its own rusage, from wait4)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)
    return usage.ru_maxrss / 1024


def simulate_startup(reps: int) -> None:
    if importlib.util.find_spec("numba") is None:
        print("simulate: the sim extra is not installed, skipped")
        return
    labels = {"shipped": "as shipped (compiled ahead of time)",
              "lean": "numba's JIT, jit.py's lean cache load",
              "numba": "numba's JIT, numba's own cache load"}
    cases = {mode: [sys.executable, "-c", SIMULATE, mode] for mode in labels}
    for command in cases.values():  # build, compile and cache the kernels once
        wall(command)
    times: dict[str, list[float]] = {mode: [] for mode in cases}
    for _ in range(reps):
        for mode, command in cases.items():
            times[mode].append(wall(command))
    print(f"edgeagent simulate --demo, compiled code at hand, median of {reps}:")
    for mode, samples in times.items():
        print(f"  {labels[mode]:<40} {statistics.median(samples) * 1e3:6.0f} ms"
              f"  (peak RSS {peak_rss_mib(cases[mode]):.0f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    script = Path(sys.executable).with_name("edgeagent")
    if not script.exists():
        sys.exit(f"no console script at {script}: pip install -e . first")
    floor = [sys.executable, "-c", "import click"]
    cases = {"--help": [str(script), "--help"]}
    cases |= {f"{name} --help": [str(script), name, "--help"] for name in COMMANDS}
    times: dict[str, list[float]] = {"import click": [], **{k: [] for k in cases}}
    for command in [floor, *cases.values()]:  # warm the page cache and .pyc files
        wall(command)
    for _ in range(args.reps):
        times["import click"].append(wall(floor))
        for label, command in cases.items():
            times[label].append(wall(command))
    base = statistics.median(times["import click"])
    print(f"median of {args.reps}, python -c 'import click': {base * 1e3:.0f} ms")
    print(f"{'command':<30} {'median ms':>9} {'ratio':>6}")
    worst = 0.0
    for label in cases:
        median = statistics.median(times[label])
        worst = max(worst, median / base)
        print(f"{'edgeagent ' + label:<30} {median * 1e3:9.0f} {median / base:6.2f}")
    print(f"worst ratio {worst:.2f} (target <= {TARGET:g}): "
          f"{'met' if worst <= TARGET else 'NOT met'}")
    top = statistics.median(times["--help"]) / base
    print(f"edgeagent --help {top:.2f} (target <= {HELP_TARGET:g}, issue 40): "
          f"{'met' if top <= HELP_TARGET else 'NOT met'}")
    simulate_startup(args.reps)


if __name__ == "__main__":
    main()
