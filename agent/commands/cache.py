"""``edgeagent cache ls|inspect|evict|pin|unpin|workers|trace``: the cache admin API
from a shell."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from agent import credentials
from agent.commands import tls_options
from agent.units import format_size


def _call(ctx: click.Context, method: str, path: str, body: Any = None) -> Any:
    from agent.commands.http import call_json  # urllib: only when a command calls

    return call_json(ctx.obj["url"], method, path, body, token=ctx.obj["token"], server="agent")


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _wait(m: dict[str, Any]) -> str:
    """Requests waiting for the model's load, and its loads' total wait for room."""
    waiting, seconds = m.get("waiting_requests") or 0, m.get("room_wait_seconds") or 0.0
    return "-" if not waiting and not seconds else f"{waiting}/{seconds:.1f}s"


def _state(m: dict[str, Any]) -> str:
    """The state, or ``downloading N%`` while its files are pulled."""
    download = m.get("download") or {}
    if m.get("phase") != "downloading":
        return m["state"]
    total = download.get("total_bytes")
    return f"downloading {100 * download['bytes'] // total}%" if total else "downloading"


def _disk(m: dict[str, Any]) -> str:
    """A sourced model's files on disk (``-``: not sourced; ``no``: not on disk)."""
    if "on_disk" not in m:
        return "-"
    return format_size(m["disk_bytes"]) if m["on_disk"] else "no"


def table(models: list[dict[str, Any]]) -> str:
    """The readable ``cache ls`` table."""
    head = ["NAME", "VER", "STATE", "SIZE", "LOAD_S", "HITS", "MISSES", "EVICT", "RATE/S",
            "UTILITY", "PINNED", "INFLIGHT", "BATCH", "QUEUE", "WAIT", "P99_MS", "DISK",
            "DL_S"]
    rows = [[m["name"], str(m["version"]), _state(m),
             format_size(m["size_bytes"]) + ("~" if m["size_estimated"] and m["size_bytes"]
                                             else ""),
             _num(m["load_seconds"], ".3f"), str(m["hits"]), str(m["misses"]),
             str(m["evictions"]), _num(m["request_rate"], ".3g"), _num(m["utility"], ".3g"),
             "yes" if m["pinned"] else "no", str(m["in_flight"]),
             _num(m.get("batch_limit"), "d"), _num(m.get("queue_length"), "d"),
             _wait(m), _num((m.get("latency_ms") or {}).get("p99"), ".1f"), _disk(m),
             _num(m.get("download_seconds"), ".3f")] for m in models]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head] + rows)


def _show(ctx: click.Context, doc: Any) -> None:
    if ctx.obj["json"]:
        click.echo(json.dumps(doc, indent=2))
    elif isinstance(doc, list):
        click.echo(table(doc))
    else:
        width = max(map(len, doc))
        for k, v in doc.items():
            click.echo(f"{k.ljust(width)}  {json.dumps(v) if isinstance(v, (dict, list)) else v}")


def agent_options(f):
    """``--url``, ``--json``, ``--token-file`` and the TLS options of a command group that
    calls a running agent's admin API (``agent_context`` keeps them)."""
    f = tls_options(f)
    f = click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
                     help="Admin bearer token file (or $EDGEAGENT_TOKEN).")(f)
    f = click.option("--json", "as_json", is_flag=True,
                     help="Print JSON instead of a table.")(f)
    return click.option(
        "--url", default=lambda: os.environ.get("EDGEAGENT_URL", "http://127.0.0.1:8000"),
        show_default="$EDGEAGENT_URL or http://127.0.0.1:8000", help="The agent's URL.")(f)


def agent_context(url: str, as_json: bool, token_file: str | None) -> dict[str, Any]:
    return {"url": url, "json": as_json, "token": read_token(token_file)}


@click.group()
@agent_options
@click.pass_context
def cache(ctx: click.Context, url: str, as_json: bool, token_file: str | None) -> None:
    """Inspect and steer a running agent's model cache."""
    ctx.obj = agent_context(url, as_json, token_file)


def read_token(token_file: str | None) -> str | None:
    """The token a command sends: its ``--token-file`` (``agent.credentials.read_token``:
    an empty file is a usage error), else $EDGEAGENT_TOKEN."""
    if not token_file:
        return os.environ.get("EDGEAGENT_TOKEN")
    try:
        return credentials.read_token(token_file)
    except credentials.CredentialError as err:
        raise click.BadParameter(str(err), param_hint="--token-file") from None


def _common(f):
    """Let --url/--json/--token-file also follow the subcommand (``cache ls --json``)."""
    f = click.option("--url", "sub_url", default=None, help="The agent's URL.")(f)
    f = click.option("--token-file", "sub_token_file",
                     type=click.Path(exists=True, dir_okay=False), default=None,
                     expose_value=False, callback=_sub_token,
                     help="Admin bearer token file (or $EDGEAGENT_TOKEN).")(f)
    return click.option("--json", "sub_json", is_flag=True, help="Print JSON.")(f)


