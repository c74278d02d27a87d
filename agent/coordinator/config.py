"""Coordinator settings: a YAML file (``configs/coordinator.yaml``) checked against a
schema, or the embedded defaults when no file is given.

Errors name the file and key, as for the agent's config (``ConfigError``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.coordinator.faro.latency import ESTIMATORS
from agent.coordinator.faro.objectives import OBJECTIVES
from agent.coordinator.nodetypes import NodeType, node_types_option
from agent.validation import ConfigError, check_config, choice, load_yaml, number, string


def default_state_dir() -> Path:
    """``$EDGEAGENT_COORDINATOR_DIR``, systemd's ``$STATE_DIRECTORY``, or
    ~/.local/share/edgeagent-coordinator."""
    for var in ("EDGEAGENT_COORDINATOR_DIR", "STATE_DIRECTORY"):
        if os.environ.get(var):
            return Path(os.environ[var].split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "edgeagent-coordinator"


_SCHEMA = {
    "host": string,
    "port": number(0, 65535, integer=True),
    "state_dir": string,
    "admin_token_file": string,
    "plan_interval_s": number(0, strict_lo=True),
    "plan_window_s": number(0, strict_lo=True),
    "rate_step_s": number(0, strict_lo=True),
    "history_s": number(0, strict_lo=True),
    "reactive_interval_s": number(0, strict_lo=True),
    "reactive_patience": number(1, integer=True),
    "objective": choice(*OBJECTIVES),
    "estimator": choice(*ESTIMATORS),
    "rate_quantile": number(0, 1),
    "directive_ttl_s": number(0, strict_lo=True),
    "node_timeout_s": number(0, strict_lo=True),
    "log_level": choice("debug", "info", "warning", "error"),
    "node_types": node_types_option,
    "read_timeout_s": number(0, strict_lo=True),
    "store": string,
    "report_workers": number(0, 64, integer=True),
}


@dataclass(frozen=True)
class CoordinatorConfig:
    """The coordinator's settings; the defaults are Faro's (5-min plans over a 7-min
    window at the 0.9 quantile, a 10 s reactive loop that acts after 3 violations)."""

    host: str = "127.0.0.1"
    port: int = 8100
    state_dir: Path = field(default_factory=default_state_dir)
    admin_token_file: Path | None = None
    plan_interval_s: float = 300.0
    plan_window_s: float = 420.0
    rate_step_s: float = 10.0  # one point of the arrival-rate series the forecast sees
    history_s: float = 900.0  # rate history kept and fed to the forecast (Faro: 15 min)
    reactive_interval_s: float = 10.0
    reactive_patience: int = 3
    objective: str = "fairsum"
    estimator: str = "mdc"
    rate_quantile: float = 0.9
    directive_ttl_s: float = 60.0  # agents revert directives not renewed within this
    node_timeout_s: float = 60.0  # a node silent this long is left out of plans
    log_level: str = "info"
    # the instance catalogue for sizing and provisioning: kind -> price, max count, ...
    node_types: dict[str, NodeType] = field(default_factory=dict)
    read_timeout_s: float = 30.0  # a request's headers, then its body, must arrive within
    # postgresql://user@host:port/db: several coordinators share it; None: the SQLite file
    store: str | None = None
    # processes beside this one that answer node reports on the same port (reportworkers)
    report_workers: int = 0

    @property
    def database(self) -> Path:
        return self.state_dir / "coordinator.sqlite3"

    def with_overrides(self, **changes: Any) -> "CoordinatorConfig":
        """A copy with the non-None ``changes`` applied (command-line flags)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def parse_coordinator_config(data: Any, file: str | Path | None = None) -> CoordinatorConfig:
    """A ``CoordinatorConfig`` from a parsed YAML mapping; relative paths are from
    ``file``'s directory."""
    d = check_config(data, _SCHEMA, file)
    base = Path(file).parent if file else Path.cwd()
    for key in ("state_dir", "admin_token_file"):
        if key in d:
            d[key] = (base / Path(d[key]).expanduser()).resolve()
    if "store" in d and not d["store"].startswith(("postgresql://", "postgres://")):
        raise ConfigError(file, "store", "must be a postgresql:// URL (leave it out for "
                          "the SQLite file in state_dir)")
    if d.get("plan_window_s", 0) and d.get("rate_step_s", 10.0) > d["plan_window_s"]:
        raise ConfigError(file, "rate_step_s", "must not exceed plan_window_s")
    assert set(d) <= {f.name for f in fields(CoordinatorConfig)}
    return CoordinatorConfig(**d)


def load_coordinator_config(path: str | Path | None) -> CoordinatorConfig:
    """The file's settings, or the embedded defaults for None."""
    if path is None:
        return CoordinatorConfig()
    path = Path(path)
    return parse_coordinator_config(load_yaml(path), path)
