"""The agent's twin against the live agent: the same trace replayed open-loop over HTTP
against a real agent (synthetic models carrying the shipped CremeBrulee profiles, time
compressed) and through ``simulate --queueing`` (``cachepolicies.twin``) with the
agent's defaults; prints each figure's error (twin / live − 1). Not a test
(tests/test_twin.py keeps one short case).

Cases: ``issue`` (issue 25's table: seed 7 at 5 req/s and seed 8 at 3 req/s, a budget
of a quarter of the models, one load slot), ``grid`` (budgets 15–50 %, load-slot
utilisation 30–90 % by the twin's own count, 1 and 2 load slots) and ``whatif`` (run
the agent at budget B, ask the twin for 2B from the agent's own record, then run the
agent at 2B). Floors: loads within 5 %, mean response within 15 %, p99 within 25 %.

    .venv/bin/python bench/twin.py --case issue [--seconds 90] [--policy lru]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.commands.cache import PROFILES_FILE, TRACE_FILE  # noqa: E402
from agent.config import AgentConfig  # noqa: E402
from agent.config.twinsettings import twin_settings  # noqa: E402
from cachepolicies.simulator import simulate  # noqa: E402
from tests.helpers import (AgentServer, add_synthetic, cremebrulee_workload,  # noqa: E402
                           replay_live)

FLOORS = {"loads": 0.05, "mean": 0.15, "p99": 0.25}
POLICIES = ("cremebrulee", "lru")


@dataclass(frozen=True)
class Figures:
    """What one run measured, live or in the twin."""

    loads: int
    mean: float
    p99: float
    failed: int
    load_wait: float
    stalled: float = 0.0   # live: seconds the agent's event loop was late by > LATE
    longest: float = 0.0   # live: its longest such stall

    def errors(self, live: "Figures") -> dict[str, float]:
        """This run's relative error against ``live``, per floor figure."""
        return {k: getattr(self, k) / getattr(live, k) - 1 if getattr(live, k) else 0.0
                for k in FLOORS}


#: A probe on the agent's event loop wakes every TICK seconds; a wake later than LATE is
#: a stall of the box (the agent waited for a CPU), not of anything the twin models.
TICK, LATE = 0.01, 0.05
#: A run whose agent stalled this long in all is flagged "box stalled" in the report.
STALLED = 1.0


class LoopProbe:
    """How late the agent's event loop runs: the seconds its wakes were late by more
    than ``LATE``, in all and the longest, over a live run."""

    def __init__(self, agent: AgentServer) -> None:
        self.stalled = self.longest = 0.0
        self.stop = False
        self.done = asyncio.run_coroutine_threadsafe(self.run(), agent.loop)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop:
            before = loop.time()
            await asyncio.sleep(TICK)
            late = loop.time() - before - TICK
            if late > LATE:
                self.stalled += late
                self.longest = max(self.longest, late)

    def result(self) -> tuple[float, float]:
        self.stop = True
        self.done.result(5)
        return self.stalled, self.longest


def served(seconds: list[float]) -> tuple[float, float]:
    return float(np.mean(seconds)), float(np.percentile(seconds, 99))


def run_live(work: Path, workload, budget: int, policy: str, load_concurrency: int,
             record: Path | None = None) -> Figures:
    """Replay the trace against a fresh agent with its defaults; its figures. With
    ``record``, the agent's own record (``GET /v1/trace``, ``/v1/profiles``) is saved
    there as ``edgeagent cache trace`` saves it."""

    names, sizes, loads, execs, trace, _ = workload
    repo = work / "models"
    if not repo.exists():
        for name, size, load, exe in zip(names, sizes, loads, execs):
            add_synthetic(repo, name, size_bytes=int(size), load_ms=float(load) * 1000,
                          base_ms=float(exe) * 1000)
    data = Path(tempfile.mkdtemp(dir=work))
    agent = AgentServer(AgentConfig(repository=repo, data_dir=data, cpu_budget=budget,
                                    infer_threads=2, policy=policy, restore=False,
                                    load_concurrency=load_concurrency),
                        budgets={"cpu": budget})
    try:
        probe = LoopProbe(agent)
        results = asyncio.run(replay_live(agent.url, trace, names))
        stalled, longest = probe.result()
        listing = agent.request("GET", "/v1/cache")[2]
        memory = agent.request("GET", "/v1/memory")[2]
        if record is not None:
            record.mkdir(parents=True, exist_ok=True)
            for path, name in (("/v1/trace", TRACE_FILE), ("/v1/profiles", PROFILES_FILE)):
                (record / name).write_bytes(agent.request("GET", path)[2])
    finally:
        agent.close()
    ok = [s for s, status in results if status == 200]
    mean, p99 = served(ok)
    wait = sum(p.get("room_wait_seconds", 0.0) for p in memory.values())
    return Figures(sum(m["loads"] for m in listing), mean, p99, len(results) - len(ok),
                   wait, stalled, longest)


