"""``edgeagent simulate``: replay a request trace against eviction policies and capacities.

Prints one row per (policy, capacity): a table by default, a JSON list with ``--json``;
``--plot`` draws mean load delay per request against capacity (CremeBrulee Fig. 8), or
with ``--queueing`` the response times and load waits. ``--demo`` needs no files: the
shipped CremeBrulee profiles on a synthetic workload. ``--from URL|DIR`` is the
what-if: a node's own record (``edgeagent cache trace``) through the twin.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click

from agent.commands import ExtraCommand
from agent.commands.progress import Compilation, after
from agent.units import parse_size

if TYPE_CHECKING:
    from cachepolicies.simulator import SimulationResult
    from cachepolicies.traces import Profiles, Trace

# cachepolicies.registry's names, spelled out so that ``--help`` compiles no kernel
# (numba) and reads no CSV module (pandas, pyarrow); tests/test_cli_lazy.py checks them.
POLICY_NAMES = ("lru", "random", "popularity", "gdsf", "beladymin", "cremebrulee",
                "cremebrulee-forecast", "cremebrulee-oracle")

DEMO_POLICIES = ("lru", "random", "popularity", "gdsf", "cremebrulee",
                 "cremebrulee-forecast", "beladymin", "cremebrulee-oracle")
DEMO_CAPACITIES = ("4GB", "8GB", "12GB", "16GB")

_PATH_IN = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("simulate", cls=ExtraCommand, extra="sim")
@click.option("--trace", "trace_path", type=_PATH_IN, help="Trace CSV: timestamp,model.")
@click.option("--profiles", "profiles_path", type=_PATH_IN,
              help="Profiles CSV: model,size_bytes,load_seconds,exec_seconds "
                   "[,first_exec_seconds,download_seconds,disk_bytes].")
@click.option("--capacity", "capacities", multiple=True,
              help="Cache capacity: bytes or units (16GB, 512MiB); repeat or comma-separate.")
@click.option("--policy", "policies", multiple=True,
              help=f"Policy spec, e.g. cremebrulee:rate=cumulative; repeatable. "
                   f"Names: {', '.join(POLICY_NAMES)}.")
@click.option("--from", "sources", multiple=True,
              help="What-if from a node's record: its URL (GET /v1/trace and /v1/profiles, "
                   "admin) or a directory written by 'edgeagent cache trace'; implies "
                   "--queueing. Repeat for a fleet: each node's record through its own "
                   "cache, then the fleet's sum.")
@click.option("--nodes", type=click.IntRange(min=1),
              help="Replay a fleet of this many nodes, --capacity each: the trace spread "
                   "round robin over them and routed by --routing (results per node and "
                   "the fleet's sum).")
@click.option("--routing", "routing_path", type=_PATH_IN,
              help="With --nodes: a routing table (JSON: the node's GET /v1/routing, the "
                   "coordinator's table, or GET /v1/plan with its assignment); a model it "
                   "names goes to its nodes by their replicas, others stay where they land.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
              help="Admin bearer token file for --from URL (or $EDGEAGENT_TOKEN).")
@click.option("--disk-capacity",
              help="Add the disk tier, starting empty, of this size (16GB, 512MiB): a miss "
                   "whose files are not on disk downloads them first (download_seconds).")
@click.option("--disk-policy",
              help="Policy spec of the disk tier [default: each run's --policy].")
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
@click.option("--max-concurrent-pulls", type=click.IntRange(min=1),
              help="Pull slots of the disk tier in queueing mode [default: the agent's "
                   "max_concurrent_pulls].")
@click.option("--pull-bandwidth",
              help="Bytes per second each pull may take in queueing mode (50MB) "
                   "[default: the agent's pull_bandwidth].")
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
    sources: Sequence[str],
    nodes: int | None,
    routing_path: Path | None,
    token_file: str | None,
    disk_capacity: str | None,
    disk_policy: str | None,
    as_json: bool,
    plot_path: Path | None,
    queueing: bool,
    workers: int | None,
    load_concurrency: int | None,
    max_concurrent_pulls: int | None,
    pull_bandwidth: str | None,
    seed: int,
    progress: bool | None,
    demo: bool,
) -> None:
    """Simulate model-level caching: load delay per policy and capacity."""
    if progress is None:
        progress = sys.stderr.isatty()
    settings: dict[str, object] = {}
    if routing_path is not None and nodes is None:
        raise click.UsageError("--routing needs --nodes")
    if len(sources) > 1 or nodes is not None:
        if len(sources) == 1 or (nodes is not None and (sources or demo)):
            raise click.UsageError("--nodes spreads one --trace; a fleet of records is "
                                   "--from given once per node")
        _simulate_fleet(sources, token_file, trace_path, profiles_path, nodes, routing_path,
                        capacities, policies, seed=seed, as_json=as_json,
                        progress=progress, workers=workers, queueing=queueing or bool(sources),
                        load_concurrency=load_concurrency)
        return
    source = sources[0] if sources else None
    native = None
    try:
        if source is not None:
            if trace_path or profiles_path or demo:
                raise click.UsageError("--from replaces --trace, --profiles and --demo")
            queueing = True
            with tempfile.TemporaryDirectory() as tmp:
                trace_path, profiles_path = _record_files(source, token_file, Path(tmp))
                settings = record_settings(profiles_path, source)
                trace, profiles = _read_record(source, trace_path, profiles_path)
            from cachepolicies.simulator import sweep
            if not capacities or not policies:
                raise click.UsageError("--from needs --capacity and --policy")
        elif demo:
            policies = policies or DEMO_POLICIES
            native = _native_replays(policies, queueing or disk_capacity is not None, progress)
            from cachepolicies.simulator import sweep

            trace, profiles = _demo_workload(seed)
            capacities = capacities or DEMO_CAPACITIES
        else:
            missing = [flag for flag, value in (("--trace", trace_path),
                                                ("--profiles", profiles_path),
                                                ("--capacity", capacities),
                                                ("--policy", policies)) if not value]
            if missing:
                raise click.UsageError(f"missing {', '.join(missing)} (or use --demo)")
            # The CSVs parse in pyarrow's threads, mostly without the GIL, while this
            # thread loads the replays (or imports numba); read errors are raised by
            # result().
            with ThreadPoolExecutor(1) as reader:
                inputs = reader.submit(_read_inputs, trace_path, profiles_path)
                native = _native_replays(policies, queueing or disk_capacity is not None,
                                         progress)
                from cachepolicies.simulator import sweep

                trace, profiles = inputs.result()
        sizes = _parse_capacities(capacities)
        if disk_policy is not None and disk_capacity is None:
            raise click.UsageError("--disk-policy needs --disk-capacity")
        disk = None if disk_capacity is None else _parse_size(disk_capacity, "--disk-capacity")
        twin = None
        if queueing:
            from agent.config import AgentConfig
            from agent.config.twinsettings import twin_settings

            twin = twin_settings(
                AgentConfig(), settings, workers=workers, load_concurrency=load_concurrency,
                max_concurrent_pulls=max_concurrent_pulls,
                pull_bandwidth=None if pull_bandwidth is None else
                _parse_size(pull_bandwidth, "--pull-bandwidth"))
        runs = len(sizes) * len(policies)
        # the replays compiled ahead of time need no numba (watching its compile events
        # would import it)
        compilation = contextlib.nullcontext() if native is not None else Compilation(
            "compiling the policy kernels (numba; once: later runs load them from its "
            "cache) ...").watching()
        with compilation, (contextlib.nullcontext() if progress else after(
                f"simulating {len(trace)} requests, {runs} run(s) ...")):
            results = sweep(trace, profiles, sizes, list(policies), seed=seed,
                            queueing=twin, progress=progress, disk_capacity=disk,
                            disk_policy=disk_policy, native=native)
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


def _simulate_fleet(sources: Sequence[str], token_file: str | None,
                    trace_path: Path | None, profiles_path: Path | None, nodes: int | None,
                    routing_path: Path | None, capacities: Sequence[str],
                    policies: Sequence[str], *, seed: int, as_json: bool, progress: bool,
                    workers: int | None, queueing: bool,
                    load_concurrency: int | None) -> None:
    """A fleet replayed (``cachepolicies.fleet``): one trace over ``nodes``, or each
    node's record (``sources``); one row per node and per (policy, capacity) its sum."""
    if not capacities or not policies:
        raise click.UsageError("a fleet needs --capacity (each node's) and --policy")
    try:
        from agent.config import AgentConfig
        from agent.config.twinsettings import twin_settings
        from cachepolicies.fleet import fleet_nodes, fleet_total, routing_weights, spread
        from cachepolicies.simulator import sweep

        runs = []  # (node, trace, profiles, settings)
        if sources:
            for i, source in enumerate(sources):
                with tempfile.TemporaryDirectory() as tmp:
                    paths = _record_files(source, token_file, Path(tmp))
                    runs.append((f"node-{i}", *_read_inputs(*paths), record_settings(paths[1])))
        else:
            if trace_path is None or profiles_path is None:
                raise click.UsageError("--nodes needs --trace and --profiles")
            trace, profiles = _read_inputs(trace_path, profiles_path)
            weights = routing_weights(json.loads(routing_path.read_text())) \
                if routing_path is not None else {}
            names = fleet_nodes(nodes or 1, weights)
            runs = [(node, part, profiles, {}) for node, part in
                    spread(trace, profiles, names, weights).items()]
        sizes = _parse_capacities(capacities)
        rows: list[tuple[str, SimulationResult]] = []
        per_node = []
        for node, trace, profiles, settings in runs:
            twin = twin_settings(AgentConfig(), settings, workers=workers,
                                 load_concurrency=load_concurrency) if queueing else None
            results = sweep(trace, profiles, sizes, list(policies), seed=seed,
                            queueing=twin, progress=progress) if len(trace) else []
            per_node.append(results)
            rows += [(node, r) for r in results]
        for k in range(len(sizes) * len(policies)):
            done = [results[k] for results in per_node if results]
            if done:
                rows.append(("fleet", fleet_total(done)))
    except (ValueError, OSError) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps([{"node": node, **r.to_dict()} for node, r in rows], indent=2))
    else:
        from dataclasses import replace

        click.echo(format_table([replace(r, policy=f"{r.policy}@{node}") for node, r in rows]))


