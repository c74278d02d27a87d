"""``edgeagent coordinator serve`` and the catalog/plan client commands
(``models ls|set|rm``, ``nodes``, ``plan [--now]``, ``size``, ``provision``,
``rollout start|status|pause|resume|abort|clear``)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from agent.commands import ExtraCommand, declared_option, self_command, tls_options
from agent.commands.output import age, show_json
from agent.commands.progress import after
from agent.commands.output import size as size_text
from agent.coordinator.choices import SIZE_MAX_SAMPLES, SIZE_METHODS
from agent.coordinator.config import (ConfigError, CoordinatorConfig,
                                      load_coordinator_config)

# asyncio, urllib, YAML and the coordinator (aiohttp, scipy) are imported by the code
# that runs: ``--help`` and the client commands pay for the config's declaration (the
# flags' help) and for what they use.

log = logging.getLogger("edgeagent.coordinator")
DEFAULT_URL = "http://127.0.0.1:8100"


@click.group("coordinator")
def coordinator() -> None:
    """Run the fleet coordinator (Faro planning) or talk to one."""


# -- serve ------------------------------------------------------------------------------


async def run_coordinator(config: CoordinatorConfig, *, announce: bool = True) -> None:
    """Serve until SIGTERM/SIGINT; SIGHUP re-reads the token and TLS files."""
    import asyncio
    import signal

    from agent.coordinator.app import (COORDINATOR, create_app, raw_answer,
                                       start_report_workers)
    from agent.coordinator.lane import raw_take
    from agent.http.connections import server_connections
    from agent.http.eventloop import listen, settle_gc
    from agent.http.rawlane import RawLanes
    from agent.node.sdnotify import notify

    app = create_app(config)
    co = app[COORDINATOR]
    warning = store_verification_warning(config.store)
    if warning:
        log.warning("%s", warning)
    lanes = RawLanes(raw_take(co.guard, lambda: co.names, raw_answer(co), log),
                     timeout_s=config.read_timeout_s, max_body=config.max_request_size)
    co.raw_lanes = lanes
    runner, url = await listen(app, config.host, config.port, server_connections(config),
                               backlog=4096,  # a fleet
                               reuse_port=config.report_workers > 0, front=lanes.front,
                               ssl_context=co.tls.context if co.tls else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def reload() -> None:
        notify("RELOADING=1")
        try:
            co.reload()
            log.info("SIGHUP: reloaded")
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping what runs: %s", exc)
        notify("READY=1")

    try:  # whatever fails from here on (a closed stdout, say) still stops the workers
        await start_report_workers(app, runner, int(url.rsplit(":", 1)[1]))
        settle_gc()
        loop.add_signal_handler(signal.SIGHUP, reload)
        log.info("coordinator on %s, state in %s (plan every %gs over %gs, reactive every "
                 "%gs; %d report workers)", url, config.database, config.plan_interval_s,
                 config.plan_window_s, config.reactive_interval_s, config.report_workers)
        if announce:
            click.echo(f"edgeagent coordinator listening on {url}  (state: {config.database})")
            click.echo(f"  curl -s {url}/v1/nodes")
            click.echo(f"  {self_command()} coordinator models set MODEL --slo-ms 100 "
                       f"--url {url}")
            sys.stdout.flush()
        notify(f"READY=1\nSTATUS=coordinating on {url}")
        await stop.wait()
    finally:
        notify("STOPPING=1")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        lanes.close()  # no lease answered after the last group commit
        await runner.cleanup()  # stops the workers and the planning loops, closes the database
        log.info("stopped")


def store_verification_warning(store: str | None) -> str | None:
    """A warning for a PostgreSQL store on another host whose server certificate is not
    verified (libpq's default sslmode, prefer, accepts any); None otherwise. It names
    the host and sslmode, never the password."""
    if store is None or not store.startswith(("postgresql:", "postgres:")):
        return None
    from psycopg.conninfo import conninfo_to_dict

    from agent.security.exposure import is_loopback

    try:
        params = conninfo_to_dict(store)
    except Exception:  # noqa: BLE001 - a bad URL fails at connect, with psycopg's words
        return None
    hosts = [h for h in str(params.get("host") or "").split(",") if h]
    remote = [h for h in hosts if not h.startswith("/") and not is_loopback(h)]
    sslmode = params.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer"
    if not remote or sslmode in ("verify-ca", "verify-full"):
        return None
    return (f"store: PostgreSQL on {', '.join(remote)} with sslmode={sslmode}: the "
            "server's certificate is not verified (add ?sslmode=verify-full&sslrootcert="
            "/path/to/ca.crt to the store URL; docs/operations.md, TLS)")


@coordinator.command("serve", cls=ExtraCommand, extra="coordinator")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="Coordinator config YAML (edgeagent config example coordinator shows "
                   "every key); default: the embedded defaults.")
@declared_option(CoordinatorConfig, "host")
@declared_option(CoordinatorConfig, "port")
@declared_option(CoordinatorConfig, "state_dir",
                 type=click.Path(file_okay=False, path_type=Path))
@declared_option(CoordinatorConfig, "log_level")
@declared_option(CoordinatorConfig, "report_workers")
@declared_option(CoordinatorConfig, "insecure", is_flag=True, flag_value=True, default=None)
def serve(config_file: str | None, host: str | None, port: int | None,
          state_dir: Path | None, log_level: str | None, report_workers: int | None,
          insecure: bool | None) -> None:
    """Run the coordinator: node reports in, Faro plans and directives out."""
    from agent.http.eventloop import run_event_loop
    from agent.config.preflight import check_server

    try:  # what config check refuses
        config = load_coordinator_config(config_file).with_overrides(
            host=host, port=port, state_dir=state_dir.resolve() if state_dir else None,
            log_level=log_level, report_workers=report_workers, insecure=insecure)
        check_server(config, config_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_event_loop(run_coordinator(config))
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None


# -- client commands --------------------------------------------------------------------


def _client_options(f: Any) -> Any:
    f = click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
                     help="Admin bearer token file (or $EDGEAGENT_COORDINATOR_TOKEN).")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)
    f = tls_options(f)
    return click.option(
        "--url", default=lambda: os.environ.get("EDGEAGENT_COORDINATOR_URL", DEFAULT_URL),
        show_default="$EDGEAGENT_COORDINATOR_URL or " + DEFAULT_URL,
        help="The coordinator's URL.")(f)


def _call(url: str, token_file: str | None, method: str, path: str,
          body: Any = None) -> Any:
    from agent.commands.http import call_json

    token = open(token_file).read().strip() if token_file \
        else os.environ.get("EDGEAGENT_COORDINATOR_TOKEN")
    return call_json(url, method, path, body, token=token, server="coordinator", timeout=120)


def _table(head: list[str], rows: list[list[str]], drop_order: tuple[str, ...] = ()) -> str:
    from agent.commands.output import table

    return table(head, rows, drop_order=drop_order)


def _fmt(x: Any, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


@coordinator.group("models")
def models() -> None:
    """The model catalog: SLOs and priorities the planner works with."""


@models.command("ls")
@_client_options
def models_ls(url: str, as_json: bool, token_file: str | None) -> None:
    """List catalogued models with their planned replicas."""
    doc = _call(url, token_file, "GET", "/v1/models")
    if as_json:
        show_json(doc)
        return
    click.echo(_table(
        ["NAME", "SLO_MS", "PCTL", "PRIORITY", "CPU/REPL", "PROC_MS", "REPLICAS",
         "PRED_MS", "NODES", "SOURCE"],
        [[m["name"], _fmt(m["slo_ms"]), _fmt(m["percentile"]), _fmt(m["priority"]),
          _fmt(m["cpu_per_replica"]), _fmt(m["proc_ms"]), _fmt(m["replicas"]),
          _fmt(m["predicted_latency_ms"], ".1f"), ",".join(m["nodes"]) or "-",
          _fmt(m.get("source"))] for m in doc]))


@models.command("set")
@click.argument("name")
@click.option("--slo-ms", type=float, required=True, help="Latency SLO in milliseconds.")
@click.option("--percentile", type=float, help="SLO percentile (default 99).")
@click.option("--priority", type=float, help="Priority π (default 1).")
@click.option("--cpu-per-replica", type=float, help="Cores per replica (default 1).")
@click.option("--memory-per-replica", "memory_per_replica_bytes", type=float,
              help="Working memory per replica in bytes (default 0).")
@click.option("--proc-ms", type=float,
              help="Processing time to assume until nodes measure one.")
@click.option("--source", help="Where nodes pull it from (s3://, oci://, https://, "
              "file://): then any live node may serve it.")
@click.option("--source-option", "source_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the source (repeatable; a JSON value or a string); "
                   "never a credential: nodes use their own.")
@click.option("--version", "version", type=int,
              help="The version nodes serve; a new one rolls out in waves (edgeagent "
                   "coordinator rollout status).")
@click.option("--digest", help="sha256:<hex> of the version, carried to the nodes.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="A model config.yaml whose keys the nodes serve it with.")
@_client_options
def models_set(name: str, url: str, as_json: bool, token_file: str | None,
               source_options: tuple[str, ...], config_file: str | None,
               **fields: Any) -> None:
    """Add or update NAME's SLO (and where it comes from) in the catalog."""
    body = {k: v for k, v in fields.items() if v is not None}
    if source_options:
        body["source_options"] = dict(_option(o) for o in source_options)
    if config_file:
        from pathlib import Path

        from agent.validation import load_yaml

        body["config"] = load_yaml(Path(config_file)) or {}
    doc = _call(url, token_file, "PUT", f"/v1/models/{name}", body)
    click.echo(json.dumps(doc, indent=2) if as_json else
               f"{name}: SLO {doc['slo_ms']:g} ms at p{doc['percentile']:g}, "
               f"priority {doc['priority']:g}"
               + (f", from {doc['source']}" if doc.get("source") else "")
               + (f"; rollout {doc['rollout_id']} started" if doc.get("rollout_id") else ""))


def _option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--source-option``: the value as JSON where it parses."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}",
                                 param_hint="--source-option")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


