"""Scoped bearer auth shared by the node agent, the coordinator and its report workers.

A ``Guard`` holds what a server accepts (``agent.security.credentials``), the per-peer throttle
of failed attempts (``agent.security.auththrottle``) and their counts. ``scoped_auth`` is the
middleware: a path's ``Need`` (a scope, and for a node's report its node name) is met
by a credential that allows it, else 401 (no or unknown credential), 403 (wrong scope
or another node's report) or 429 with ``Retry-After`` (too many failures from that
peer: while it is throttled its tokens are not even looked at, so a guess among many
cannot succeed; a verified client certificate, which no one guesses, is still
judged). Failures are logged as rate-limited warnings, never with the token.
``host_check`` refuses a request that carries no credential and is addressed to a name
that is not the server's own (DNS rebinding); a token a request carries is then always
judged, even where none is needed (``ANY``).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import socket
import ssl
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
FORWARDED_ISSUED = "X-Edgeagent-Peer-Issued"
FORWARD_KEY = "X-Edgeagent-Forward-Key"
#: At most one failed-auth warning per this many seconds (the rest are counted in it).
WARN_EVERY_S = 10.0


class Need(NamedTuple):
    """What a request needs: a scope, and for a node's report, that node's name."""

    scope: str
    node: str | None = None


#: What an open path needs of a request that carries a token anyway: a valid one, of
#: any scope (a page that sends a made-up token to pass ``host_check`` gets 401).
ANY = Need("")


class Verdict(NamedTuple):
    status: int  # 200: allowed
    message: str = ""
    retry_after: int = 0
    credential: Credential | None = None


class Peer(NamedTuple):
    """Who sent a request: its address and, with a verified client certificate, the
    node it names and when it was issued (its notBefore, epoch seconds)."""

    address: str
    name: str | None = None
    issued: float | None = None


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


def certificate_issued(transport: Any) -> float | None:
    """A verified client certificate's notBefore in epoch seconds (None without one)."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    try:
        return float(ssl.cert_time_to_seconds(cert["notBefore"])) if cert else None
    except (KeyError, ValueError):
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

    def judge(self, header: str, need: Need, peer_name: str | None = None,
              peer_issued: float | None = None) -> Verdict:
        """Whether the ``Authorization`` value ``header`` (or, without one, the peer's
        certificate: its name, unless certificates naming it issued by ``peer_issued``
        were revoked) meets ``need`` (nothing counted: ``authorize`` counts)."""
        token = bearer(header)
        if token is None and peer_name is not None:
            revoked = self.credentials.revoked_since(peer_name, peer_issued)
            if revoked is not None:
                return Verdict(401, f"the certificate of node {peer_name!r} was revoked "
                                    "(DELETE /v1/nodes): one issued after "
                                    f"{_utc(revoked)} names the node again")
        cred = self.credentials.find(token, self.clock()) if token is not None \
            else peer_credential(peer_name)
        if cred is None:
            what = "an unknown or expired token" if token is not None else "no credential"
            return Verdict(401, f"{what}: this endpoint needs 'Authorization: Bearer "
                                f"<token>' with scope {need.scope!r}" if need.scope else
                                f"{what}: a token sent must be valid, even where none "
                                "is needed")
        if need.scope and not cred.allows(need.scope):
            return Verdict(403, f"credential {cred.name!r} lacks scope {need.scope!r} "
                                f"(it has {', '.join(sorted(cred.scopes))})")
        if need.node is not None and "admin" not in cred.scopes and cred.node != need.node:
            return Verdict(403, f"credential {cred.name!r} is node {cred.node!r}'s: a node "
                                f"writes only its own report, not {need.node!r}'s")
        return Verdict(200, credential=cred)

    def authorize(self, header: str, need: Need, *, peer: str,
                  peer_name: str | None = None, peer_issued: float | None = None) -> Verdict:
        """``judge``, unless ``peer`` is throttled and the request rests on a token (or
        nothing): then 429, the token unread (a throttled guesser learns nothing, at the
        price of a valid token from the same address waiting out the throttle too); a
        failure is ``refused``."""
        if self.holds_back(header, peer, peer_name):
            throttled = self.throttled(peer, need)
            if throttled is not None:
                return throttled
        verdict = self.judge(header, need, peer_name, peer_issued)
        if verdict.status == 200:
            return verdict
        return self.refused(verdict, peer, need)

    def holds_back(self, header: str, peer: str, peer_name: str | None) -> bool:
        """Whether ``peer`` is throttled and the request rests on a token (or nothing):
        then it is not judged. A verified certificate (no token) always is."""
        return (bearer(header) is not None or peer_name is None) and bool(
            self.throttle.retry_after(peer))

    def throttled(self, peer: str, need: Need) -> Verdict | None:
        """A 429 (counted) while ``peer`` may not try again; None when it may."""
        wait = self.throttle.retry_after(peer)
        if not wait:
            return None
        return self._fail("throttled", peer, need, Verdict(
            429, f"too many failed authentications from {peer}; retry in {wait} s", wait))

    def refused(self, verdict: Verdict, peer: str, need: Need) -> Verdict:
        """A refusal of ``peer``, counted and logged. A 401 (no or an unknown token:
        guessing) also spends the peer's burst of failures, after which it is 429; a
        403 comes from a known credential and stays 403."""
        if verdict.status != 401:
            return self._fail("forbidden", peer, need, verdict)
        throttled = self.throttled(peer, need)
        if throttled is not None:
            return throttled
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


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def is_forwarded(request: web.Request, forward_key: str | None) -> bool:
    """Whether ``request`` carries ``forward_key`` (a report worker forwarded it)."""
    given = request.headers.get(FORWARD_KEY)
    return bool(forward_key) and given is not None and hmac.compare_digest(
        given.encode(), forward_key.encode())


