"""Bearer-token admin auth shared by the node agent and the coordinator.

One token per server, read from a file; requests to protected paths must carry
``Authorization: Bearer <token>`` (compared in constant time) or get a JSON 401.
Without a token, ``host_check`` refuses requests addressed to a name that is not the
server's own (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
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


def own_names(bound: str, allowed: Iterable[str]) -> frozenset[str]:
    """The host names a server answers to besides IP addresses and localhost: the
    address it is bound to, this machine's name, and the configured ``allowed_hosts``."""
    names = {bound, socket.gethostname(), *allowed}
    return frozenset(n.lower().rstrip(".") for n in names if n)


def names_this_server(host: str | None, names: frozenset[str]) -> bool:
    """Whether ``host`` (a Host header, ``name[:port]``, or an Origin's host) names this
    server: an IP address (a page that rebinds its own name to this server's address
    still sends its name), ``localhost`` or a name under ``.localhost``, or one of
    ``names`` (``own_names``)."""
    if not host:
        return False
    name = host.lower()
    if name.startswith("["):  # [v6]:port
        name = name[1:name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    name = name.rstrip(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or name in names


def host_check(token_of: Callable[[web.Request], str | None],
               names_of: Callable[[web.Request], frozenset[str]]) -> Any:
    """Middleware: while the app has no token (``token_of(request)`` is None), a request
    whose ``Host`` or ``Origin`` (each when sent: a browser sends Host) does not name this server
    (``names_this_server`` with ``names_of(request)``) gets a JSON 403 naming it. A web
    page a user visits can rebind its own name to this server's address and then call
    it from the browser (DNS rebinding): it sends its own name as the Host. With a token
    there is no check: the page cannot read the token, so it can call nothing the token
    protects, and a server given a token is meant to be reached by names of the
    operator's choosing (proxies, load balancers) without listing each."""

    @web.middleware
    async def host_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if token_of(request) is None:
            names = names_of(request)
            host, origin = request.headers.get("Host"), request.headers.get("Origin")
            for header, value, named in (
                    ("Host", host, host),
                    ("Origin", origin, origin and origin.partition("://")[2].split("/")[0])):
                if value is not None and not names_this_server(named, names):
                    return json_error(403, f"{header} {value!r} is not this server's name "
                                           "(no token is configured: only its addresses, "
                                           "localhost and allowed_hosts are answered)")
        return await handler(request)

    return host_middleware
