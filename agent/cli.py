"""The ``edgeagent`` command line. Each command group lives in ``agent.commands``.

Commands are imported lazily (click's lazy group): ``edgeagent --help`` imports no
command module, and ``edgeagent CMD ...`` imports only CMD's, whose heavy imports
(scipy, pyarrow, numba kernels, onnxruntime, aiohttp) in turn wait for the code that
runs. ``bench/cli_startup.py`` measures it; ``tests/test_cli_lazy.py`` keeps it so.
"""

from __future__ import annotations

import importlib
import os
import sys

import click
import click.formatting

from agent import __version__

# name -> ("module:attribute", the short help that ``edgeagent --help`` shows without
# importing the module; tests/test_cli_lazy.py checks it against the command's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "cache": ("agent.commands.cache:cache",
              "Inspect and steer a running agent's model cache."),
    "config": ("agent.commands.config:config",
               "Show each configuration file's keys, or check a file."),
    "coordinator": ("agent.commands.coordinator:coordinator",
                    "Run the fleet coordinator (Faro planning) or talk to one."),
    "model": ("agent.commands.model:model",
              "Put model versions where agents pull them from, and list what a source holds."),
    "plan": ("agent.commands.plan:plan",
             "Plan replicas per model under latency SLOs and cluster limits (Faro)."),
    "profile": ("agent.commands.profile:profile",
                "Measure model profiles (memory, load and execution time)."),
    "selection": ("agent.commands.selection:selection",
                  "Inspect and reset a running agent's selection apps."),
    "serve": ("agent.commands.serve:serve",
              "Run the node agent (OIP v2 REST and gRPC + TF Serving REST + cache admin + "
              "/metrics)."),
    "simulate": ("agent.commands.simulate:simulate_command",
                 "Simulate model-level caching: load delay per policy and capacity."),
    "token": ("agent.commands.token:token",
              "Make bearer tokens: scoped tokens for token files, join tokens for new nodes."),
    "workload": ("agent.commands.workload:workload",
                 "Make request traces and model profiles (the Azure Functions trace method)."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported the first time they are looked up."""

    def __init__(self, *args, lazy_commands: dict[str, tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra) -> click.Context:
        """The context, with the help's width measured here: click measures it with
        ``shutil``, whose import (bz2, lzma) is a good part of ``--help``'s own time."""
        if parent is None and "terminal_width" not in extra \
                and click.formatting.FORCED_WIDTH is None:
            extra["terminal_width"] = help_width()
        return super().make_context(info_name, args, parent, **extra)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, _, attribute = self.lazy_commands[cmd_name][0].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module}:{attribute} is not a click command")
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands table from the registered short help: no command is imported."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))  # as click.Group does
        rows = [(name, self.commands[name].get_short_help_str(limit) if name in self.commands
                 else click.Command(name, help=self.lazy_commands[name][1])
                 .get_short_help_str(limit))
                for name in names]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def help_width(max_width: int = 80) -> int:
    """click's help width (``HelpFormatter``): the terminal's columns ($COLUMNS, else
    stdout's terminal, else 80) up to ``max_width``, less 2, at least 50."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(min(columns or 80, max_width) - 2, 50)


@click.group(cls=LazyGroup, lazy_commands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeagent")
def main() -> None:
    """Serve many ML models on a shared edge machine under a memory budget."""