def request_peer(request: web.Request, forward_key: str | None = None, *,
                 certificates: bool = False) -> Peer:
    """The request's peer: its address and (with ``certificates``) its verified
    certificate's name and issue time; a report worker's forwarded ones where the
    request carries ``forward_key`` (the one its coordinator shares with it)."""
    if is_forwarded(request, forward_key):
        try:
            issued = float(request.headers.get(FORWARDED_ISSUED, ""))
        except ValueError:
            issued = None
        return Peer(request.headers.get(FORWARDED_PEER, "unknown"),
                    request.headers.get(FORWARDED_NAME) or None, issued)
    if not certificates:
        return Peer(request.remote or "unknown")
    return Peer(request.remote or "unknown", certificate_name(request.transport),
                certificate_issued(request.transport))


def respond(verdict: Verdict) -> web.Response:
    """A refusal as the JSON error it is."""
    headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else {}
    if verdict.retry_after:
        headers["Retry-After"] = str(verdict.retry_after)
    return json_error(verdict.status, verdict.message, headers)


def scoped_auth(guard_of: Callable[[web.Request], Guard],
                need_of: Callable[[web.Request], Need | None],
                forward_key_of: Callable[[web.Request], str | None] = lambda r: None, *,
                certificates: bool = False, open_tokens: bool = True) -> Any:
    """Middleware: a request whose ``need_of(request)`` is a ``Need`` must meet it
    (None: open; with ``open_tokens``, a token sent to an open path must be valid:
    ``ANY``). ``certificates``: a verified client certificate names a node (its
    reports)."""

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        guard = guard_of(request)
        forward_key = forward_key_of(request)
        if not (guard.credentials or certificates or forward_key):  # nothing to check
            return await handler(request)
        need = need_of(request)
        if need is None and open_tokens and guard.credentials and bearer(
                request.headers.get("Authorization", "")) is not None:
            need = ANY
        if need is not None:
            peer = request_peer(request, forward_key, certificates=certificates)
            if guard.checks(peer.name):
                verdict = guard.authorize(request.headers.get("Authorization", ""), need,
                                          peer=peer.address, peer_name=peer.name,
                                          peer_issued=peer.issued)
                if verdict.status != 200:
                    return respond(verdict)
        return await handler(request)

    return auth_middleware


def own_names(bound: str, allowed: Iterable[str]) -> frozenset[str]:
    """The host names a server answers to besides IP addresses and localhost: the
    address it is bound to, this machine's name, and the configured ``allowed_hosts``."""
    names = {bound, socket.gethostname(), *allowed}
    return frozenset(n.lower().rstrip(".") for n in names if n)


@functools.lru_cache(maxsize=256)
def names_this_server(host: str | None, names: frozenset[str]) -> bool:
    """Whether ``host`` (a Host header, ``name[:port]``, or an Origin's host) names this
    server: an IP address (a page that rebinds its own name to this server's address
    still sends its name), ``localhost`` or a name under ``.localhost``, or one of
    ``names`` (``own_names``). (Remembered for the last few: a fleet's nodes send the
    same few ``Host`` values thousands of times a second.)"""
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


def carries_credential(request: web.Request, guard: Guard,
                       certificates: bool = False) -> bool:
    """Whether ``request`` comes with something ``guard`` will judge: a bearer token
    (where it has tokens) or, with ``certificates``, a verified client certificate."""
    if guard.credentials and bearer(request.headers.get("Authorization", "")) is not None:
        return True
    return certificates and certificate_name(request.transport) is not None


def host_check(credentialed: Callable[[web.Request], bool],
               names_of: Callable[[web.Request], frozenset[str]]) -> Any:
    """Middleware: a request without a credential (``credentialed(request)`` is false,
    whatever the server's auth settings) whose ``Host`` or ``Origin`` (each when sent: a
    browser sends Host) does not name this server (``names_this_server`` with
    ``names_of(request)``) gets a JSON 403 naming it. A web page a user visits can
    rebind its own name to this server's address and then call it from the browser
    (DNS rebinding): it sends its own name as the Host, and no credential it knows (a
    token it makes up is refused by ``scoped_auth`` wherever there is anything to have;
    a client certificate comes only over TLS, whose server name the page's name does
    not match). A request with a credential may use any name (proxies, load
    balancers)."""

    named_here: dict[tuple[str, frozenset[str]], bool] = {}  # the verdicts of recent names

    def names_here(named: str | None, names: frozenset[str]) -> bool:
        key = (named or "", names)
        verdict = named_here.get(key)
        if verdict is None:
            if len(named_here) >= HOST_VERDICTS:
                named_here.clear()
            verdict = named_here[key] = names_this_server(named, names)
        return verdict

    @web.middleware
    async def host_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if not credentialed(request):
            names = names_of(request)
            host, origin = request.headers.get("Host"), request.headers.get("Origin")
            if host is not None and not names_here(host, names):
                return _not_named("Host", host)
            if origin is not None and not names_here(
                    origin.partition("://")[2].split("/")[0], names):
                return _not_named("Origin", origin)
        return await handler(request)

    return host_middleware


#: Host and Origin names whose verdict ``host_check`` keeps (forgotten all at once when
#: full: a stranger's many names cost a recheck, never memory).
HOST_VERDICTS = 256


def _not_named(header: str, value: str) -> web.Response:
    return json_error(403, f"{header} {value!r} is not this server's name (without a "
                           "credential only its addresses, localhost and allowed_hosts "
                           "are answered)")
