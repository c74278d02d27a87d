"""The `edgeagent` subcommands, one module per command group."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Any, Callable

import click

#: Each extra of pyproject.toml -> the modules it brings that its commands import
#: (tests/test_extras.py holds them to pyproject's lists).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "sim": ("numba", "pyarrow", "tqdm", "setuptools", "matplotlib"),
    "coordinator": ("numba", "scipy", "sklearn", "threadpoolctl"),
}


#: Module -> its pip name, where they differ.
_PIP_NAMES = {"sklearn": "scikit-learn"}


def require_extra(extra: str) -> None:
    """Exit 1 with one line naming the command that adds ``extra`` to this interpreter
    (``agent.extras.install_hint``) when a module of it is not installed (the default
    install is the node agent alone)."""
    missing = [name for name in EXTRA_MODULES[extra] if not _installed(name)]
    if missing:
        from agent.extras import install_hint

        hint = install_hint(extra, tuple(_PIP_NAMES.get(m, m) for m in EXTRA_MODULES[extra]))
        click.echo(f"Error: this command needs the {extra} extra ({', '.join(missing)} "
                   f"not installed): {hint}", err=True)
        sys.exit(1)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken half-install
        return False


class _NeedsExtra:
    """A click command or group (``extra=`` in its decorator) that checks its extra before
    it parses its arguments, so ``--help`` too gives the one line, never a traceback."""

    def __init__(self, *args: Any, extra: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extra = extra

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        require_extra(self.extra)
        return super().parse_args(ctx, args)


class ExtraCommand(_NeedsExtra, click.Command):
    """``@click.command(cls=ExtraCommand, extra="sim")``."""


class ExtraGroup(_NeedsExtra, click.Group):
    """``@click.group(cls=ExtraGroup, extra="coordinator")``."""


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
