"""CLI start-up: wall time of ``edgeagent --help`` and ``edgeagent CMD --help`` as
processes, against ``python -c "import click"`` (the floor: an interpreter and click).

Medians of ``--reps`` runs, interleaved so that a busy machine slows both alike. Target
(issue 14): every ratio <= 3. Runs the ``edgeagent`` console script next to this
interpreter (``.venv/bin/edgeagent``), as a user does.

    .venv/bin/python bench/cli_startup.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.cli import COMMANDS  # noqa: E402

TARGET = 3.0


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


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


if __name__ == "__main__":
    main()
