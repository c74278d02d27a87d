"""The `edgeagent` subcommands, one module per command group."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Callable

import click


def self_command() -> str:
    """How to run this CLI again from the same shell: ``edgeagent`` when that is on PATH,
    else the path of the script that ran (``.venv/bin/edgeagent`` from the checkout)."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) != "edgeagent":
        return "edgeagent"
    found = shutil.which("edgeagent")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "edgeagent"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else script


def declared_option(cls: type, name: str, **overrides: Any) -> Callable:
    """``--name`` as a click option for the configuration key ``name`` of ``cls`` (a
    declaration, ``agent.schema``): its help, default and type come from the key (a
    number's range, a choice, a size or device through the key's checker); ``overrides``
    add to click's arguments (a path's ``type`` with ``exists``). The option's value is
    None when not given: it overrides the file only then."""
    import msgspec.inspect as mi

    from agent.schema import settings

    key = settings(cls)[name]
    help = key.help[:1].upper() + key.help[1:]
    kwargs: dict[str, Any] = {"help": f"{help} [default: {key.shown_default}]"
                              if key.shown_default else help}
    kind = key.value_type
    if hasattr(key.check, "options"):  # agent.validation.choice
        kwargs["type"] = click.Choice(key.check.options)
    elif key.check is not None:
        def convert(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            try:
                return None if value is None else key.check(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        kwargs["callback"] = convert
    elif isinstance(kind, (mi.IntType, mi.FloatType)):
        lo = kind.gt if kind.gt is not None else kind.ge
        hi = kind.lt if kind.lt is not None else kind.le
        kwargs["type"] = (click.IntRange if isinstance(kind, mi.IntType)
                          else click.FloatRange)(lo, hi, min_open=kind.gt is not None,
                                                 max_open=kind.lt is not None)
    return click.option(f"--{name.replace('_', '-')}", **{**kwargs, **overrides})


def tls_options(f: Callable) -> Callable:
    """``--ca-file``, ``--cert``, ``--key`` for a client command: how an https:// server
    is verified and which certificate this client shows (kept in the click context's
    ``meta``, where ``agent.commands.http.call_json`` finds them)."""
    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            ctx.meta[f"tls.{param.name}"] = value

    for flag, name, help in (
            ("--key", "key_file", "This client's private key (PEM), with --cert."),
            ("--cert", "cert_file", "This client's certificate (PEM) for a server that "
                                    "asks for one (client_auth)."),
            ("--ca-file", "ca_file", "CA certificates (PEM) an https:// server's "
                                     "certificate must chain to [default: the system's].")):
        f = click.option(flag, name, type=click.Path(exists=True, dir_okay=False),
                         default=None, expose_value=False, callback=keep, help=help)(f)
    return f