def _sub_token(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.ensure_object(dict)["token"] = read_token(value)


def _apply(ctx: click.Context, sub_url: str | None, sub_json: bool) -> None:
    if sub_url:
        ctx.obj["url"] = sub_url
    ctx.obj["json"] = ctx.obj["json"] or sub_json


@cache.command("ls")
@_common
@click.pass_context
def ls(ctx: click.Context, sub_url: str | None, sub_json: bool) -> None:
    """All models: state, size, load time, hits/misses, rate, utility, pinned, files on
    disk and download seconds; then the disk tier's budget, pulls and evictions, the
    coordinator's (when the agent reports to one: its last report, how old the
    directives the agent follows are), and the selection apps served over the models."""
    _apply(ctx, sub_url, sub_json)
    _show(ctx, _call(ctx, "GET", "/v1/cache"))
    if not ctx.obj["json"]:
        click.echo(disk_line(_call(ctx, "GET", "/v1/disk")))
        link = _call(ctx, "GET", "/v1/coordinator")
        if link.get("configured"):
            click.echo(coordinator_line(link))
        try:
            apps = _call(ctx, "GET", "/v1/selection")
        except click.ClickException:  # an agent without apps' routes, or no admin token
            return
        if apps:
            from agent.commands.selection import apps_table

            click.echo("\n" + apps_table(apps))


def disk_line(disk: dict[str, Any]) -> str:
    """The disk tier in one line, under the ``cache ls`` table."""
    pulling = ", ".join(f"{p['model']}:{p['version']} {format_size(p['bytes'])}/"
                        f"{format_size(p['total_bytes'])}" for p in disk["pulling"])
    return (f"disk tier: {format_size(disk['used_bytes'])} of "
            f"{format_size(disk['budget_bytes'])} in {disk['versions']} version(s); "
            f"pulls {disk['pulls']} ({format_size(disk['pulled_bytes'])}), failed "
            f"{disk['pull_failures']}, evictions {disk['evictions']}"
            + (f"; pulling {pulling}" if pulling else ""))


def coordinator_line(link: dict[str, Any]) -> str:
    """The agent's coordinator in one line, under the ``cache ls`` table: its last
    report, failures and next try, and the age of the directives followed."""
    def ago(seconds: float | None) -> str:
        return "never" if seconds is None else f"{seconds:.1f} s ago"

    text = f"coordinator {link['url']}: last report {ago(link['last_report_s_ago'])}"
    if link["failures"]:
        text += (f"; {link['failures']} failed in a row ({link['last_error']}), next try "
                 f"in {link['next_report_in_s']:.1f} s")
    directives = link["directives"]
    if directives is None:
        return text + "; no directives in force"
    plan = directives.get("plan_id")
    return text + (f"; directives {link['directives_age_s']:.1f} s old "
                   f"({'no plan' if plan is None else f'plan {plan}'}), lapse in "
                   f"{link['directives_expire_in_s']:.1f} s")


@cache.command()
@click.argument("name")
@_common
@click.pass_context
def inspect(ctx: click.Context, name: str, sub_url: str | None, sub_json: bool) -> None:
    """One model in detail."""
    _apply(ctx, sub_url, sub_json)
    _show(ctx, _call(ctx, "GET", f"/v1/cache/{name}"))


def _action(action: str, doc: str):
    @click.argument("name")
    @_common
    @click.pass_context
    def command(ctx: click.Context, name: str, sub_url: str | None, sub_json: bool) -> None:
        _apply(ctx, sub_url, sub_json)
        _show(ctx, _call(ctx, "POST", f"/v1/cache/{name}/{action}"))
    command.__doc__ = doc
    return cache.command(action)(command)


@cache.command()
@click.argument("name")
@click.argument("count", type=click.IntRange(1, 256))
@_common
@click.pass_context
def workers(ctx: click.Context, name: str, count: int, sub_url: str | None,
            sub_json: bool) -> None:
    """Run a model's batches on COUNT workers (replicas), now and after reloads."""
    _apply(ctx, sub_url, sub_json)
    _show(ctx, _call(ctx, "POST", f"/v1/cache/{name}/workers", {"workers": count}))


_action("evict", "Unload a model now (409 while it is in use or pinned).")
_action("pin", "Never evict this model.")
_action("unpin", "Let the policy evict this model again.")


#: The files ``cache trace`` writes and ``simulate --from DIR`` reads.
TRACE_FILE, PROFILES_FILE = "trace.csv", "profiles.csv"


def fetch_record(url: str, token: str | None, since: float | None = None
                 ) -> tuple[str, str]:
    """The agent's recorded trace and model profiles, as CSV texts."""
    from agent.commands.http import call_json

    query = "" if since is None else f"?since={since!r}"
    texts = [call_json(url, "GET", path, token=token, server="agent", decode=bytes.decode)
             for path in (f"/v1/trace{query}", "/v1/profiles")]
    return texts[0], texts[1]


@cache.command("trace")
@click.option("--out", "out_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help=f"Directory to write {TRACE_FILE} and {PROFILES_FILE} into.")
@click.option("--since", type=float,
              help="Unix seconds: only the requests since then [default: all it keeps].")
@_common
@click.pass_context
def trace(ctx: click.Context, out_dir: Path, since: float | None, sub_url: str | None,
          sub_json: bool) -> None:
    """Save the agent's recorded requests and model profiles (for simulate --from DIR)."""
    _apply(ctx, sub_url, sub_json)
    trace_text, profiles_text = fetch_record(ctx.obj["url"], ctx.obj["token"], since)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRACE_FILE).write_text(trace_text)
    (out_dir / PROFILES_FILE).write_text(profiles_text)
    requests = max(trace_text.count("\n") - 1, 0)
    models = max(profiles_text.count("\n") - 1, 0)
    click.echo(f"{requests} requests, {models} model profiles -> {out_dir}")
