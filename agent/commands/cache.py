"""``edgeagent cache ls|inspect|evict|pin|unpin|workers|trace``: the cache admin API
from a shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from agent.commands.agentapi import (agent_context, agent_options, apply_common, call,
                                     common_options)
from agent.commands.output import key_values, number, show_json
from agent.commands.output import table as output_table
from agent.units import format_size


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


def _size(m: dict[str, Any]) -> str:
    """Its measured size (``~``: still the estimate); ``-`` until it was measured."""
    if not m.get("size_bytes") or m["state"] != "ready" and m.get("size_estimated"):
        return "-"
    return format_size(m["size_bytes"]) + ("~" if m.get("size_estimated") else "")


#: The ``cache ls`` columns, and those left out first where the terminal is narrow.
HEAD = ["NAME", "VER", "STATE", "SIZE", "LOAD_S", "HITS", "MISSES", "EVICT", "RATE/S",
        "UTILITY", "PINNED", "INFLIGHT", "BATCH", "QUEUE", "WAIT", "P99_MS", "DISK", "DL_S",
        "ROUTE", "FWD/ERR/FB/RCV"]
DROP_ORDER = ["FWD/ERR/FB/RCV", "UTILITY", "DL_S", "WAIT", "BATCH", "INFLIGHT", "QUEUE", "PINNED", "RATE/S",
              "P99_MS", "DISK", "EVICT", "LOAD_S"]


def table(models: list[dict[str, Any]], *, wide: bool = False,
          width: int | None = None) -> str:
    """The readable ``cache ls`` table (``agent.commands.output.table``: it fits the
    terminal unless ``wide``), then why each model that cannot serve cannot."""
    rows = [[m["name"], number(m.get("version"), "d"), _state(m), _size(m),
             number(m.get("load_seconds") if m.get("loads") else None, ".3f"),
             str(m.get("hits", 0)), str(m.get("misses", 0)), str(m.get("evictions", 0)),
             number(m.get("request_rate")), number(m.get("utility")),
             "yes" if m.get("pinned") else "no", str(m.get("in_flight", 0)),
             number(m.get("batch_limit"), "d"), number(m.get("queue_length"), "d"),
             _wait(m), number((m.get("latency_ms") or {}).get("p99"), ".1f"), _disk(m),
             number(m.get("download_seconds") or None, ".3f"), *_routing(m)]
            for m in models]
    text = output_table(HEAD, rows, drop_order=DROP_ORDER, wide=wide, width=width)
    why = [f"  {m['name']}: {m['error']}" for m in models
           if m.get("error") and m["state"] in ("invalid", "failed", "pending")]
    return text + ("\n\nnot serving:\n" + "\n".join(why) + "\n" if why else "")


def _routing(m: dict[str, Any]) -> list[str]:
    """ROUTE (the nodes the routing table runs the model on, by replicas; ``-``: none,
    served where it lands) and its routed counts."""
    r = m.get("routing") or {}
    planned = r.get("planned") or {}
    route = ",".join(f"{n}:{k}" for n, k in sorted(planned.items())) or "-"
    counts = [r.get(k, 0) for k in ("forwarded", "errors", "fallbacks", "received")]
    return [route, "/".join(map(str, counts)) if any(counts) else "-"]


def routing_lines(models: list[dict[str, Any]]) -> list[str]:
    """Per model and peer, under the ``cache ls`` table: requests forwarded, errors,
    the hop's p50, and why requests planned elsewhere were served here."""
    lines = []
    for m in models:
        r = m.get("routing") or {}
        for peer, p in (r.get("peers") or {}).items():
            hop = (p.get("hop_ms") or {}).get("p50")
            lines.append(f"routing: {m['name']} -> {peer}: {p['forwarded']} forwarded, "
                         f"{p['errors']} errors, hop p50 "
                         f"{'-' if hop is None else f'{hop:.3f}'} ms")
        if r.get("fallback_reasons"):
            why = ", ".join(f"{k} {v}" for k, v in r["fallback_reasons"].items())
            lines.append(f"routing: {m['name']} served here though planned elsewhere: {why}")
    return lines


