"""Scoped bearer auth shared by the node agent, the coordinator and its report workers.

A ``Guard`` holds what a server accepts (``agent.security.credentials``), the per-peer throttle
of failed attempts (``agent.security.auththrottle``) and their counts. ``scoped_auth`` is the
middleware: a path's ``Need`` (a scope, and for a node's report its node name) is met
by a credential that allows it, else 401 (no or unknown credential), 403 (wrong scope
or another node's report) or 429 with ``Retry-After`` (too many failures from that
peer). Failures are logged as rate-limited warnings, never with the token.
Without any credential, ``host_check`` refuses requests addressed to a name that is not
the server's own (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple

from aiohttp import web

from agent.security.auththrottle import FailureThrottle
from agent.security.credentials import Credential, Credentials, bearer
from agent.errors import json_error

log = logging.getLogger("edgeagent.auth")

#: Header a report worker sets when it forwards a request: the real peer address and
#: the name on its client certificate, vouched for by the forward key it shares with
#: its coordinator (a client's own such headers are dropped).
FORWARDED_PEER = "X-Edgeagent-Peer"
FORWARDED_NAME = "X-Edgeagent-Peer-Name"
FORWARD_KEY = "X-Edgeagent-Forward-Key"
#: At most one failed-auth warning per this many seconds (the rest are counted in it).
WARN_EVERY_S = 10.0


class Need(NamedTuple):
    """What a request needs: a scope, and for a node's report, that node's name."""

    scope: str
    node: str | None = None


class Verdict(NamedTuple):
    status: int  # 200: allowed
    message: str = ""
    retry_after: int = 0
    credential: Credential | None = None


def peer_credential(name: str | None) -> Credential | None:
    """A verified client certificate's node name as a credential: that node's reports."""
    return None if not name else Credential(f"certificate:{name}", "", frozenset({"report"}),
                                            node=name)


def certificate_name(transport: Any) -> str | None:
    """The node name on a verified client certificate: its DNS SAN, else its subject CN
    (None without TLS or without a certificate the listener verified)."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "DNS":
            return value
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