@models.command("rm")
@click.argument("name")
@_client_options
def models_rm(name: str, url: str, as_json: bool, token_file: str | None) -> None:
    """Remove NAME from the catalog (it is no longer planned)."""
    doc = _call(url, token_file, "DELETE", f"/v1/models/{name}")
    click.echo(json.dumps(doc) if as_json else f"removed {name}")


@coordinator.command("nodes")
@_client_options
def nodes(url: str, as_json: bool, token_file: str | None) -> None:
    """List the nodes that report to the coordinator."""
    doc = _call(url, token_file, "GET", "/v1/nodes")
    if as_json:
        show_json(doc)
        return
    click.echo(_table(
        ["NAME", "ALIVE", "LAST_REPORT", "CORES", "CPU_MEM", "MODELS", "RESIDENT", "PINNED"],
        [[n["name"], "yes" if n["alive"] else "no", f"{age(n['age_s'])} ago",
          _fmt((n["capacity"] or {}).get("cores")),
          size_text((n["capacity"] or {}).get("cpu_memory_bytes")),
          str(len(n["models"])),
          ",".join(sorted(k for k, m in n["models"].items() if m.get("resident"))) or "-",
          ",".join(sorted((n["directives"] or {}).get("pin", []))) or "-"]
         for n in doc], drop_order=("PINNED", "RESIDENT")))