def _native_replays(specs: Sequence[str], queued_or_tiered: bool,
                    announce: bool) -> Mapping[str, ModuleType] | None:
    """The policies' replays compiled ahead of time (``cachepolicies.native``, built on
    first use), where every run is a plain replay and ``EDGEAGENT_JIT`` is unset; then
    this process interprets its policy objects, and numba never loads. None: numba's
    JIT replays them, as with ``EDGEAGENT_JIT=1``."""
    names = [spec.partition(":")[0].strip() for spec in specs]
    if (queued_or_tiered or os.environ.get("EDGEAGENT_JIT") is not None
            or not set(names) <= set(POLICY_NAMES)):
        return None
    from cachepolicies import native

    def building(missing: list[str]) -> None:
        if announce:
            click.echo(f"compiling the replay of {', '.join(missing)} ahead of time (once "
                       "after an install or an edit of cachepolicies)", err=True)

    modules = native.ensure(names, on_build=building)
    if modules is not None:
        os.environ["EDGEAGENT_JIT"] = "0"  # read when cachepolicies.jit is imported, next
    return modules


def _record_files(source: str, token_file: str | None, tmp: Path) -> tuple[Path, Path]:
    """The trace and profiles files of ``--from``: fetched from a node's URL into
    ``tmp``, or those of a directory written by ``edgeagent cache trace``."""
    from agent.commands.agentapi import read_token
    from agent.commands.cache import PROFILES_FILE, TRACE_FILE, fetch_record

    if source.startswith(("http://", "https://")):
        texts = fetch_record(source, read_token(token_file))
        for name, text in zip((TRACE_FILE, PROFILES_FILE), texts):
            (tmp / name).write_text(text)
        directory = tmp
    else:
        directory = Path(source)
        if not directory.is_dir():
            raise click.BadParameter(f"{source!r} is neither an http(s) URL nor a "
                                     "directory", param_hint="--from")
    paths = directory / TRACE_FILE, directory / PROFILES_FILE
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise click.BadParameter(f"{directory} has no {' or '.join(missing)} (write both "
                                 "with: edgeagent cache trace --out DIR)", param_hint="--from")
    return paths


