"""Trust between nodes: the mark a forwarded request carries, who may set it, and what
a node forwards with.

A node forwards with its own fleet identity: its peer token (``routing.token_file``,
a token with scope ``peer`` in the other nodes' ``auth.token_file``) and, to ``https://``
peers, its client certificate. The client's own ``Authorization`` is checked by the
first node (its middleware) and never passed on.

A request carrying the mark (``edgeagent-forwarded-by``) is served where it lands and
never forwarded again, so it must come from a fleet node: one whose bearer token has
scope ``peer``, or that presents a client certificate the listener verified
(``tls.client_ca_file``: the fleet's CA, whose certificates name nodes, as the
coordinator takes them for a node's identity). On an open node (no tokens,
no client certificates checked) the mark is taken from the addresses of the table's
nodes (and from anyone while the node holds no table: it then serves every request
itself, so the mark skips nothing). Anyone else who sets it is refused (403, gRPC
PERMISSION_DENIED): a stranger can neither skip a hop nor pass for a node.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any
from urllib.parse import urlsplit

from agent import tracing
from agent.security.credentials import bearer
from agent.errors import AgentError
from agent.security.httpauth import Guard, certificate_name
from agent.node.call import Mark
from agent.wire import RoutingTable

#: The mark of a forwarded request (HTTP header; gRPC metadata): the forwarding node.
MARK = "edgeagent-forwarded-by"
#: The node that served a request (HTTP header; gRPC trailing metadata).
SERVED_BY = "edgeagent-served-by"
#: Milliseconds the serving node spent on a forwarded request (the hop is the rest).
SERVE_MS = "edgeagent-serve-ms"

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class MarkRefused(AgentError):
    """A request marked as forwarded by a sender that is not a fleet node (403)."""

    status = 403


def _host(address: str) -> str:
    """The host of a URL or ``host:port`` (brackets of an IPv6 address removed)."""
    if "://" in address:
        return (urlsplit(address).hostname or "").lower()
    host = address.rpartition(":")[0]
    return host.strip("[]").lower()


def fleet_hosts(table: RoutingTable) -> frozenset[str]:
    """The hosts the table's nodes are reached at (loopback's names as one)."""
    hosts = set()
    for peer in table.nodes.values():
        for address in (peer.url, peer.grpc):
            if address:
                host = _host(address)
                hosts |= _LOOPBACK if host in _LOOPBACK else {host}
    return frozenset(hosts)


def _address(remote: str | None) -> str:
    """A peer address as the table's hosts are written (an IPv4-mapped IPv6 one as
    IPv4)."""
    if not remote:
        return ""
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return remote.lower()
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


class Trust:
    """This node's identity towards its peers and its judgement of marked requests."""

    def __init__(self, name: str, guard: Guard, token: str | None, *,
                 checks_certificates: bool) -> None:
        self.name = name
        self.guard = guard
        self.token = token
        self.checks_certificates = checks_certificates
        self.refused = 0  # marked requests refused: strangers, or misconfigured nodes

    def outgoing(self) -> list[tuple[str, str]]:
        """The headers (gRPC metadata) a forwarded request carries: the mark, this
        node's peer token when it has one, and the W3C trace context of the request it
        serves when that is traced (``agent.tracing``)."""
        out = [(MARK, self.name)]
        if self.token is not None:
            out.append(("authorization", f"Bearer {self.token}"))
        out.extend(tracing.outgoing())  # tracing
        return out

    def sender(self, mark: Mark, table: RoutingTable | None) -> str:
        """The fleet node a call marked ``mark`` comes from (its certificate's or
        token's node when they name one, else the mark's); ``MarkRefused`` when nothing
        shows it is one."""
        if mark.certificate is not None:  # verified by tls.client_ca_file: the fleet's CA
            return mark.certificate
        cred = self.guard.credentials.find(bearer(mark.authorization or ""), time.time())
        if cred is not None and cred.allows("peer"):
            return cred.node or mark.node
        if not self.guard.credentials and not self.checks_certificates and (
                table is None or _address(mark.remote) in fleet_hosts(table)):
            return mark.node  # (no table: served here anyway, the mark skips nothing)
        self.refused += 1
        raise MarkRefused(f"this request is marked {MARK}: {mark.node!r}, a mark only "
                          "fleet nodes may set (a token with scope peer, or a client "
                          "certificate of the fleet's CA)")


def http_mark(request: Any) -> Mark | None:
    """The mark of an aiohttp request, with what shows who set it (None: unmarked)."""
    node = request.headers.get(MARK)
    if node is None:
        return None
    return Mark(node, request.headers.get("Authorization", ""),
                certificate_name(request.transport), request.remote)


def grpc_mark(context: Any, metadata: dict[str, str]) -> Mark | None:
    """The mark of a gRPC call (``metadata``: its invocation metadata), with what shows
    who set it (None: unmarked)."""
    node = metadata.get(MARK)
    if node is None:
        return None
    auth = context.auth_context() or {}
    names = auth.get("x509_subject_alternative_name") or auth.get("x509_common_name")
    peer = context.peer() or ""  # ipv4:127.0.0.1:5000, ipv6:[::1]:5000
    return Mark(node, metadata.get("authorization", ""),
                names[0].decode() if names else None,
                peer.partition(":")[2].rpartition(":")[0].strip("[]"))
