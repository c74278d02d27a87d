"""The safe default: a server bound beyond loopback needs TLS and a token, or an
explicit ``insecure`` (``--insecure``) to start."""

from __future__ import annotations

import ipaddress
from typing import Any


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def has_token(config: Any) -> bool:
    """Whether ``config`` names a token file (``admin_token_file`` or ``auth.token_file``)."""
    return config.admin_token_file is not None or config.auth.token_file is not None


def has_credentials(config: Any) -> bool:
    """Whether ``config`` (the agent's or the coordinator's) has TLS and a token."""
    return config.tls is not None and has_token(config)


def exposure_error(config: Any) -> str | None:
    """Why ``config`` may not start as it is (a non-loopback ``host`` without TLS and a
    token, ``insecure`` not set); None when it may."""
    if config.insecure or is_loopback(config.host) or has_credentials(config):
        return None
    missing = " and ".join(what for what, given in (
        ("tls (cert_file, key_file)", config.tls is not None),
        ("a token (admin_token_file or auth.token_file)", has_token(config)))
        if not given)
    return (f"refusing to listen on {config.host} without {missing}: anyone who reaches "
            "it could use it. Configure them, bind 127.0.0.1, or pass --insecure "
            "(config key insecure: true) to serve in the clear anyway")