def _read_record(source: str, trace_path: Path, profiles_path: Path
                 ) -> tuple[Trace, Profiles]:
    """A node's record (``--from``): requests of models with no profile (never loaded
    there: a bad config, a failed load) are left out and counted on stderr, as the
    dashboard's what-if leaves them out; messages name where the files came from."""
    from cachepolicies.traces import read_profiles, read_trace

    remote = source.startswith(("http://", "https://"))
    names = ((f"{source.rstrip('/')}/v1/trace", f"{source.rstrip('/')}/v1/profiles")
             if remote else (None, None))
    profiles = read_profiles(profiles_path, name=names[1])
    trace = read_trace(trace_path, profiles, name=names[0], skip_unknown=True)
    if trace.skipped:
        shown = ", ".join(trace.skipped_models[:5]) + (
            f" and {len(trace.skipped_models) - 5} more"
            if len(trace.skipped_models) > 5 else "")
        click.echo(f"skipped {trace.skipped} of {trace.skipped + len(trace)} request(s): "
                   f"{shown} never loaded on the node (no profile to replay them with)",
                   err=True)
    return trace, profiles


def record_settings(profiles_path: Path, source: str | None = None) -> dict[str, object]:
    """The twin's settings a node's profiles file gives (``agent.config.twinsettings``);
    ``source``: the node's URL it was fetched from (errors name it, not the copy)."""
    from agent.config.twinsettings import recorded_settings

    shown = f"{source.rstrip('/')}/v1/profiles" if source and source.startswith(
        ("http://", "https://")) else profiles_path
    with open(profiles_path, newline="") as f:
        try:
            return recorded_settings(list(csv.DictReader(f)))
        except ValueError as error:
            raise click.ClickException(f"{shown}: {error}") from None


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
            sizes.append(_parse_size(item.strip(), "--capacity"))
    return sizes


