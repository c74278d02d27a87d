"""The ``auth:`` sections of the agent's and the coordinator's configs (declarations
only; ``agent.security.credentials`` reads the files they name)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from agent.security.auththrottle import FailureThrottle
from agent.schema import Positive, Section, setting
from agent.validation import choice

#: The endpoint groups ``auth.protect`` guards with tokens (all, by default).
PROTECTABLE = ("read", "infer")
Group = Annotated[str, setting("an endpoint group", check=choice(*PROTECTABLE))]


class AuthSettings(Section):
    """Scoped bearer tokens (``auth:``), besides the one admin_token_file."""

    token_file: Annotated[Path | None, setting(
        "YAML list of accepted tokens by their SHA-256 ({name, sha256, scopes: [admin|"
        "read|infer|report|peer], not_after, node}); edgeagent token new prints an entry; "
        "re-read on SIGHUP", example="/etc/edgeagent/tokens.yaml")] = None
    failure_burst: Annotated[int, setting(
        "failed authentications (no or an unknown token) a peer address may make at "
        "once before it gets 429 + Retry-After; read at start", ge=1)] = 20
    failures_per_s: Annotated[Positive, setting(
        "failed authentications a peer may make a second after its burst")] = 2.0
    failure_peers: Annotated[int, setting(
        "peer addresses the failure throttle keeps (the least recently failing are "
        "dropped past it, so strangers cannot grow its state)", ge=1)] = 10_000

    def throttle(self) -> FailureThrottle:
        """The failed-authentication throttle these settings describe."""
        return FailureThrottle(burst=self.failure_burst, per_s=self.failures_per_s,
                               max_peers=self.failure_peers)


class AgentAuthSettings(AuthSettings):
    """The agent's tokens and which open endpoint groups they also guard (``auth:``)."""

    protect: Annotated[tuple[Group, ...], setting(
        "with tokens, also require them for these groups (Triton's restricted APIs): "
        "read (/metrics and statistics), infer (inference and model metadata); [] leaves "
        "them open to anyone who reaches the agent", example=["read", "infer"],
        commented=True)] = PROTECTABLE
