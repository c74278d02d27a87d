"""``edgeagent selection ls|show|reset``: a running agent's selection apps (their
members' weights, feedback and misses) from a shell, through ``/v1/selection``."""

from __future__ import annotations

import json
from typing import Any

import click

from agent.commands.agentapi import (agent_context, agent_options, apply_common, call,
                                     columns, common_options)


def apps_table(apps: list[dict[str, Any]]) -> str:
    head = ["APP", "POLICY", "REQUESTS", "FEEDBACK", "UNMATCHED", "DEFAULTS", "LEADER"]
    rows = []
    for a in apps:
        lead = max(a["members"], key=lambda m: m["weight"]) if a["members"] else None
        rows.append([a["app"], a["policy"], str(a["requests"]),
                     str(a["feedback"]["accepted"]), str(a["feedback"]["unmatched"]),
                     str(a["default_answers"]),
                     f"{lead['member']} ({lead['weight']:.3f})" if lead else "-"])
    return columns(head, rows)


def members_table(app: dict[str, Any]) -> str:
    head = ["MEMBER", "WEIGHT", "OBSERVED", "SELECTED", "ANSWERED", "MISSING", "LOADS"]
    rows = [[m["member"], f"{m['weight']:.4f}", str(m["observed"]), str(m["selected"]),
             str(m["answered"]),
             ",".join(f"{k}:{v}" for k, v in m["missing"].items()) or "-",
             str(m["background_loads"])] for m in app["members"]]
    return columns(head, rows)


@click.group()
@agent_options
@click.pass_context
def selection(ctx: click.Context, url: str, as_json: bool, token_file: str | None) -> None:
    """Inspect and reset a running agent's selection apps."""
    ctx.obj = agent_context(url, as_json, token_file)


def _print(ctx: click.Context, doc: Any, table: Any) -> None:
    click.echo(json.dumps(doc, indent=2) if ctx.obj["json"] else table(doc))


@selection.command("ls")
@common_options
@click.pass_context
def ls(ctx: click.Context, sub_url: str | None, sub_json: bool) -> None:
    """Every app: policy, requests, feedback, default answers, leading member."""
    apply_common(ctx, sub_url, sub_json)
    _print(ctx, call(ctx, "GET", "/v1/selection"), apps_table)


@selection.command()
@click.argument("app")
@click.option("--context", help="A user's or session's state instead of the global one.")
@common_options
@click.pass_context
def show(ctx: click.Context, app: str, context: str | None, sub_url: str | None,
         sub_json: bool) -> None:
    """One app's members: weight, observations, selections, misses by reason."""
    from urllib.parse import quote

    apply_common(ctx, sub_url, sub_json)
    path = f"/v1/selection/{quote(app, safe='')}"
    if context is not None:
        path += f"/contexts/{quote(context, safe='')}"
    _print(ctx, call(ctx, "GET", path), members_table)


@selection.command()
@click.argument("app")
@common_options
@click.pass_context
def reset(ctx: click.Context, app: str, sub_url: str | None, sub_json: bool) -> None:
    """Forget what APP learned (its global state and every context)."""
    from urllib.parse import quote

    apply_common(ctx, sub_url, sub_json)
    _print(ctx, call(ctx, "POST", f"/v1/selection/{quote(app, safe='')}/reset"),
           members_table)