def run_twin(workload, budget: int, policy: str, load_concurrency: int) -> Figures:
    trace, profiles = workload[4], workload[5]
    r = simulate(trace, profiles, budget, policy,
                 queueing=twin_settings(AgentConfig(), load_concurrency=load_concurrency))
    return Figures(r.misses, r.mean_response_seconds, r.p99_response_seconds, r.failed,
                   r.load_wait_seconds)


def utilisation(workload, budget: int, policy: str, slots: int) -> float:
    """Share of the run the twin's load slots are busy: loads' seconds / (slots × span)."""
    trace, profiles = workload[4], workload[5]
    r = simulate(trace, profiles, budget, policy,
                 queueing=twin_settings(AgentConfig(), load_concurrency=slots))
    return r.load_delay_seconds / (slots * float(trace.timestamps[-1]))


def report(label: str, live: Figures, twin: Figures) -> bool:
    """Print one run's live/twin figures, each figure's error with whether it is within
    its floor (✓/✗), and the cell's verdict; True when all three are within."""
    errors = twin.errors(live)
    within = {k: abs(errors[k]) <= FLOORS[k] for k in FLOORS}
    ok = all(within.values())

    def mark(k: str) -> str:
        return f"({errors[k]:+.1%} {'✓' if within[k] else '✗'})"

    print(f"{label:<44} loads {live.loads:>4}/{twin.loads:<4} {mark('loads')}  "
          f"mean {live.mean:.3f}/{twin.mean:.3f} s {mark('mean')}  "
          f"p99 {live.p99:.3f}/{twin.p99:.3f} s {mark('p99')}  "
          f"failed {live.failed}/{twin.failed}  wait {live.load_wait:.1f}/"
          f"{twin.load_wait:.1f} s  stalls {live.stalled:.1f} s (longest "
          f"{live.longest:.2f} s)  {'ok' if ok else 'MISSED'}"
          f"{' (box stalled)' if live.stalled >= STALLED else ''}", flush=True)
    return ok


def from_record(record: Path, budget: int, policy: str, slots: int) -> Figures:
    """The twin on a live run's own record (``edgeagent cache trace``'s files): its
    trace, measured profiles (with the time its loads held their slot) and settings."""
    from agent.commands.simulate import record_settings
    from cachepolicies.traces import read_profiles, read_trace

    profiles = read_profiles(record / PROFILES_FILE)
    trace = read_trace(record / TRACE_FILE, profiles)
    r = simulate(trace, profiles, budget, policy, queueing=twin_settings(
        AgentConfig(), record_settings(record / PROFILES_FILE), load_concurrency=slots))
    return Figures(r.misses, r.mean_response_seconds, r.p99_response_seconds, r.failed,
                   r.load_wait_seconds)


def compare(work: Path, workload, fraction: float, policy: str, slots: int,
            label: str, keep: Path | None = None) -> Cell:
    """Live against the twin on the workload's nominal profiles, and against the twin
    on the run's own record (measured profiles: what ``simulate --from`` sees); whether
    each is within all floors. ``keep``: the record is kept in KEEP/<the cell>."""
    budget = int(workload[1].sum() * fraction)
    record = (keep / slug(label)) if keep else Path(tempfile.mkdtemp(dir=work))
    live = run_live(work, workload, budget, policy, slots, record=record)
    nominal = report(label, live, run_twin(workload, budget, policy, slots))
    recorded = from_record(record, budget, policy, slots)
    return Cell({"nominal profiles": nominal,
                 "the run's record": report("  (twin on the run's record)", live, recorded)},
                live.stalled >= STALLED)


@dataclass(frozen=True)
class Cell:
    """One cell's verdicts: within all floors, per twin input; whether the box stalled
    the live agent (``STALLED``)."""

    within: dict[str, bool]
    stalled: bool


def summary(cells: list[Cell]) -> None:
    """Print, per twin input, how many cells are within all floors, and how many of
    those missed ran on a stalled box."""
    for against in cells[0].within if cells else ():
        missed = [c for c in cells if not c.within[against]]
        stalled = sum(c.stalled for c in missed)
        print(f"{len(cells) - len(missed)}/{len(cells)} cells within all floors (twin on "
              f"{against}); {stalled} of the {len(missed)} missed had the agent's event "
              f"loop stalled >= {STALLED:g} s")


