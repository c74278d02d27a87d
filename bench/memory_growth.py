"""Memory growth over load/unload cycles, in the style of Triton's L0_memory_growth.

Each mode runs in a fresh process: set up (or not) as the agent sets itself up, measure
the idle RSS (the baseline), then cycle: load every ONNX model of the demo zoo through
the agent's own load path (``make_backend`` + ``load_measured``), run one inference on
each, unload them all and return the heap (``malloc_trim``). After each cycle the RSS
is compared with the baseline; the check passes when every cycle ends within 10 % of it.

Modes:
- ``agent``: as the agent runs (``tune_malloc``, runtime primed, ``malloc_trim``);
- ``no-trim`` (negative control): glibc defaults, no ``tune_malloc``, no ``malloc_trim``;
- ``leak`` (negative control): as ``agent``, but every session is kept on purpose.
The check must pass for ``agent`` and fail for ``leak``: it can tell.

    .venv/bin/python bench/memory_growth.py [--cycles 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = 0.10
MiB = 2**20

CYCLES = """
import gc, json, sys
from pathlib import Path
import numpy as np
from agent.backends import load_measured, make_backend
from agent.backends.onnx import prime_runtime
from agent.memory import FootprintModel, MemoryMeter, malloc_trim, tune_malloc
from agent.node.repository import scan_repository

mode, repo, cycles = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
trim = malloc_trim if mode != "no-trim" else (lambda: False)
if mode != "no-trim":
    tune_malloc()
prime_runtime()
specs = {n: s for n, s in sorted(scan_repository(repo).items()) if s.backend == "onnx"}
footprints, meter, kept = FootprintModel(), MemoryMeter(), []
gc.collect(); trim()
baseline = meter.rss()
rows = []
for cycle in range(1, cycles + 1):
    loaded, accounted, peak = [], 0, 0
    for name, spec in specs.items():
        backend = make_backend("onnx", name, spec.default_version, spec.path, spec.config,
                               footprints)
        result = load_measured(backend, meter, trim=trim)
        accounted += result.size_bytes or backend.estimate()
        x = {s.name: np.ones([d if d > 0 else 1 for d in s.shape], np.float32)
             for s in backend.inputs}
        backend.infer(x, {})
        loaded.append(backend)
        peak = max(peak, meter.rss())
    for backend in loaded:
        if mode == "leak":
            kept.append(backend.session)
        backend.unload()
    del loaded, backend
    gc.collect(); trim()
    rows.append({"cycle": cycle, "rss": meter.rss(), "peak": peak, "accounted": accounted})
print(json.dumps({"mode": mode, "baseline": baseline, "models": len(specs), "cycles": rows}))
"""


def run_mode(mode: str, repo: Path, cycles: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CYCLES, mode, str(repo), str(cycles)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(result: dict) -> bool:
    """Print one mode's figures; True when every cycle ends within the tolerance."""
    base = result["baseline"]
    print(f"\n== {result['mode']}: {result['models']} models, idle baseline "
          f"{base / MiB:.1f} MiB")
    print(f"{'cycle':>5} {'peak':>10} {'accounted':>10} {'after':>10} {'vs idle':>8}")
    ok = True
    for row in result["cycles"]:
        growth = (row["rss"] - base) / base
        ok &= growth <= TOLERANCE
        print(f"{row['cycle']:>5} {row['peak'] / MiB:9.1f}M {row['accounted'] / MiB:9.1f}M "
              f"{row['rss'] / MiB:9.1f}M {growth:+8.1%}")
    print(f"{result['mode']}: {'PASS' if ok else 'FAIL'} (check: every cycle ends "
          f"within {TOLERANCE:.0%} of idle)")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    from agent.modelzoo import write_demo_repository

    with tempfile.TemporaryDirectory() as tmp:
        repo = write_demo_repository(Path(tmp) / "zoo")
        verdicts = {mode: report(run_mode(mode, repo, args.cycles))
                    for mode in ("agent", "no-trim", "leak")}
    print(f"\nagent passes: {verdicts['agent']}; the leaking control fails: "
          f"{not verdicts['leak']} (no-trim control: "
          f"{'passes' if verdicts['no-trim'] else 'fails'})")
    if not verdicts["agent"] or verdicts["leak"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
