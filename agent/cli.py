"""The ``edgeagent`` command line. Each command group lives in ``agent.commands``."""

from __future__ import annotations

import click

from agent import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeagent")
def main() -> None:
    """Serve many ML models on a shared edge machine under a memory budget."""


# Command registration: one line per command module.
