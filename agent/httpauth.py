"""Bearer-token admin auth shared by the node agent and the coordinator.

One token per server, read from a file; requests to protected paths must carry
``Authorization: Bearer <token>`` (compared in constant time) or get a JSON 401.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from agent.errors import json_error


def read_token(path: str | Path | None) -> str | None:
    """The token in ``path`` (stripped), None without a path; an empty file is an error."""
    if path is None:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"admin token file {path} is empty")
    return token


def token_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` as a bearer token."""
    return header.startswith("Bearer ") and hmac.compare_digest(
        header[7:].strip().encode(), token.encode())


def bearer_auth(token_of: Callable[[web.Request], str | None],
                protected: Callable[[str], bool]) -> Any:
    """Middleware: paths for which ``protected(path)`` holds need the app's current token
    (``token_of(request)``; None disables the check, e.g. no token file configured)."""

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        token = token_of(request)
        if token is not None and protected(request.path) and not token_matches(
                request.headers.get("Authorization", ""), token):
            return json_error(401, "admin endpoints need 'Authorization: Bearer <token>'",
                              {"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return auth_middleware