class Guard:
    """One server's credentials, failure throttle and failure counts."""

    def __init__(self, credentials: Credentials | None = None, *,
                 throttle: FailureThrottle | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.credentials = credentials if credentials is not None else Credentials()
        self.throttle = throttle if throttle is not None else FailureThrottle()  # len 0: falsy
        self.clock = clock
        #: Failed attempts by reason: unauthenticated, forbidden, throttled.
        self.failures = {"unauthenticated": 0, "forbidden": 0, "throttled": 0}
        self._warned_at = -WARN_EVERY_S
        self._unwarned = 0

    def checks(self, peer_name: str | None = None) -> bool:
        """Whether anything is checked: a credential is configured or the peer has a
        verified certificate (none of either: an open server, as without tokens)."""
        return bool(self.credentials) or peer_name is not None

    def judge(self, header: str, need: Need, peer_name: str | None = None) -> Verdict:
        """Whether the ``Authorization`` value ``header`` (or, without one, the peer's
        certificate name) meets ``need`` (nothing counted: ``authorize`` counts)."""
        token = bearer(header)
        cred = self.credentials.find(token, self.clock()) if token is not None \
            else peer_credential(peer_name)
        if cred is None:
            what = "an unknown or expired token" if token is not None else "no credential"
            return Verdict(401, f"{what}: this endpoint needs 'Authorization: Bearer "
                                f"<token>' with scope {need.scope!r}")
        if not cred.allows(need.scope):
            return Verdict(403, f"credential {cred.name!r} lacks scope {need.scope!r} "
                                f"(it has {', '.join(sorted(cred.scopes))})")
        if need.node is not None and "admin" not in cred.scopes and cred.node != need.node:
            return Verdict(403, f"credential {cred.name!r} is node {cred.node!r}'s: a node "
                                f"writes only its own report, not {need.node!r}'s")
        return Verdict(200, credential=cred)

    def authorize(self, header: str, need: Need, *, peer: str,
                  peer_name: str | None = None) -> Verdict:
        """``judge``; a failure is ``refused``. A valid credential is never throttled:
        nodes behind one NAT are not locked out by a failing neighbour."""
        verdict = self.judge(header, need, peer_name)
        if verdict.status == 200:
            return verdict
        return self.refused(verdict, peer, need)

    def refused(self, verdict: Verdict, peer: str, need: Need) -> Verdict:
        """A refusal of ``peer``, counted and logged. A 401 (no or an unknown token:
        guessing) also spends the peer's burst of failures, after which it is 429; a
        403 comes from a known credential and stays 403."""
        if verdict.status != 401:
            return self._fail("forbidden", peer, need, verdict)
        wait = self.throttle.retry_after(peer)
        if wait:
            return self._fail("throttled", peer, need, Verdict(
                429, f"too many failed authentications from {peer}; retry in {wait} s",
                wait))
        self.throttle.failed(peer)
        return self._fail("unauthenticated", peer, need, verdict)

    def _fail(self, reason: str, peer: str, need: Need, verdict: Verdict) -> Verdict:
        self.failures[reason] += 1
        log.debug("auth refused from %s: %d %s", peer, verdict.status, verdict.message)
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            more = f" ({self._unwarned} more failures since the last warning)" \
                if self._unwarned else ""
            log.warning("auth failed from %s: %d for scope %s%s%s", peer, verdict.status,
                        need.scope, f" of node {need.node}" if need.node else "", more)
            self._warned_at, self._unwarned = now, 0
        else:
            self._unwarned += 1
        return verdict

    def metrics_lines(self, prefix: str, failures: dict[str, int] | None = None
                      ) -> list[str]:
        """The failure counter in Prometheus text (``<prefix>_auth_failures_total``):
        ``failures``, or this guard's own counts."""
        name = f"{prefix}_auth_failures_total"
        counts = self.failures if failures is None else failures
        return [f"# HELP {name} Failed authentications by reason.",
                f"# TYPE {name} counter"] + [
            f'{name}{{reason="{reason}"}} {count}' for reason, count in counts.items()]


def request_peer(request: web.Request, forward_key: str | None = None, *,
                 certificates: bool = False) -> tuple[str, str | None]:
    """The request's peer address and (with ``certificates``) its verified certificate's
    name; a report worker's forwarded ones where the request carries ``forward_key``
    (the one its coordinator shares with it)."""
    given = request.headers.get(FORWARD_KEY)
    if forward_key and given is not None:
        if hmac.compare_digest(given.encode(), forward_key.encode()):
            return (request.headers.get(FORWARDED_PEER, "unknown"),
                    request.headers.get(FORWARDED_NAME) or None)
    return (request.remote or "unknown",
            certificate_name(request.transport) if certificates else None)


def respond(verdict: Verdict) -> web.Response:
    """A refusal as the JSON error it is."""
    headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else {}
    if verdict.retry_after:
        headers["Retry-After"] = str(verdict.retry_after)
    return json_error(verdict.status, verdict.message, headers)


def scoped_auth(guard_of: Callable[[web.Request], Guard],
                need_of: Callable[[web.Request], Need | None],
                forward_key_of: Callable[[web.Request], str | None] = lambda r: None, *,
                certificates: bool = False) -> Any:
    """Middleware: a request whose ``need_of(request)`` is a ``Need`` must meet it
    (None: open). ``certificates``: a verified client certificate names a node (its
    reports)."""

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        need = need_of(request)
        if need is not None:
            guard = guard_of(request)
            peer, name = request_peer(request, forward_key_of(request),
                                      certificates=certificates)
            if guard.checks(name):
                verdict = guard.authorize(request.headers.get("Authorization", ""), need,
                                          peer=peer, peer_name=name)
                if verdict.status != 200:
                    return respond(verdict)
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


def host_check(guarded: Callable[[web.Request], bool],
               names_of: Callable[[web.Request], frozenset[str]]) -> Any:
    """Middleware: while the app has no credential (``guarded(request)`` is false), a request
    whose ``Host`` or ``Origin`` (each when sent: a browser sends Host) does not name this server
    (``names_this_server`` with ``names_of(request)``) gets a JSON 403 naming it. A web
    page a user visits can rebind its own name to this server's address and then call
    it from the browser (DNS rebinding): it sends its own name as the Host. With a token
    there is no check: the page cannot read the token, so it can call nothing the token
    protects, and a server given a token is meant to be reached by names of the
    operator's choosing (proxies, load balancers) without listing each."""

    @web.middleware
    async def host_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if not guarded(request):
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
