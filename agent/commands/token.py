"""``edgeagent token new`` (a fresh token and its token-file entry) and ``edgeagent token
join`` (a one-time join token for a new node, made by the coordinator)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from agent.commands.coordinator import _call, _client_options

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``1h`` or ``2d``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 30m, 1h or 2d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@click.group("token")
def token() -> None:
    """Make bearer tokens: scoped tokens for token files, join tokens for new nodes."""


@token.command("new")
@click.option("--scope", "scopes", multiple=True, required=True,
              type=click.Choice(["admin", "read", "infer", "report", "peer"]),
              help="What the token may do (repeat for several).")
@click.option("--name", help="The entry's name (default: the scopes, or the node).")
@click.option("--node", help="The node a report token belongs to (it may write only "
                             "that node's report).")
@click.option("--not-after", help="Expiry, ISO 8601 (2027-01-31T00:00:00Z).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the token to this file (mode 0600, its folder made) instead of "
                   "printing it: a server's admin_token_file, a systemd credential. A file "
                   "already there is kept.")
def new(scopes: tuple[str, ...], name: str | None, node: str | None,
        not_after: str | None, out: Path | None) -> None:
    """Print a fresh random token (once: it is kept nowhere; --out: into a file) and the
    entry to add to a server's auth.token_file, which holds only its SHA-256."""
    import yaml

    from agent.security.credentials import (CredentialError, new_token, parse_entry, token_hash,
                                   write_secret)

    if out is not None and out.exists():
        click.echo(f"{out} exists: kept (remove it for a new token)")
        return
    secret = new_token()
    entry = {"name": name or node or "-".join(scopes), "sha256": token_hash(secret),
             "scopes": list(scopes), **({"node": node} if node else {}),
             **({"not_after": not_after} if not_after else {})}
    try:
        entry = parse_entry(entry, "the new token").entry()
    except CredentialError as exc:
        raise click.ClickException(str(exc)) from None
    entry_text = yaml.safe_dump([entry], sort_keys=False).rstrip()
    if out is not None:
        write_secret(out, secret)
        click.echo(f"token written to {out} (mode 0600)\n\nits entry for auth.token_file, "
                   f"should a server take it from there:\n{entry_text}")
        return
    click.echo(f"token (give it to the client, in a file of mode 0600; shown once):\n"
               f"{secret}\n\nentry for auth.token_file (SIGHUP the server after adding "
               f"it):\n{entry_text}")


@token.command("join")
@click.option("--node", required=True, help="The new node's name.")
@click.option("--ttl", default="1h", show_default=True,
              help="How long the join token is valid (90s, 30m, 1h, 2d).")
@_client_options
def join(node: str, ttl: str, url: str, as_json: bool, token_file: str | None) -> None:
    """Have the coordinator make a one-time join token for NODE (admin token needed);
    the agent, given it as coordinator.join_token_file, trades it for its own
    credential on its first report."""
    import json

    doc = _call(url, token_file, "POST", "/v1/join-tokens",
                {"node": node, "ttl_s": parse_duration(ttl)})
    if as_json:
        click.echo(json.dumps(doc))
        return
    click.echo(f"join token for node {doc['node']} (one use, valid {ttl}):\n{doc['token']}\n"
               f"\nPut it in the agent's coordinator.join_token_file (mode 0600) and set "
               f"coordinator.credential_file and node_name: {doc['node']}.")