def slug(label: str) -> str:
    """A cell's label as a directory name."""
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in label).strip("_")


def issue_case(work: Path, seconds: float, policies, keep: Path | None = None
               ) -> list[Cell]:
    out = []
    for seed, rate in ((7, 5.0), (8, 3.0)):
        workload = cremebrulee_workload(seed, rate, seconds)
        for policy in policies:
            out.append(compare(work, workload, 0.25, policy, 1,
                               f"seed {seed}, {rate:g} req/s, 25 %, {policy}", keep))
    return out


def grid_case(work: Path, seconds: float, policies, slot_counts=(1, 2),
              fractions=(0.15, 0.25, 0.5), utilisations=(0.3, 0.6, 0.9),
              keep: Path | None = None) -> list[Cell]:
    """Budgets 15–50 %; for each, the rate whose load-slot utilisation (in the twin) is
    30, 60 or 90 %; 1 and 2 load slots."""
    out = []
    for slots in slot_counts:
        for fraction in fractions:
            for target in utilisations:
                rate = rate_for(fraction, target, slots, seconds)
                workload = cremebrulee_workload(11, rate, seconds)
                for policy in policies:
                    out.append(compare(work, workload, fraction, policy, slots,
                                       f"{slots} slot(s), {fraction:.0%}, util "
                                       f"{target:.0%} ({rate:.2f}/s), {policy}", keep))
    return out


def rate_for(fraction: float, target: float, slots: int, seconds: float) -> float:
    """The request rate at which the twin's load slots are busy ``target`` of the time
    (bisection on the rate; utilisation grows with it)."""
    low, high = 0.2, 40.0
    for _ in range(12):
        rate = (low * high) ** 0.5
        workload = cremebrulee_workload(11, rate, seconds)
        budget = int(workload[1].sum() * fraction)
        if utilisation(workload, budget, "lru", slots) < target:
            low = rate
        else:
            high = rate
    return (low * high) ** 0.5


def whatif_case(work: Path, seconds: float, policies, keep: Path | None = None
                ) -> list[Cell]:
    """Run the agent at B, ask the twin for 2B from the agent's own record (its trace
    and measured profiles), run the agent at 2B on the same trace: twin vs that run."""
    out = []
    workload = cremebrulee_workload(7, 5.0, seconds)
    total = workload[1].sum()
    for policy in policies:
        record = (keep or work) / policy
        at_b = run_live(work, workload, int(total * 0.15), policy, 1, record=record)
        twin = from_record(record, int(total * 0.3), policy, 1)
        trace_len = (record / TRACE_FILE).read_text().count("\n") - 1
        at_2b = run_live(work, workload, int(total * 0.3), policy, 1)
        print(f"{policy}: at B (15 %) live loads {at_b.loads}, mean {at_b.mean:.3f} s, "
              f"p99 {at_b.p99:.3f} s; record: {trace_len} requests", flush=True)
        out.append(Cell({"the record at B": report(
            f"what-if 2B (30 %) from the record, {policy}", at_2b, twin)},
            max(at_b.stalled, at_2b.stalled) >= STALLED))
    return out


def numbers(text: str, kind=float) -> list:
    """A comma-separated list of numbers."""
    return [kind(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("issue", "grid", "whatif"), default="issue")
    ap.add_argument("--seconds", type=float, default=90.0, help="trace length per run")
    ap.add_argument("--policy", action="append", help="default: cremebrulee and lru")
    ap.add_argument("--slots", help="grid: load slots, comma-separated [default: 1,2]")
    ap.add_argument("--budgets", help="grid: budget fractions [default: 0.15,0.25,0.5]")
    ap.add_argument("--utilisations", help="grid: load-slot utilisations [default: "
                    "0.3,0.6,0.9]")
    ap.add_argument("--keep", type=Path, help="keep each run's record in KEEP/<cell> "
                    "(whatif: KEEP/POLICY, the run at B), for simulate --from")
    args = ap.parse_args()
    cases = {"issue": issue_case, "grid": grid_case, "whatif": whatif_case}
    started = time.monotonic()
    print("live/twin per figure, (twin error, ✓ within its floor); floors: loads 5 %, "
          "mean 15 %, p99 25 %")
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"keep": args.keep}
        if args.case == "grid":
            for name, text, kind in (("slot_counts", args.slots, int),
                                     ("fractions", args.budgets, float),
                                     ("utilisations", args.utilisations, float)):
                if text:
                    extra[name] = numbers(text, kind)
        cells = cases[args.case](Path(tmp), args.seconds, args.policy or POLICIES, **extra)
    summary(cells)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