@coordinator.command("plan")
@click.option("--now", "replan", is_flag=True, help="Re-plan now instead of showing "
                                                   "the current plan.")
@_client_options
def plan(replan: bool, url: str, as_json: bool, token_file: str | None) -> None:
    """Show the current allocation and placement (or re-plan with --now)."""
    doc = _call(url, token_file, "POST" if replan else "GET", "/v1/plan")
    if as_json:
        show_json(doc)
        return
    click.echo(f"plan {doc['id']} ({doc['kind']}, solver {doc['solver'] or '-'}, "
               f"objective {doc['objective']})")
    click.echo(_table(
        ["MODEL", "REPLICAS", "RATE/S", "PROC_MS", "SLO_MS", "PRED_MS", "UTILITY",
         "PLACEMENT"],
        [[name, str(m["replicas"]), _fmt(m["rate"]), _fmt(m["proc_ms"]), _fmt(m["slo_ms"]),
          _fmt(m["predicted_latency_ms"], ".1f"), _fmt(m["utility"], ".3f"),
          ",".join(f"{n}={c}" for n, c in sorted(m["placement"].items()))
          + (f" (+{m['unplaced']} unplaced)" if m["unplaced"] else "")]
         for name, m in sorted(doc["models"].items())]))


@coordinator.command("size")
@click.option("--node-types", "node_types_file", type=click.File("r"),
              help="JSON object {kind: {price_per_hour, max_count, cores, "
                   "cpu_memory_bytes, proc_ms}} over the coordinator's node_types "
                   "[default: the kinds the live nodes report].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--max-samples", type=click.IntRange(min=1), default=None,
              help=f"Most pools to evaluate [default: {SIZE_MAX_SAMPLES}; exhaustive: all].")
@click.option("--method", type=click.Choice(SIZE_METHODS), default="bo", show_default=True)
@click.option("--qos-target", type=float, default=None,
              help="Share of requests within SLO to reach, percent [default: 99].")