def _show(ctx: click.Context, doc: Any) -> None:
    if ctx.obj["json"]:
        show_json(doc)
    elif isinstance(doc, list):
        click.echo(table(doc, wide=ctx.obj.get("wide", False)))
    else:
        click.echo(key_values(doc))


@click.group()
@agent_options
@click.pass_context
def cache(ctx: click.Context, url: str, as_json: bool, token_file: str | None) -> None:
    """Inspect and steer a running agent's model cache."""
    ctx.obj = agent_context(url, as_json, token_file)


@cache.command("ls")
@click.option("--wide", is_flag=True, help="Every column, however wide the terminal.")
@common_options
@click.pass_context
def ls(ctx: click.Context, wide: bool, sub_url: str | None, sub_json: bool) -> None:
    """All models: state, size, load time, hits/misses, rate, utility, pinned, files on
    disk and download seconds, the nodes the routing table runs it on and its routed
    counts (the columns that fit the terminal; --wide: all), and why a model cannot
    serve; then per model and peer what was forwarded, the disk tier's budget, pulls and
    evictions, the coordinator's (when the agent reports to one: its last report, how
    old the directives the agent follows are), and the selection apps served over the
    models."""
    apply_common(ctx, sub_url, sub_json)
    ctx.obj["wide"] = wide
    models = call(ctx, "GET", "/v1/cache")
    _show(ctx, models)
    if not ctx.obj["json"]:
        for line in routing_lines(models):
            click.echo(line)
        click.echo(disk_line(call(ctx, "GET", "/v1/disk")))
        link = call(ctx, "GET", "/v1/coordinator")
        if link.get("configured"):
            click.echo(coordinator_line(link))
        try:
            apps = call(ctx, "GET", "/v1/selection")
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
@common_options
@click.pass_context
def inspect(ctx: click.Context, name: str, sub_url: str | None, sub_json: bool) -> None:
    """One model in detail."""
    apply_common(ctx, sub_url, sub_json)
    _show(ctx, call(ctx, "GET", f"/v1/cache/{name}"))


def _action(action: str, doc: str):
    @click.argument("name")
    @common_options
    @click.pass_context
    def command(ctx: click.Context, name: str, sub_url: str | None, sub_json: bool) -> None:
        apply_common(ctx, sub_url, sub_json)
        _show(ctx, call(ctx, "POST", f"/v1/cache/{name}/{action}"))
    command.__doc__ = doc
    return cache.command(action)(command)


@cache.command()
@click.argument("name")
@click.argument("count", type=click.IntRange(1, 256))
@common_options
@click.pass_context
def workers(ctx: click.Context, name: str, count: int, sub_url: str | None,
            sub_json: bool) -> None:
    """Run a model's batches on COUNT workers (replicas), now and after reloads."""
    apply_common(ctx, sub_url, sub_json)
    _show(ctx, call(ctx, "POST", f"/v1/cache/{name}/workers", {"workers": count}))


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
@common_options
@click.pass_context
def trace(ctx: click.Context, out_dir: Path, since: float | None, sub_url: str | None,
          sub_json: bool) -> None:
    """Save the agent's recorded requests and model profiles (for simulate --from DIR)."""
    apply_common(ctx, sub_url, sub_json)
    trace_text, profiles_text = fetch_record(ctx.obj["url"], ctx.obj["token"], since)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRACE_FILE).write_text(trace_text)
    (out_dir / PROFILES_FILE).write_text(profiles_text)
    requests = max(trace_text.count("\n") - 1, 0)
    models = max(profiles_text.count("\n") - 1, 0)
    click.echo(f"{requests} requests, {models} model profiles -> {out_dir}")
