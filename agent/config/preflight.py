"""What a server refuses at start, found before it starts: ``edgeagent config check``
runs the very checks ``serve`` and ``coordinator serve`` run, so a file that checks ok
starts. Each refusal is a ``ConfigError`` naming the file and the key; a file a key
names that cannot be used names that file first (``/etc/edgeagent/admin-token:
admin_token_file: no such file``, as the TLS files are named), never a bare errno.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.security.credentials import CredentialError, load_token_file, read_secret
from agent.security.exposure import exposure_error
from agent.security.tls import ServerTls, client_context
from agent.validation import ConfigError, SchemaError, unreadable


def check_server(config: Any, file: str | Path | None) -> None:
    """The checks the agent and the coordinator share: the address needs TLS and a token
    (or ``insecure``), the token files hold usable tokens, the TLS files load."""
    refused = exposure_error(config)
    if refused:
        raise ConfigError(file, "host", refused)
    for key, path, read in (("admin_token_file", config.admin_token_file, read_secret),
                            ("auth.token_file", config.auth.token_file, load_token_file)):
        if path is None:
            continue
        try:
            read(path)
        except OSError as exc:
            raise unreadable(path, key, exc) from None
        except CredentialError as exc:
            raise ConfigError(file, key, str(exc)) from None
    if config.tls is not None:
        try:
            ServerTls(config.tls)
        except SchemaError as exc:
            raise _named(exc, file) from None


def check_agent(config: Any, file: str | Path | None, *, demo: bool = False) -> None:
    """``check_server``, then tracing's SDK where ``tracing:`` is set, the repository (a
    directory; ``demo``: the demo's, made at start) and the files of the coordinator
    link (its token file, its TLS files)."""
    check_server(config, file)
    if config.tracing is not None:
        from agent.tracing import missing_sdk

        missing = missing_sdk(config.tracing.protocol)
        if missing:
            raise ConfigError(file, "tracing", missing)
    repository = config.repository
    if repository is not None and not demo and not Path(repository).is_dir():
        raise ConfigError(repository, "repository", "no such directory"
                          if not Path(repository).exists() else "not a directory")
    link = config.coordinator
    if link is None:
        return
    if link.token_file is not None:
        try:
            Path(link.token_file).read_bytes()
        except OSError as exc:
            raise unreadable(link.token_file, "coordinator.token_file", exc) from None
    if link.join_token_file is not None and link.credential_file is None:
        raise ConfigError(file, "coordinator.join_token_file",
                          "needs coordinator.credential_file (where the node credential it "
                          "brings is kept)")
    if link.url.startswith("https://") or link.cert_file or link.key_file:
        try:
            client_context(link.ca_file, link.cert_file, link.key_file,
                           prefix="coordinator.")
        except SchemaError as exc:
            raise _named(exc, file) from None


def _named(exc: SchemaError, file: str | Path | None) -> ConfigError:
    """A file's problem as it stands (it names its file), else under the config file."""
    return exc if isinstance(exc, ConfigError) else ConfigError(file, exc.key, exc.message)
