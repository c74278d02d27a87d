"""``edgeagent simulate``: replay a request trace against eviction policies and capacities.

Prints one row per (policy, capacity): a table by default, a JSON list with ``--json``;
``--plot`` draws mean load delay per request against capacity (CremeBrulee Fig. 8).
``--demo`` needs no files: the shipped CremeBrulee profiles on a synthetic workload.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent.commands import ExtraCommand
from agent.units import parse_size

if TYPE_CHECKING:
    from cachepolicies.simulator import SimulationResult
    from cachepolicies.traces import Profiles, Trace
    from cachepolicies.twin import Queueing

# cachepolicies.registry's names, spelled out so that ``--help`` compiles no kernel
# (numba) and reads no CSV module (pandas, pyarrow); tests/test_cli_lazy.py checks them.
POLICY_NAMES = ("lru", "random", "popularity", "gdsf", "beladymin", "cremebrulee",
                "cremebrulee-oracle")

DEMO_POLICIES = ("lru", "random", "popularity", "gdsf", "cremebrulee", "beladymin",
                 "cremebrulee-oracle")
DEMO_CAPACITIES = ("4GB", "8GB", "12GB", "16GB")

_PATH_IN = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("simulate", cls=ExtraCommand, extra="sim")
@click.option("--trace", "trace_path", type=_PATH_IN, help="Trace CSV: timestamp,model.")
@click.option("--profiles", "profiles_path", type=_PATH_IN,
              help="Profiles CSV: model,size_bytes,load_seconds,exec_seconds "
                   "[,first_exec_seconds].")
@click.option("--capacity", "capacities", multiple=True,
              help="Cache capacity: bytes or units (16GB, 512MiB); repeat or comma-separate.")
@click.option("--policy", "policies", multiple=True,
              help=f"Policy spec, e.g. cremebrulee:rate=cumulative; repeatable. "
                   f"Names: {', '.join(POLICY_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of load delay against capacity, one line per policy.")
@click.option("--queueing", is_flag=True,
              help="Replay through the agent's twin (load slots, room queue, per-model "
                   "workers and batching, with the agent's defaults): adds response times.")
@click.option("--workers", type=click.IntRange(min=1),
              help="Workers per model in queueing mode [default: the agent's].")
@click.option("--load-concurrency", type=click.IntRange(min=1),
              help="Load slots in queueing mode [default: the agent's load_concurrency].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of 'random'.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@click.option("--demo", is_flag=True,
              help="No files needed: the shipped CremeBrulee profiles on a synthetic "
                   "workload, at a few capacities (options given still apply).")
def simulate_command(
    trace_path: Path | None,
    profiles_path: Path | None,
    capacities: Sequence[str],
    policies: Sequence[str],
    as_json: bool,
    plot_path: Path | None,
    queueing: bool,
    workers: int | None,
    load_concurrency: int | None,
    seed: int,
    progress: bool | None,
    demo: bool,
) -> None:
    """Simulate model-level caching: load delay per policy and capacity."""
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        if demo:
            from cachepolicies.simulator import sweep

            trace, profiles = _demo_workload(seed)
            capacities = capacities or DEMO_CAPACITIES
            policies = policies or DEMO_POLICIES
        else:
            missing = [flag for flag, value in (("--trace", trace_path),
                                                ("--profiles", profiles_path),
                                                ("--capacity", capacities),
                                                ("--policy", policies)) if not value]
            if missing:
                raise click.UsageError(f"missing {', '.join(missing)} (or use --demo)")
            # The CSVs parse in pyarrow's threads, mostly without the GIL, while this
            # thread imports the simulator (numba); read errors are raised by result().
            with ThreadPoolExecutor(1) as reader:
                inputs = reader.submit(_read_inputs, trace_path, profiles_path)
                from cachepolicies.simulator import sweep

                trace, profiles = inputs.result()
        sizes = _parse_capacities(capacities)
        twin = agent_queueing(workers, load_concurrency) if queueing else None
        results = sweep(trace, profiles, sizes, list(policies), seed=seed,
                        queueing=twin, progress=progress)
        if plot_path is not None:
            _plot(results, plot_path)
    except (ValueError, OSError) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        if demo:
            click.echo(f"demo: {len(trace)} requests for {len(set(trace.model_ids.tolist()))} "
                       f"models (shipped CremeBrulee profiles, synthetic workload)")
        click.echo(format_table(results))


def agent_queueing(workers: int | None = None, load_concurrency: int | None = None
                   ) -> Queueing:
    """The twin's settings: the agent's defaults (its config declarations), with
    ``workers`` per model and ``load_concurrency`` load slots where given."""
    from agent.config import AgentConfig
    from agent.memory import PLAIN
    from cachepolicies.twin import Queueing

    config = AgentConfig()
    batching, slo = config.batching, config.slo.latency_ms / 1000
    return Queueing(
        workers=workers or batching.workers,
        load_concurrency=load_concurrency or config.load_concurrency,
        max_batch_size=batching.max_batch_size if batching.enabled else 1,
        aimd_step=batching.aimd_step, batch_budget_seconds=slo * batching.budget_fraction,
        load_peak=PLAIN.load_peak, load_wait_max_s=config.load_wait_max_s,
        cold_start=config.cold_start, slo_seconds=slo)


def _read_inputs(trace_path: Path, profiles_path: Path) -> tuple[Trace, Profiles]:
    """The trace and profiles files, read and validated (numba is not imported here)."""
    from cachepolicies.traces import read_profiles, read_trace

    profiles = read_profiles(profiles_path)
    return read_trace(trace_path, profiles), profiles


def _parse_capacities(values: Sequence[str]) -> list[int]:
    """Capacities from repeated and/or comma-separated options, in the order given."""
    sizes = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                raise click.BadParameter(f"empty item in {value!r}", param_hint="--capacity")
            try:
                sizes.append(parse_size(item.strip()))
            except ValueError as error:
                raise click.BadParameter(str(error), param_hint="--capacity") from None
    return sizes


def format_table(results: Sequence[SimulationResult]) -> str:
    """An aligned text table, one row per result."""
    queueing = any(r.workers is not None for r in results)
    header = ["policy", "capacity", "requests", "hits", "misses", "hit%", "load_delay_s",
              "mean_delay_s", "evictions", "loaded"]
    if queueing:
        header += ["load_wait_s", "failed", "mean_resp_s", "p95_resp_s", "p99_resp_s",
                   "slo_viol"]
    rows = []
    for r in results:
        row = [r.policy, _size_label(r.capacity_bytes), str(r.requests), str(r.hits),
               str(r.misses), f"{100 * r.hit_ratio:.1f}", f"{r.load_delay_seconds:.1f}",
               f"{r.mean_load_delay_seconds:.4f}", str(r.evictions),
               _size_label(r.bytes_loaded, exact=False)]
        if queueing:
            row += [f"{r.load_wait_seconds:.1f}", str(r.failed),
                    f"{r.mean_response_seconds:.4f}", f"{r.p95_response_seconds:.4f}",
                    f"{r.p99_response_seconds:.4f}", str(r.slo_violations)]
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _size_label(n: int, *, exact: bool = True) -> str:
    """A byte count in the unit that states it exactly (16GB, 512MiB), else in bytes;
    with ``exact=False`` a rounded decimal unit instead."""
    units = (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9),
             ("MiB", 2**20), ("MB", 10**6), ("KiB", 2**10), ("KB", 10**3))
    for name, size in units:
        if n >= size and n % size == 0:
            return f"{n // size}{name}"
    if not exact:
        for name, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
            if n >= size:
                return f"{n / size:.1f}{name}"
    return f"{n}B"


def _plot(results: Sequence[SimulationResult], path: Path) -> None:
    """Mean load delay per request against capacity (log2 axis), one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r.policy for r in results):
        points = sorted((r.capacity_bytes, r.mean_load_delay_seconds)
                        for r in results if r.policy == policy)
        ax.plot([c / 1e9 for c, _ in points], [d for _, d in points], marker="o", label=policy)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache capacity (GB)")
    ax.set_ylabel("mean model load delay per request (s)")
    ax.set_title("Load delay against cache capacity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _demo_workload(seed: int) -> tuple[Trace, Profiles]:
    """An hour of synthetic Azure-style requests over the shipped profiles (quantiles-r)."""
    from cachepolicies.traces import cremebrulee_profiles_path, read_profiles
    from cachepolicies.workloads import TraceOptions, build_workload, synthetic_invocations

    profiles = read_profiles(cremebrulee_profiles_path())
    invocations = synthetic_invocations(5000, minutes=60, seed=seed)
    workload = build_workload(invocations.with_trigger("http"), profiles,
                              TraceOptions(association="quantiles-r", names="real", seed=seed))
    return workload.trace, workload.profiles
