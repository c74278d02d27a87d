"""The one HTTP call the CLI makes to an agent or coordinator: JSON in, JSON out."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click


def call_json(url: str, method: str, path: str, body: Any = None, *, token: str | None = None,
              server: str = "server", timeout: float = 60) -> Any:
    """``method`` ``url+path`` with a JSON ``body``; the parsed JSON answer.

    HTTP errors become a ``ClickException`` carrying the server's ``{"error": ...}``
    message; an unreachable ``server`` (named in the message) likewise.
    """
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            message = err.reason
        raise click.ClickException(f"{err.code}: {message}") from None
    except urllib.error.URLError as err:
        raise click.ClickException(f"cannot reach the {server} at {url}: {err.reason}") from None
