"""``edgeagent plan``: Faro's latency estimates and cross-model replica allocation."""

from __future__ import annotations

import json
import math

import click

from agent.commands import ExtraGroup
from agent.commands.progress import Compilation, after
from agent.coordinator.choices import (DEFAULT_RATE_QUANTILE, ESTIMATORS, METHODS,
                                      OBJECTIVES, RHO_MAX, SIZE_MAX_SAMPLES, SIZE_METHODS)


@click.group("plan", cls=ExtraGroup, extra="coordinator")
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
    compilation = Compilation("compiling the planner's kernels (numba; once: later runs "
                              "load them from its cache) ...")
    try:
        problem = problem_from_dict(data, objective, estimator, rate_quantile)
        with compilation.watching(), after("solving ..."):
            result = solve(problem, method)
    except ProblemError as exc:
        raise click.ClickException(str(exc)) from None
    solver_s = max(0.0, result.solve_seconds - compilation.seconds)
    if as_json:
        click.echo(json.dumps({
            "replicas": result.replicas,
            "latency_ms": {k: v * 1000.0 for k, v in result.latency_s.items()},
            "utility": result.utility,
            "drop_rate": result.drop_rate,
            "objective": result.objective,
            "solver": result.solver,
            "solve_seconds": solver_s,
            "compile_seconds": compilation.seconds,
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
    compiled = (f" (and {compilation.seconds:.1f} s compiling its kernels, once)"
                if compilation.seconds else "")
    click.echo(f"objective {objective} = {result.objective:.6g}; cpu {used:g}/"
               f"{problem.capacity.cpu:g}; solver {result.solver}, "
               f"{solver_s * 1000:.1f} ms{compiled}")


@plan.command("size")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="Ribbon config JSON (ins_types, max_num; optional prices, "
                   "qos_target_percent).")
@click.option("--lookup", "lookup_path", type=click.Path(dir_okay=False), required=True,
              help='Lookup JSON: "a, b, c" -> [price_per_hour, qos_percent].')
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-samples", type=click.IntRange(min=1), default=None,
              help=f"Most configurations to evaluate [default: {SIZE_MAX_SAMPLES}; "
                   "exhaustive: all].")
@click.option("--method", type=click.Choice(SIZE_METHODS), default="bo", show_default=True,
              help="bo: Ribbon's Bayesian optimisation; random: pruned random search; "
                   "exhaustive: every configuration.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def size_cmd(config_path, lookup_path, seed, max_samples, method, as_json) -> None:
    """Cheapest pool of instance types that meets the QoS target (Ribbon)."""
    from agent.coordinator.ribbon.evaluators import LookupGridEvaluator, SizingError
    from agent.coordinator.ribbon.search import search

    try:
        evaluator = LookupGridEvaluator.from_files(config_path, lookup_path)
    except SizingError as exc:
        raise click.ClickException(str(exc)) from None
    space = evaluator.space

    def progress(i, sample, best):
        mark = "*" if best is sample else " "
        best_text = "-" if best is None else f"${best.price:.2f} [{_counts(best.counts)}]"
        click.echo(f"{mark}{i:4d}  [{_counts(sample.counts)}]  ${sample.price:7.2f}  "
                   f"{sample.qos_percent:6.2f}%  best {best_text}", err=True)

    try:
        result = search(evaluator, method, seed=seed, max_samples=max_samples,
                        on_sample=None if as_json else progress)
    except SizingError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    ended = ("nothing left to sample" if result.exhausted
             else f"sample budget ({result.samples}) spent")
    extra = f", {result.unmeasured} unmeasured skipped" if result.unmeasured else ""
    click.echo(f"{method}: {result.samples} of {space.size} configurations evaluated "
               f"({ended}{extra})")
    best = result.best
    if best is None:
        click.echo(f"no configuration evaluated met the QoS target "
                   f"({space.target_percent:g}%)")
        return
    width = max(8, *(len(t) for t in space.types))
    click.echo(f"{'type':<{width}}  count")
    for name, n in zip(space.types, best.counts):
        click.echo(f"{name:<{width}}  {n:5d}")
    click.echo(f"price ${best.price:.2f}/h, QoS {best.qos_percent:.2f}% "
               f"(target {space.target_percent:g}%), first evaluated at sample "
               f"{result.samples_to_best}")


def _counts(counts) -> str:
    return ", ".join(str(c) for c in counts)


@plan.command("provision")
@click.option("--problem", "problem_file", type=click.File("r"), required=True,
              help="Provisioning JSON: types (name, price_per_hour, capacity_rps or "
                   "batch_size + batch_ms, launch_s), forecast (req/s per step), step_s, "
                   "tau, slo_ms, running, scale_in_plans (cool-down, default 1: none), "
                   "recent_targets.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def provision_cmd(problem_file, as_json) -> None:
    """What to launch and stop now to serve the forecast cheaply (MArk)."""
    from agent.coordinator.provisioning import ProvisioningError, problem_from_dict

    try:
        data = json.load(problem_file)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{problem_file.name}: not valid JSON ({exc})") from None
    try:
        provisioner, forecast = problem_from_dict(data)
        decision = provisioner.step(forecast)
    except ProvisioningError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(decision.to_json()))
        return
    width = max(4, *(len(n) for n in decision.plan))
    click.echo(f"{'type':<{width}}  running  plan  launch  stop")
    before = {n: decision.plan[n] - decision.launch.get(n, 0) + decision.stop.get(n, 0)
              for n in decision.plan}
    for name, n in decision.plan.items():
        click.echo(f"{name:<{width}}  {before[name]:7d}  {n:4d}  {decision.launch.get(name, 0):6d}"
                   f"  {decision.stop.get(name, 0):4d}")
    click.echo(f"target {decision.target_rps:g} req/s (capacity kept for "
               f"{decision.held_rps:g}); ${decision.cost_per_hour_before:.3f}/h -> "
               f"${decision.cost_per_hour_after:.3f}/h")
