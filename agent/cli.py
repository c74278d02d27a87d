"""The ``edgeagent`` command line. Each command group lives in ``agent.commands``."""

from __future__ import annotations

import click

from agent import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeagent")
def main() -> None:
    """Serve many ML models on a shared edge machine under a memory budget."""


# Command registration: one line per command module.
from agent.commands.workload import workload  # noqa: E402
main.add_command(workload)
from agent.commands.profile import profile  # noqa: E402
main.add_command(profile)
from agent.commands.serve import serve  # noqa: E402
main.add_command(serve)
from agent.commands.cache import cache  # noqa: E402
main.add_command(cache)
from agent.commands.plan import plan  # noqa: E402
main.add_command(plan)
from agent.commands.simulate import simulate_command  # noqa: E402
main.add_command(simulate_command)
from agent.commands.coordinator import coordinator  # noqa: E402
main.add_command(coordinator)
