"""``edgeagent profile measure``: model profiles measured on this machine (ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

import click

from agent.units import format_size


@click.group("profile")
def profile() -> None:
    """Measure model profiles (memory, load and execution time)."""


@profile.command("measure")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True,
              help="Warm runs per model; exec_seconds is their median.")
@click.option("--out", default="-", show_default=True,
              help="Profiles CSV to write ('-': stdout).")
def measure_command(paths: tuple[Path, ...], runs: int, out: str) -> None:
    """Measure ONNX models: .onnx files, model directories or model repositories.

    Writes model,size_bytes,load_seconds,exec_seconds,first_exec_seconds; a table of
    the measurements goes to stderr.
    """
    from agent.profiling import ProfilingError, measure_models, to_profiles
    from cachepolicies.workloads import write_profiles

    try:
        measured = measure_models(paths, runs=runs)
        write_profiles(out, to_profiles(measured))
    except ProfilingError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from None
    width = max(len(m.model) for m in measured)
    click.echo(f"{'model':<{width}}  {'file':>9}  {'rss delta':>9}  {'load ms':>9}  "
               f"{'first ms':>9}  {'exec ms':>9}", err=True)
    for m in measured:
        click.echo(f"{m.model:<{width}}  {format_size(m.file_bytes):>9}  "
                   f"{format_size(m.rss_delta_bytes):>9}  {m.load_seconds * 1e3:9.2f}  "
                   f"{m.first_exec_seconds * 1e3:9.3f}  {m.exec_seconds * 1e3:9.3f}", err=True)
