"""The coordinator's configuration (``coordinator serve --config FILE``), declared once.

Every key is a field of a frozen msgspec Struct whose annotation carries its type,
bounds and help (``agent.schema.setting``): the parser, the defaults (the embedded
configuration when no file is given), the example file (``configs/coordinator.yaml``:
``edgeagent config example coordinator``) and the help of ``coordinator serve``'s flags
come from it.
Errors name the file and key, as for the agent's config (``ConfigError``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from msgspec import field, structs

from agent.coordinator.choices import DEFAULT_RATE_QUANTILE, ESTIMATORS, OBJECTIVES
from agent.coordinator.nodetypes import NodeType, node_types_option
from agent.coordinator.rollout import RolloutSettings
from agent.security.authconfig import AuthSettings
from agent.schema import (AtLeastOne, LogLevel, MaxConnections, MaxConnectionsPerPeer,
                          NonNegative, Port, Positive, Section, Text, load, setting)
from agent.security.tls import TlsSettings
from agent.validation import ConfigError, choice, load_yaml, size, string


def default_state_dir() -> Path:
    """``$EDGEAGENT_COORDINATOR_DIR``, systemd's ``$STATE_DIRECTORY``, or
    ~/.local/share/edgeagent-coordinator."""
    for var in ("EDGEAGENT_COORDINATOR_DIR", "STATE_DIRECTORY"):
        if os.environ.get(var):
            return Path(os.environ[var].split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "edgeagent-coordinator"


def postgresql_url(v: Any) -> str:
    if not string(v).startswith(("postgresql://", "postgres://")):
        raise ValueError("must be a postgresql:// URL (leave it out for the SQLite file "
                         "in state_dir)")
    return v


class CoordinatorConfig(Section):
    """The coordinator's settings (edgeagent coordinator serve --config FILE). Every key
    is optional: without a file the coordinator runs on these defaults, Faro's (a plan
    every 5 minutes over a 7-minute window at the 0.9 quantile, a 10 s reactive loop that
    acts after 3 violations). Flags override the file. An unknown key is an error naming
    the file and the key. Relative paths are resolved from the file's directory."""

    host: Annotated[Text, setting(
        "address to listen on (0.0.0.0 for all interfaces: then tls and admin_token_file, "
        "or insecure)")] = "127.0.0.1"
    port: Annotated[Port, setting("HTTP port: node reports, the catalog, plans")] = 8100
    tls: Annotated[TlsSettings | None, setting(
        "TLS on the port, for the coordinator and its report workers (re-read on "
        "SIGHUP); left out: plain text")] = None
    insecure: Annotated[bool, setting(
        "listen on a non-loopback host without tls and admin_token_file")] = False
    state_dir: Annotated[Path, setting(
        "the SQLite (WAL) state: nodes, rate history, catalog, plans; left out: "
        "$EDGEAGENT_COORDINATOR_DIR, $STATE_DIRECTORY or "
        "~/.local/share/edgeagent-coordinator", example="/var/lib/edgeagent-coordinator",
        commented=True)] = field(default_factory=default_state_dir)
    allowed_hosts: Annotated[tuple[Text, ...], setting(
        "requests without a token or client certificate must name the coordinator in "
        "Host (and Origin): an IP address, localhost, host, this machine's name, or one "
        "of these (a DNS rebinding guard); others get 403",
        example=["coordinator.example.net"])] \
        = ()
    admin_token_file: Annotated[Path | None, setting(
        "file holding a bearer token with scope admin (every endpoint); with any token "
        "every endpoint but /v1/health needs one; agents had better report with a node "
        "token each (auth.token_file, or edgeagent token join)",
        example="/etc/edgeagent-coordinator/admin-token")] = None
    auth: Annotated[AuthSettings, setting(
        "scoped tokens: admin (everything), read (GET endpoints, the dashboard), report "
        "(a node's own report; give its node)")] = field(default_factory=AuthSettings)
    plan_interval_s: Annotated[Positive, setting(
        "Faro's long-term plan every this many seconds ...")] = 300.0
    plan_window_s: Annotated[Positive, setting(
        "... for the next this many (overlapping the next plan, covering cold starts)")] \
        = 420.0
    rate_step_s: Annotated[Positive, setting(
        "width of one point of the arrival-rate series the forecast sees")] = 10.0
    history_s: Annotated[Positive, setting(
        "rate history kept and forecast from (Faro: 15 minutes)")] = 900.0
    reactive_interval_s: Annotated[Positive, setting(
        "the short-term check: +1 replica after reactive_patience consecutive SLO "
        "violations; it never scales down")] = 10.0
    reactive_patience: Annotated[AtLeastOne, setting(
        "consecutive violations before the reactive loop acts")] = 3
    objective: Annotated[str, setting("what the plan maximises (Faro's objectives)",
                                      check=choice(*OBJECTIVES))] = "fairsum"
    estimator: Annotated[str, setting(
        "latency estimate: mdc (relaxed M/D/c) or upper (an upper bound)",
        check=choice(*ESTIMATORS))] = "mdc"
    rate_quantile: Annotated[float, setting(
        "plan for this quantile of the forecast window, not its mean", ge=0, le=1)] \
        = DEFAULT_RATE_QUANTILE
    directive_ttl_s: Annotated[Positive, setting(
        "agents revert directives (pins) not renewed within this")] = 60.0
    node_timeout_s: Annotated[Positive, setting(
        "a node silent this long is left out of plans")] = 60.0
    lease_write_s: Annotated[NonNegative, setting(
        "a lease writes the node's last_seen to the store only once the stored one is "
        "this much older (the coordinator's memory keeps the exact time; full reports "
        "and a stop write it; the planner takes a leasing node as heard from up to this "
        "much later, never past now); 0: every lease; at most a quarter of "
        "node_timeout_s is used")] = 15.0
    max_nodes: Annotated[AtLeastOne, setting(
        "nodes the coordinator keeps; a report from a new node past them gets 507 (known "
        "nodes report as before; DELETE /v1/nodes/NAME makes room)")] = 100_000
    log_level: LogLevel = "info"
    node_types: Annotated[dict[str, NodeType], setting(
        "the instance catalogue for fleet sizing (POST /v1/sizing, edgeagent coordinator "
        "size) and provisioning (GET /v1/provisioning): kinds of node (agents name theirs "
        "with coordinator.node_type) and their price per hour. max_count bounds the "
        "sizing search (default 8); launch_s is the time a new node takes to serve "
        "(default 0). cores, cpu_memory_bytes, proc_ms ({model: ms}) and capacity_rps "
        "(requests per second one node serves) default to what nodes of the kind report",
        check=node_types_option, example={
            "c5.large": {"price_per_hour": 0.085, "max_count": 10, "launch_s": 120},
            "c5.2xlarge": {"price_per_hour": 0.34, "max_count": 4, "launch_s": 150}},
        commented=True)] = field(default_factory=dict)
    read_timeout_s: Annotated[Positive, setting(
        "a TLS handshake, then a request's headers, then its body, must arrive within "
        "this")] = 30.0
    max_request_size: Annotated[int, setting(
        "largest request body (decoded); larger ones get 413", check=size,
        example="8MiB")] = 8 * 2**20
    max_request_bytes_in_flight: Annotated[int, setting(
        "request bodies read and not yet answered, in all (in each report worker too); "
        "a body that does not fit waits for room, then 503", check=size,
        example="64MiB")] = 64 * 2**20
    max_connections: MaxConnections = None
    max_connections_per_peer: MaxConnectionsPerPeer = None
    store: Annotated[str | None, setting(
        "instead of the SQLite file: one PostgreSQL database shared by several "
        "coordinators, one of which plans at a time (pip install 'edgeagent[postgres]'; "
        "a password from ~/.pgpass or $PGPASSWORD)", check=postgresql_url,
        example="postgresql://edge@db.internal:5432/fleet")] = None
    rollout: Annotated[RolloutSettings, setting(
        "how a new catalog version reaches the nodes: in waves, each judged against the "
        "old version (a catalog entry's own rollout: keys override these)")] = field(
        default_factory=RolloutSettings)
    rollout_check_s: Annotated[Positive, setting(
        "the planning coordinator looks at the rollouts under way this often")] = 1.0
    report_workers: Annotated[int, setting(
        "processes beside the coordinator that answer node reports on its port (one core "
        "each): 1 or 2 for fleets of thousands of nodes", ge=0, le=64)] = 0
    report_worker_poll_ms: Annotated[float, setting(
        "a report worker busy with reports polls its connections at most this often "
        "(ms), each poll taking every lease and report that arrived since: fewer wakes, "
        "less CPU, up to this much added latency; 0: at once, on uvloop", ge=0,
        le=100)] = 5.0
    report_shed_lag_ms: Annotated[Positive, setting(
        "refuse reports early (503 with Retry-After) while the process answering them "
        "(the coordinator or a report worker) runs this late (its event loop's lag, "
        "smoothed over half a second) with work all the time: a herd is refused at "
        "once, not answered late")] \
        = 500.0
    report_shed_queue: Annotated[AtLeastOne, setting(
        "... or while this many answered reports wait to be written (the group commit) "
        "or handed over to the coordinator (a report worker's)")] = 20_000
    report_retry_after_s: Annotated[Positive, setting(
        "the Retry-After of such a refusal (agents report again between it and twice "
        "it, serving on their last directives meanwhile)")] = 5.0

    @property
    def database(self) -> Path:
        return self.state_dir / "coordinator.sqlite3"

    @property
    def lease_lag_s(self) -> float:
        """How far a node's stored ``last_seen`` may lag its last lease: the
        ``lease_write_s`` in use, at most a quarter of ``node_timeout_s``."""
        return min(self.lease_write_s, self.node_timeout_s / 4)

    def with_overrides(self, **changes: Any) -> CoordinatorConfig:
        """A copy with the non-None ``changes`` applied (command-line flags)."""
        return structs.replace(self, **{k: v for k, v in changes.items() if v is not None})


def parse_coordinator_config(data: Any, file: str | Path | None = None) -> CoordinatorConfig:
    """A ``CoordinatorConfig`` from a parsed YAML mapping; relative paths are from
    ``file``'s directory."""
    config = load(CoordinatorConfig, data, file)
    if config.rate_step_s > config.plan_window_s:
        raise ConfigError(file, "rate_step_s", "must not exceed plan_window_s")
    return config


def load_coordinator_config(path: str | Path | None) -> CoordinatorConfig:
    """The file's settings, or the embedded defaults for None."""
    if path is None:
        return CoordinatorConfig()
    path = Path(path)
    return parse_coordinator_config(load_yaml(path), path)
