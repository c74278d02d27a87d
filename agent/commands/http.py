"""The one HTTP call the CLI makes to an agent or coordinator: JSON in, JSON out."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any, Callable

import click

from agent.security.tls import client_context, verify_failure


def call_json(url: str, method: str, path: str, body: Any = None, *, token: str | None = None,
              server: str = "server", timeout: float = 60,
              decode: Callable[[bytes], Any] = json.loads) -> Any:
    """``method`` ``url+path`` with a JSON ``body``; the parsed JSON answer (or what
    ``decode`` makes of the body: ``bytes.decode`` for a CSV).

    HTTP errors become a ``ClickException`` carrying the server's ``{"error": ...}``
    message; an unreachable ``server`` (named in the message) likewise. An https://
    ``url`` is verified as the command's ``--ca-file``/``--cert``/``--key`` say.
    """
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_tls(url)) as resp:
            return decode(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            message = err.reason
        raise click.ClickException(f"{err.code}: {message}") from None
    except urllib.error.URLError as err:
        why = verify_failure(err, _tls_files().get("ca_file")) or err.reason
        raise click.ClickException(f"cannot reach the {server} at {url}: {why}") from None


def _tls_files() -> dict[str, Any]:
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    return {k: meta.get(f"tls.{k}") for k in ("ca_file", "cert_file", "key_file")}


def _tls(url: str) -> ssl.SSLContext | None:
    """The client context for an https:// ``url`` (``agent.commands.tls_options``)."""
    if not url.startswith("https://"):
        return None
    try:
        return client_context(**_tls_files())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