@_client_options
def size(node_types_file, seed: int, max_samples: int | None, method: str,
         qos_target: float | None, url: str, as_json: bool, token_file: str | None) -> None:
    """Cheapest pool of node kinds for the live fleet's forecast load (Ribbon + Faro)."""
    body: dict[str, Any] = {"seed": seed, "method": method}
    if node_types_file is not None:
        try:
            body["node_types"] = json.load(node_types_file)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{node_types_file.name}: not valid JSON ({exc})") \
                from None
    else:
        body["from_reports"] = True
    if max_samples is not None:
        body["max_samples"] = max_samples
    if qos_target is not None:
        body["qos_target_percent"] = qos_target
    with after(f"sizing on the coordinator ({method}) ..."):
        doc = _call(url, token_file, "POST", "/v1/sizing", body)
    if as_json:
        show_json(doc)
        return
    click.echo(f"{doc['method']}: {doc['samples']} pools evaluated; QoS target "
               f"{doc['qos_target_percent']:g}% of requests within SLO")
    if doc["best"] is None:
        click.echo("no pool evaluated met the QoS target")
        return
    click.echo(_table(["KIND", "COUNT"],
                      [[t, str(n)] for t, n in zip(doc["types"], doc["best"])]))
    click.echo(f"price ${doc['price']:.3f}/h, QoS {doc['qos_percent']:.2f}%, first "
               f"evaluated at sample {doc['samples_to_best']}")
    click.echo(_table(["MODEL", "RATE/S", "SLO_MS", "REPLICAS"],
                      [[name, _fmt(m["rate"]), _fmt(m["slo_ms"]),
                        ",".join(f"{k}={n}" for k, n in
                                 sorted((doc["replicas"] or {}).get(name, {}).items())) or "-"]
                       for name, m in sorted(doc["models"].items())]))


@coordinator.command("provision")
@_client_options
def provision(url: str, as_json: bool, token_file: str | None) -> None:
    """What to launch and stop now for the forecast, and the cost per hour (MArk)."""
    doc = _call(url, token_file, "GET", "/v1/provisioning")
    if as_json:
        show_json(doc)
        return
    click.echo(_table(
        ["KIND", "CAPACITY_RPS", "PRICE/H", "RUNNING", "PLAN", "LAUNCH", "STOP"],
        [[name, _fmt(t["capacity_rps"]), _fmt(t["price_per_hour"]), str(t["running"]),
          str(doc["plan"].get(name, 0)), str(doc["launch"].get(name, 0)),
          str(doc["stop"].get(name, 0))] for name, t in sorted(doc["types"].items())]))
    click.echo(f"target {doc['target_rps']:.4g} req/s; ${doc['cost_per_hour_before']:.3f}/h"
               f" -> ${doc['cost_per_hour_after']:.3f}/h")
    for name, why in sorted(doc["left_out"].items()):
        click.echo(f"left out {name}: {why}")
    if doc["unpriced_running"]:
        click.echo(f"running kinds without a price (not counted): "
                   f"{', '.join(doc['unpriced_running'])}")


# -- rollouts ----------------------------------------------------------------------------


@coordinator.group("rollout")
def rollout() -> None:
    """Roll a model's new version out in waves, watch it, pause, resume or abort it."""


def _waves(text: str | None) -> list[Any] | None:
    """``--waves 1,25%``: counts and shares."""
    if text is None:
        return None
    out: list[Any] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        out.append(int(part) if part.isdigit() else part)
    return out


def _ago(seconds: Any, since: Any) -> str:
    return "-" if seconds is None or since is None else f"+{seconds - since:.1f}s"


def _rollout_lines(r: dict[str, Any]) -> list[str]:
    """One rollout for people: its state, then each wave's start and completion."""
    frm, to = r["from"], r["to"]
    lines = [f"rollout {r['id']} of {r['model']}: version {frm['version']} -> "
             f"{to['version']}, {r['state']}"
             + (f", wave {r['wave']}/{len(r['waves'])} {r['phase']}"
                if r["state"] in ("running", "paused") else "")
             + (f": {r['reason']}" if r.get("reason") else "")]
    for wave in r["history"]:
        lines.append(f"  wave {wave['wave']} ({', '.join(wave['nodes'])}): started "
                     f"{_ago(wave.get('started'), r['created'])}, serving "
                     f"{_ago(wave.get('serving'), r['created'])}, completed "
                     f"{_ago(wave.get('completed'), r['created'])}")
    figures = r.get("figures") or {}
    for side in ("new", "old"):
        f = figures.get(side)
        if f:
            lines.append(f"  {side}: {_fmt(f['requests'])} answers, error rate "
                         f"{_fmt(f['error_rate'])}, p{r['percentile']:g} "
                         f"{_fmt(f['latency_ms'], '.1f')} ms, size "
                         f"{_fmt(f['size_bytes'], '.3g')} B")
    return lines


