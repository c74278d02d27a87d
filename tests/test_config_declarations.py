"""Each configuration is declared once (agent/config/agentconfig.py and modelconfig.py,
agent/coordinator/config.py): the committed example files, the flags' help and the parser all come from the
declaration, and these tests hold them to it."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.commands.config import KINDS, example_text
from agent.config import (AgentConfig, ModelConfig, SloOptions, load_agent_config,
                          parse_agent_config)
from agent.coordinator.config import CoordinatorConfig
from agent.schema import _section_type, settings

ROOT = Path(__file__).resolve().parent.parent
DECLARATIONS = {"agent": AgentConfig, "model": ModelConfig, "coordinator": CoordinatorConfig}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_committed_example_is_the_declarations(kind):
    committed = (ROOT / "configs" / f"{kind}.yaml").read_text()
    assert committed == example_text(kind), \
        f"configs/{kind}.yaml is stale: .venv/bin/edgeagent config example {kind} " \
        f"-o configs/{kind}.yaml"


def _keys(cls: type, indent: str = "") -> list[tuple[str, str]]:
    """(indent, key) of every key ``cls`` declares, sections' keys after theirs."""
    out = []
    for s in settings(cls).values():
        out.append((indent, s.name))
        section = None if s.check else _section_type(s.type)
        if section is not None:
            out += _keys(section.cls, indent + "  ")
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_declared_key_is_in_the_example_in_order(kind):
    lines = iter(example_text(kind).splitlines())
    for indent, key in _keys(DECLARATIONS[kind]):
        pattern = re.compile(rf"{indent}(# )?{key}:( |$)")
        assert any(pattern.fullmatch(line) or pattern.match(line) for line in lines), \
            f"{kind}: {indent}{key} is not in the example (or out of order)"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_example_checks(kind, tmp_path):
    """The example checks ok where the folders it names exist (config check runs the
    server's start checks: the agent's repository, which the systemd unit makes on the
    box, must be there)."""
    example = tmp_path / f"{kind}.yaml"
    text = (ROOT / "configs" / f"{kind}.yaml").read_text()
    if kind == "agent":
        (tmp_path / "models").mkdir()
        assert "\nrepository: /var/lib/edgeagent/models\n" in text
        text = text.replace("\nrepository: /var/lib/edgeagent/models\n",
                            f"\nrepository: {tmp_path / 'models'}\n")
    example.write_text(text)
    result = CliRunner().invoke(main, ["config", "check", kind, str(example)])
    assert result.exit_code == 0 and result.output.endswith(": ok\n"), result.output


def test_check_names_the_file_and_the_key(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("slo: {latency_ms: fast}\n")
    result = CliRunner().invoke(main, ["config", "check", "agent", str(f)])
    assert result.exit_code == 1
    assert f"{f}: slo.latency_ms: must be a number > 0, got 'fast'" in result.output


def test_the_agent_example_is_what_the_units_deploy():
    cfg = load_agent_config(ROOT / "configs" / "agent.yaml")
    assert cfg.repository == Path("/var/lib/edgeagent/models") and cfg.cpu_budget == 2**31
    assert cfg.coordinator is None and cfg.tfserving == AgentConfig().tfserving


def test_an_agent_section_given_in_part_keeps_the_other_defaults():
    cfg = parse_agent_config({"slo": {"percentile": 95}, "batching": {"workers": 3}})
    assert cfg.slo == SloOptions(1000.0, 95)
    assert cfg.batching.workers == 3 and cfg.batching.max_batch_size == 32
    assert cfg.batching.enabled is True


@pytest.mark.parametrize("command, cls", [(["serve"], AgentConfig),
                                          (["coordinator", "serve"], CoordinatorConfig)])
def test_flags_take_help_and_type_from_the_declaration(command, cls):
    cmd = main
    for name in command:
        cmd = cmd.get_command(click.Context(cmd), name)
    declared = settings(cls)
    flags = [p for p in cmd.params if isinstance(p, click.Option) and p.name not in
             ("config_file", "help")]
    assert len(flags) >= 5
    for option in flags:
        key = declared[option.name]
        assert option.opts == [f"--{key.name.replace('_', '-')}"]
        assert option.help.lower().startswith(key.help.lower()), option.name
        if key.shown_default:
            assert option.help.endswith(f"[default: {key.shown_default}]")
        if hasattr(key.check, "options"):
            assert list(option.type.choices) == list(key.check.options)
        if isinstance(option.type, click.IntRange):
            kind = key.value_type
            assert (option.type.min, option.type.max) == (kind.ge, kind.le), option.name
    text = CliRunner().invoke(main, [*command, "--help"], terminal_width=200).output
    for option in flags:
        assert " ".join(option.help.split()[:4]) in " ".join(text.split()), option.name


def test_a_flag_checks_its_value_with_the_declared_checker():
    result = CliRunner().invoke(main, ["serve", "--cpu-budget", "lots"])
    assert result.exit_code == 2 and "bad size 'lots'" in result.output
    result = CliRunner().invoke(main, ["coordinator", "serve", "--report-workers", "65"])
    assert result.exit_code == 2 and "65" in result.output
