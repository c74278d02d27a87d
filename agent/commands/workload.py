"""``edgeagent workload``: request traces and model profiles for simulation (CremeBrulee §VI-A).

- ``synthetic``: an Azure-Functions-2019-format invocation CSV, made up (seeded).
- ``trace``: an invocation CSV (real or synthetic) → trace CSV (+ profiles CSV).
- ``generate``: both in one step, without writing the invocation CSV.

Both of the last two can turn a share of the functions into timers (``--timer-share``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent.commands import ExtraGroup
from agent.units import format_size

if TYPE_CHECKING:
    from cachepolicies.workloads import InvocationCounts, Workload

# cachepolicies.workloads' choices, spelled out so that ``--help`` imports no numpy or
# pyarrow (the commands import the workloads when they run); tests/test_cli_lazy.py
# checks them against the source.
ASSOCIATIONS = ("uniform", "round-robin", "quantiles", "quantiles-r")
NAMINGS = ("distinct", "real")

_PATH_IN = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group("workload", cls=ExtraGroup, extra="sim")
def workload() -> None:
    """Make request traces and model profiles (the Azure Functions trace method)."""


@workload.command("synthetic")
@click.option("--functions", type=click.IntRange(min=1), required=True,
              help="Number of functions (rows).")
@click.option("--minutes", type=click.IntRange(min=1), default=1440, show_default=True,
              help="Number of minute columns.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", default="-", show_default=True,
              help="Azure-format invocation CSV to write ('-': stdout).")
def synthetic_command(functions: int, minutes: int, seed: int, out: str) -> None:
    """Write made-up per-minute invocation counts in the Azure Functions 2019 format."""
    from cachepolicies.workloads import synthetic_invocations, write_azure_invocations

    with _clear_errors():
        invocations = synthetic_invocations(functions, minutes, seed=seed)
        write_azure_invocations(out, invocations)
    http = invocations.with_trigger("http")
    click.echo(f"{functions} functions ({http.n_functions} HTTP), {minutes} minutes, "
               f"{int(invocations.totals().sum())} invocations "
               f"({int(http.totals().sum())} HTTP)" + ("" if out == "-" else f" -> {out}"),
               err=True)


def _timer_periods(ctx: click.Context, param: click.Parameter,
                   value: str) -> tuple[float, float]:
    """``--timer-periods``: two positive numbers, the shortest first."""
    try:
        low, high = (float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not two numbers: shortest,longest "
                                 "(seconds)") from None
    if not 0 < low <= high:
        raise click.BadParameter(f"{value!r}: need 0 < shortest <= longest")
    return low, high


def _trace_options(command: Callable) -> Callable:
    """The options ``trace`` and ``generate`` share: how to build and where to write."""
    options = [
        click.option("--profiles", type=_PATH_IN, default=None,
                     help="Model profiles CSV [default: the shipped CremeBrulee profiles]."),
        click.option("--association", type=click.Choice(ASSOCIATIONS), default="uniform",
                     show_default=True, help="How functions are paired with profiles."),
        click.option("--quantile", type=click.FloatRange(0, 1, min_open=True), default=0.9,
                     show_default=True, help="Drop functions above this popularity quantile."),
        click.option("--keep-one-hit", is_flag=True,
                     help="Keep functions invoked only once in the window."),
        click.option("--downsample", type=click.FloatRange(0, 1, min_open=True), default=1.0,
                     show_default=True, help="Keep this fraction of the requests."),
        click.option("--names", type=click.Choice(NAMINGS), default="distinct",
                     show_default=True,
                     help="distinct: one model per function; real: the profiles' names."),
        click.option("--timer-share", type=click.FloatRange(0, 1), default=0.0,
                     show_default=True,
                     help="Share of the kept functions that fire as timers instead "
                          "(periodic-heavy workloads)."),
        click.option("--timer-periods", default="30,600", show_default=True,
                     callback=_timer_periods,
                     help="Shortest,longest timer period in seconds (log-uniform)."),
        click.option("--timer-jitter", type=click.FloatRange(0, 0.5, max_open=True),
                     default=0.02, show_default=True,
                     help="Each firing moves by up to this share of its period."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out-trace", type=click.Path(dir_okay=False, path_type=Path),
                     required=True, help="Trace CSV to write (timestamp,model)."),
        click.option("--out-profiles", type=click.Path(dir_okay=False, path_type=Path),
                     help="Profiles CSV of the trace's models (needed for --names distinct)."),
    ]
    return functools.reduce(lambda cmd, option: option(cmd), reversed(options), command)


@workload.command("trace")
@click.option("--invocations", type=_PATH_IN, required=True,
              help="Azure Functions 2019 invocation-count CSV (only HTTP functions are used).")
@click.option("--start-minute", type=click.IntRange(min=0), default=0, show_default=True,
              help="First minute of the window (0-based: column '1' is minute 0).")
@click.option("--minutes", type=click.IntRange(min=1), default=None,
              help="Minutes in the window [default: to the end of the file].")
@_trace_options
def trace_command(invocations: Path, start_minute: int, minutes: int | None,
                  **options) -> None:
    """Turn invocation counts into a request trace (and profiles) for simulation."""
    from cachepolicies.workloads import read_azure_invocations

    with _clear_errors():
        counts = read_azure_invocations(invocations, start_minute=start_minute, minutes=minutes)
        _build_and_write(counts, **options)


@workload.command("generate")
@click.option("--functions", type=click.IntRange(min=1), required=True,
              help="Number of synthetic functions (all triggers; only HTTP ones are used).")
@click.option("--minutes", type=click.IntRange(min=1), default=60, show_default=True,
              help="Minutes of synthetic invocations (the window).")
@_trace_options
def generate_command(functions: int, minutes: int, **options) -> None:
    """Synthetic invocations, then a trace, in one step (no invocation CSV written)."""
    from cachepolicies.workloads import synthetic_invocations

    with _clear_errors():
        counts = synthetic_invocations(functions, minutes, seed=options["seed"])
        _build_and_write(counts.with_trigger("http"), **options)


def _build_and_write(counts: InvocationCounts, *, profiles: Path | None, association: str,
                     quantile: float, keep_one_hit: bool, downsample: float, names: str,
                     timer_share: float, timer_periods: tuple[float, float],
                     timer_jitter: float, seed: int, out_trace: Path,
                     out_profiles: Path | None) -> None:
    from cachepolicies.traces import cremebrulee_profiles_path, read_profiles
    from cachepolicies.workloads import (TraceOptions, WorkloadError, build_workload,
                                         write_profiles, write_trace)

    if names == "distinct" and out_profiles is None:
        raise click.UsageError("--names distinct needs --out-profiles: each function becomes "
                               "its own model, described only there")
    source = read_profiles(profiles or cremebrulee_profiles_path())
    options = TraceOptions(association=association, quantile=quantile,
                           drop_one_hit=not keep_one_hit, downsample=downsample, names=names,
                           seed=seed, timer_share=timer_share, timer_periods=timer_periods,
                           timer_jitter=timer_jitter)
    start = time.perf_counter()
    built = build_workload(counts, source, options)
    if len(built.trace) == 0:
        raise WorkloadError(f"no requests left: {counts.n_functions} HTTP functions in the "
                            f"window, {built.functions} kept after the popularity filter; "
                            "try a wider window, --quantile 1, --keep-one-hit or less "
                            "downsampling")
    write_trace(out_trace, built.trace.timestamps, built.model_names())
    if out_profiles is not None:
        write_profiles(out_profiles, built.profiles)
    _summary(counts, built, out_trace, out_profiles, time.perf_counter() - start)


def _summary(counts: InvocationCounts, built: Workload, out_trace: Path,
             out_profiles: Path | None, seconds: float) -> None:
    import numpy as np

    pop = built.popularity
    times = built.trace.timestamps
    used = np.unique(built.trace.model_ids)
    memory = int(built.profiles.size_bytes[used].sum())
    lines = [
        f"functions: {counts.n_functions} HTTP, {pop.invoked} invoked, {built.functions} kept "
        f"(dropped {pop.too_popular} above {pop.threshold:g} invocations, "
        f"{pop.one_hit} one-hit wonders)"
        + (f"; {built.timers} of them timers" if built.timers else ""),
        f"requests:  {len(times)} from {times[0]:.1f} s to {times[-1]:.1f} s "
        f"(window {counts.n_minutes} min from minute {counts.start_minute})",
        f"models:    {len(used)}, {format_size(memory)} if all loaded at once",
        f"wrote:     {out_trace}" + (f", {out_profiles}" if out_profiles else "")
        + f" (built and written in {seconds:.2f} s, {len(times) / seconds:,.0f} requests/s)",
    ]
    click.echo("\n".join(lines), err=True)


@contextmanager
def _clear_errors() -> Iterator[None]:
    """Turn bad-input errors into ``Error: ...`` and exit status 1 (no traceback)."""
    from cachepolicies.traces import SimulationInputError
    from cachepolicies.workloads import WorkloadError

    try:
        yield
    except (WorkloadError, SimulationInputError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from None
