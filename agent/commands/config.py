"""``edgeagent config``: each configuration file's documented example, made from its
declaration, and a check of a file against it.

``configs/agent.yaml``, ``configs/model.yaml`` and ``configs/coordinator.yaml`` are
this command's output (tests/test_config_declarations.py keeps them equal).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

# kind -> (the declaration, the function that reads a file of it, the example's title,
# what its server checks before it starts: agent.config.preflight, or None)
KINDS = {
    "agent": ("agent.config:AgentConfig", "agent.config:load_agent_config",
              "configs/agent.yaml: the node agent's configuration, every key shown.",
              "agent.config.preflight:check_agent"),
    "model": ("agent.config:ModelConfig", "agent.config:load_model_config",
              "configs/model.yaml: a model's config.yaml, every key shown.", None),
    "coordinator": ("agent.coordinator.config:CoordinatorConfig",
                    "agent.coordinator.config:load_coordinator_config",
                    "configs/coordinator.yaml: the coordinator's configuration, every key "
                    "shown.", "agent.config.preflight:check_server"),
}


def _named(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def example_text(kind: str) -> str:
    """The example file of ``kind`` (a key of KINDS)."""
    from agent.schema import example_yaml

    declaration, _, title, _ = KINDS[kind]
    return example_yaml(_named(declaration), title)


@click.group("config")
def config() -> None:
    """Show each configuration file's keys, or check a file."""


@config.command("example")
@click.argument("kind", type=click.Choice(list(KINDS)))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write it to this file instead of printing it.")
def example(kind: str, output: Path | None) -> None:
    """Print KIND's example file: every key with its help, default or an example."""
    text = example_text(kind)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)


@config.command("check")
@click.argument("kind", type=click.Choice(list(KINDS)))
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check(kind: str, file: Path) -> None:
    """Check FILE as KIND's configuration: its first error, naming the key, or ok. What
    the server would refuse at start is refused here too (token, TLS and repository
    files, an exposed address without TLS and a token)."""
    from agent.validation import ConfigError

    _, load, _, preflight = KINDS[kind]
    try:
        config = _named(load)(file)
        if preflight is not None:
            _named(preflight)(config, file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{file}: ok")