@rollout.command("start")
@click.argument("model")
@click.option("--version", "version", type=int, required=True, help="The version to roll out.")
@click.option("--digest", help="sha256:<hex> the version must have.")
@click.option("--waves", help="Wave sizes in order, the first the canary: counts or shares "
                              "(1,25%); the rest of the nodes form a last wave.")
@click.option("--bake-s", type=float, help="Seconds each wave bakes before the next.")
@click.option("--wave-timeout-s", type=float,
              help="Seconds a wave's node may take to serve the new version.")
@click.option("--traffic-share", type=float,
              help="The share (0.01-0.99) of the model's routed requests the nodes on "
                   "the new version carry while others serve the old one.")
@click.option("--gate", "gates", multiple=True, metavar="KEY=VALUE",
              help="A gate (max_error_rate, max_latency_ratio, min_latency_increase_ms, "
                   "max_load_failures, max_memory_ratio, min_requests); repeatable.")
@_client_options
def rollout_start(model: str, version: int, digest: str | None, waves: str | None,
                  bake_s: float | None, wave_timeout_s: float | None,
                  traffic_share: float | None, gates: tuple[str, ...], url: str, as_json: bool,
                  token_file: str | None) -> None:
    """Roll MODEL from the catalog's version to VERSION in waves."""
    body: dict[str, Any] = {"model": model, "version": version}
    for key, value in (("digest", digest), ("waves", _waves(waves)), ("bake_s", bake_s),
                       ("wave_timeout_s", wave_timeout_s), ("traffic_share", traffic_share)):
        if value is not None:
            body[key] = value
    if gates:
        body["gates"] = dict(_option(g) for g in gates)
    doc = _call(url, token_file, "POST", "/v1/rollouts", body)
    click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(_rollout_lines(doc)))


@rollout.command("status")
@click.argument("rollout_id", required=False, type=int)
@click.option("--model", help="Only this model's rollouts.")
@click.option("--active", is_flag=True, help="Only the rollouts under way.")
@_client_options
def rollout_status(rollout_id: int | None, model: str | None, active: bool, url: str,
                   as_json: bool, token_file: str | None) -> None:
    """Show one rollout (its waves' times and figures) or list them, newest first."""
    if rollout_id is not None:
        doc = _call(url, token_file, "GET", f"/v1/rollouts/{rollout_id}")
        click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(_rollout_lines(doc)))
        return
    from urllib.parse import urlencode

    query = urlencode({k: v for k, v in (("model", model), ("active", "1" if active else None))
                       if v is not None})
    doc = _call(url, token_file, "GET", "/v1/rollouts" + (f"?{query}" if query else ""))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(_table(
        ["ID", "MODEL", "FROM", "TO", "STATE", "WAVE", "PHASE", "REASON"],
        [[str(r["id"]), r["model"], str(r["from"]["version"]), str(r["to"]["version"]),
          r["state"], f"{r['wave']}/{len(r['waves'])}",
          r["phase"] if r["state"] in ("running", "paused") else "-",
          (r.get("reason") or "-")[:60]] for r in doc]))


def _mover(move: str, doc: str) -> Any:
    @rollout.command(move, help=doc)
    @click.argument("rollout_id", type=int)
    @_client_options
    def command(rollout_id: int, url: str, as_json: bool, token_file: str | None) -> None:
        found = _call(url, token_file, "POST", f"/v1/rollouts/{rollout_id}/{move}")
        click.echo(json.dumps(found, indent=2) if as_json
                   else "\n".join(_rollout_lines(found)))
    return command


_mover("pause", "Pause ROLLOUT_ID: no wave starts, no gate is judged until resumed.")
_mover("resume", "Resume ROLLOUT_ID: its current wave switches and bakes again from now.")
_mover("abort", "Abort ROLLOUT_ID: every node goes back to the old version (not marked "
                "bad).")


@rollout.command("clear")
@click.argument("model")
@click.argument("version", type=int)
@_client_options
def rollout_clear(model: str, version: int, url: str, as_json: bool,
                  token_file: str | None) -> None:
    """Clear MODEL's VERSION marked bad by a rollback: offered to the nodes again."""
    doc = _call(url, token_file, "DELETE", f"/v1/models/{model}/bad-versions/{version}")
    click.echo(json.dumps(doc) if as_json else f"{model} version {version}: cleared")
