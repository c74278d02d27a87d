"""Config: the agent's ``coordinator:`` section and the coordinator's own file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, CoordinatorLink, load_agent_config
from agent.coordinator.config import CoordinatorConfig, load_coordinator_config

ROOT = Path(__file__).resolve().parent.parent


def test_agent_coordinator_section(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("coordinator:\n  url: http://10.0.0.5:8100\n  report_interval_s: 2.5\n"
                 "  token_file: secrets/token\n  node_name: edge-1\n  cores: 3\n")
    cfg = load_agent_config(f)
    assert cfg.coordinator == CoordinatorLink(
        url="http://10.0.0.5:8100", report_interval_s=2.5,
        token_file=(tmp_path / "secrets" / "token").resolve(), node_name="edge-1", cores=3)
    f.write_text("port: 9000\n")
    assert load_agent_config(f).coordinator is None


@pytest.mark.parametrize("text, key, words", [
    ("coordinator: {report_interval_s: 5}\n", "coordinator.url", "required"),
    ("coordinator:\n", "coordinator.url", "required"),
    ("coordinator: {url: 10.0.0.5}\n", "coordinator.url", "http:// or https://"),
    ("coordinator: {url: 'http://x', report_interval_s: 0}\n",
     "coordinator.report_interval_s", "> 0"),
    ("coordinator: {url: 'http://x', every: 5}\n", "coordinator.every", "unknown key"),
    ("coordinator: http://x\n", "coordinator", "must be a mapping"),
])
def test_agent_coordinator_section_errors(tmp_path, text, key, words):
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent_config(f)
    assert str(f) in str(err.value) and f": {key}: " in str(err.value)
    assert words in str(err.value)


def test_coordinator_defaults_are_faros():
    cfg = load_coordinator_config(None)
    assert cfg == CoordinatorConfig(state_dir=cfg.state_dir)
    assert (cfg.plan_interval_s, cfg.plan_window_s, cfg.reactive_interval_s,
            cfg.reactive_patience, cfg.rate_quantile) == (300, 420, 10, 3, 0.9)
    assert cfg.database.name == "coordinator.sqlite3"


def test_coordinator_config_file(tmp_path):
    f = tmp_path / "coordinator.yaml"
    f.write_text("port: 9100\nstate_dir: state\nobjective: penaltysum\nrate_quantile: 0.95\n"
                 "admin_token_file: token\n")
    cfg = load_coordinator_config(f)
    assert cfg.port == 9100 and cfg.objective == "penaltysum" and cfg.rate_quantile == 0.95
    assert cfg.state_dir == (tmp_path / "state").resolve()
    assert cfg.admin_token_file == (tmp_path / "token").resolve()
    assert cfg.with_overrides(port=1, host=None).port == 1


def test_the_example_config_parses():
    cfg = load_coordinator_config(ROOT / "configs" / "coordinator.yaml")
    assert cfg.plan_interval_s == 300 and cfg.objective == "fairsum"


@pytest.mark.parametrize("text, key, words", [
    ("colour: red\n", "colour", "unknown key"),
    ("objective: best\n", "objective", "one of sum, fair, fairsum"),
    ("estimator: guess\n", "estimator", "one of mdc, upper"),
    ("rate_quantile: 2\n", "rate_quantile", "<= 1"),
    ("reactive_patience: 0\n", "reactive_patience", ">= 1"),
    ("plan_window_s: 5\nrate_step_s: 10\n", "rate_step_s", "must not exceed"),
])
def test_coordinator_config_errors(tmp_path, text, key, words):
    f = tmp_path / "coordinator.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(f)
    assert f"{f}: {key}: " in str(err.value) and words in str(err.value)
