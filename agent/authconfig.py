"""The ``auth:`` sections of the agent's and the coordinator's configs (declarations
only; ``agent.credentials`` reads the files they name)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from agent.schema import Section, setting
from agent.validation import choice

#: The endpoint groups open by default that ``auth.protect`` may guard too.
PROTECTABLE = ("read", "infer")
Group = Annotated[str, setting("an endpoint group", check=choice(*PROTECTABLE))]


class AuthSettings(Section):
    """Scoped bearer tokens (``auth:``), besides the one admin_token_file."""

    token_file: Annotated[Path | None, setting(
        "YAML list of accepted tokens by their SHA-256 ({name, sha256, scopes: [admin|"
        "read|infer|report], not_after, node}); edgeagent token new prints an entry; "
        "re-read on SIGHUP", example="/etc/edgeagent/tokens.yaml")] = None


class AgentAuthSettings(AuthSettings):
    """The agent's tokens and which open endpoint groups they also guard (``auth:``)."""

    protect: Annotated[tuple[Group, ...], setting(
        "with tokens, also require them for these groups, open by default (Triton's "
        "restricted APIs): read (/metrics and statistics), infer (inference and model "
        "metadata)", example=["read", "infer"], commented=True)] = ()