def _parse_size(value: str, option: str) -> int:
    """A byte count or a size with units, or a usage error naming ``option``."""
    try:
        return parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=option) from None


def format_table(results: Sequence[SimulationResult]) -> str:
    """An aligned text table, one row per result."""
    queueing = any(r.workers is not None for r in results)
    tiered = any(r.disk_capacity_bytes is not None for r in results)
    header = ["policy", "capacity", "requests", "hits", "misses", "hit%", "load_delay_s",
              "mean_delay_s", "evictions", "loaded"]
    if queueing:
        header += ["load_wait_s", "failed", "mean_resp_s", "p95_resp_s", "p99_resp_s",
                   "slo_viol"]
    if tiered:
        header += ["disk", "disk_policy", "downloads", "download_s", "pulled",
                   "disk_evictions"]
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
        if tiered:
            row += [_size_label(r.disk_capacity_bytes), r.disk_policy, str(r.downloads),
                    f"{r.download_delay_seconds:.1f}",
                    _size_label(r.bytes_downloaded, exact=False), str(r.disk_evictions)]
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
    """Mean load delay per request against capacity (log2 axis), one line per policy;
    with response times (the twin), mean and p99 response and the loads' wait too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    twin = all(r.mean_response_seconds is not None for r in results)
    panels = ((("mean_response_seconds", "mean response"),
               ("p99_response_seconds", "p99 response")),
              (("mean_load_delay_seconds", "load delay per request"),)) if twin \
        else ((("mean_load_delay_seconds", "mean model load delay per request"),),)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, lines in zip(axes[0], panels):
        for i, policy in enumerate(dict.fromkeys(r.policy for r in results)):
            mine = sorted((r for r in results if r.policy == policy),
                          key=lambda r: r.capacity_bytes)
            for (field, label), style in zip(lines, ("-", "--")):
                ax.plot([r.capacity_bytes / 1e9 for r in mine],
                        [getattr(r, field) for r in mine], style, marker="o",
                        color=f"C{i}", label=f"{policy}: {label}" if twin else policy)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache capacity (GB)")
        ax.set_ylabel("seconds" if twin else lines[0][1] + " (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0][0].set_title("Response against cache capacity" if twin
                         else "Load delay against cache capacity")
    if twin:
        axes[0][1].set_title("Load delay against cache capacity")
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
