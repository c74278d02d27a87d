"""What the commands that call a running agent's API share (``edgeagent cache``,
``edgeagent selection``, ``simulate --from URL``): their options (``--url``, ``--json``,
``--token-file`` and TLS, on the group and again after a subcommand), the token they
send, the call itself, and text tables."""

from __future__ import annotations

import os
from typing import Any

import click

from agent.commands import tls_options
from agent.security import credentials


def call(ctx: click.Context, method: str, path: str, body: Any = None) -> Any:
    """``method path`` on the agent the command names; its JSON answer."""
    from agent.commands.http import call_json  # urllib: only when a command calls

    return call_json(ctx.obj["url"], method, path, body, token=ctx.obj["token"], server="agent")


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


def read_token(token_file: str | None) -> str | None:
    """The token a command sends: its ``--token-file``
    (``agent.security.credentials.read_token``: an empty file is a usage error), else
    $EDGEAGENT_TOKEN."""
    if not token_file:
        return os.environ.get("EDGEAGENT_TOKEN")
    try:
        return credentials.read_token(token_file)
    except credentials.CredentialError as err:
        raise click.BadParameter(str(err), param_hint="--token-file") from None


def common_options(f):
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


def apply_common(ctx: click.Context, sub_url: str | None, sub_json: bool) -> None:
    if sub_url:
        ctx.obj["url"] = sub_url
    ctx.obj["json"] = ctx.obj["json"] or sub_json


def columns(head: list[str], rows: list[list[str]]) -> str:
    """A text table: each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head] + rows)
