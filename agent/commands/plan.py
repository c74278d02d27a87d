"""``edgeagent plan``: Faro's latency estimates and cross-model replica allocation."""

from __future__ import annotations

import json
import math

import click

# Faro's choices and defaults, spelled out so that ``--help`` imports no scipy; each is
# checked against its source (faro.latency, .objectives, .problem, .solver) by
# tests/test_cli_lazy.py.
ESTIMATORS = ("mdc", "upper")
RHO_MAX = 0.95
OBJECTIVES = ("sum", "fair", "fairsum", "penaltysum", "penaltyfairsum")
DEFAULT_RATE_QUANTILE = 0.9
METHODS = ("auto", "fast", "cobyla", "cobyla-hierarchical", "exhaustive")


@click.group("plan")
def plan() -> None:
    """Plan replicas per model under latency SLOs and cluster limits (Faro)."""


@plan.command("latency")
@click.option("--proc-ms", type=float, required=True, help="Processing time per request (ms).")
@click.option("--rate", type=float, required=True, help="Arrival rate (requests/s).")
@click.option("--replicas", type=int, required=True, help="Number of replicas N.")
@click.option("--percentile", type=float, required=True, help="Latency percentile, e.g. 99.9.")
@click.option("--estimator", type=click.Choice(ESTIMATORS), default="mdc", show_default=True)
@click.option("--rho-max", type=float, default=RHO_MAX, show_default=True,
              help="Utilisation above which the relaxed estimate is used.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def latency_cmd(proc_ms, rate, replicas, percentile, estimator, rho_max, as_json) -> None:
    """Estimated PERCENTILE-th latency of REPLICAS replicas (relaxed if unstable)."""
    from agent.coordinator.faro.latency import estimate_latency

    try:
        seconds = estimate_latency(percentile, proc_ms / 1000.0, rate, replicas, estimator,
                                   rho_max)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    ms = seconds * 1000.0
    if as_json:
        click.echo(json.dumps({"latency_ms": ms}))
        return
    rho = rate * proc_ms / 1000.0 / replicas
    note = " (relaxed: unstable queue)" if estimator == "mdc" and rho > rho_max else ""
    click.echo(f"p{percentile:g} latency: {ms:.3f} ms  [{estimator}, rho={rho:.3f}]{note}")


@plan.command("allocate")
@click.option("--problem", "problem_file", type=click.File("r"), required=True,
              help="Problem JSON (capacity and models).")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="fairsum",
              show_default=True)
@click.option("--estimator", type=click.Choice(ESTIMATORS), default="mdc", show_default=True)
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True,
              help="Solver; auto runs every one that fits the problem size.")
@click.option("--rate-quantile", type=click.FloatRange(0.0, 1.0), default=DEFAULT_RATE_QUANTILE,
              show_default=True, help="Quantile of rate_samples to plan for.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def allocate_cmd(problem_file, objective, estimator, method, rate_quantile, as_json) -> None:
    """Replicas per model that maximise the cluster objective within capacity."""
    from agent.coordinator.faro.problem import ProblemError, problem_from_dict
    from agent.coordinator.faro.solver import solve

    try:
        data = json.load(problem_file)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{problem_file.name}: not valid JSON ({exc})") from None
    try:
        problem = problem_from_dict(data, objective, estimator, rate_quantile)
        result = solve(problem, method)
    except ProblemError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({
            "replicas": result.replicas,
            "latency_ms": {k: v * 1000.0 for k, v in result.latency_s.items()},
            "utility": result.utility,
            "drop_rate": result.drop_rate,
            "objective": result.objective,
            "solver": result.solver,
            "solve_seconds": result.solve_seconds,
        }))
        return
    slo = {m.name: m.slo_s * 1000.0 for m in problem.models}
    width = max(5, *(len(m.name) for m in problem.models))
    click.echo(f"{'model':<{width}}  replicas  latency_ms    slo_ms  utility  drop")
    for name, n in result.replicas.items():
        lat = result.latency_s[name] * 1000.0
        lat_text = f"{lat:10.1f}" if math.isfinite(lat) else f"{'inf':>10}"
        click.echo(f"{name:<{width}}  {n:8d}  {lat_text}  {slo[name]:8.1f}  "
                   f"{result.utility[name]:7.3f}  {result.drop_rate[name]:4.1%}")
    used = sum(n * m.cpu_per_replica for n, m in zip(result.replicas.values(), problem.models))
    click.echo(f"objective {objective} = {result.objective:.6g}; cpu {used:g}/"
               f"{problem.capacity.cpu:g}; solver {result.solver}, "
               f"{result.solve_seconds * 1000:.1f} ms")
