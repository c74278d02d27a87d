"""The router: where each inference call is served, this node or a peer.

The front desk (``agent.node.frontdesk``) asks ``peer_for(call)`` before a call is
read (decoded); ``None`` means "serve it here", a peer's name that the call goes there
(``forward``: ``agent.node.routing.forward``). The rules, in order:

1. A call marked as forwarded (``Call.mark``) is served here, never forwarded again
   (at most one hop), if its sender is a fleet node (``trust.Trust.sender``; else 403).
2. With routing off, no table, or a table older than its limit (``table.HeldTable``):
   served here (the last a *fallback* when that table ran the model elsewhere).
3. A model the table gives no node is served here; otherwise one of its nodes is
   chosen by the plan's replicas, fewest outstanding first (``peers.PeerBook``), this
   node included when it runs the model (its share takes no hop).

Every answer names the node that served it (``edgeagent-served-by``, a header or gRPC
trailing metadata: the front ends write ``Answer.served_by``).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

from agent.security.credentials import read_token
from agent.security.httpauth import Guard
from agent.node.cache import CacheError, LoadFailed
from agent.node.call import V2_GRPC, Answer, Call
from agent.node.routing.forward import Forwarder
from agent.node.routing.grpc import GrpcForwarder
from agent.node.routing.http import HttpForwarder, PeerFailed
from agent.node.routing.peers import PeerBook
from agent.node.routing.stats import RoutingStats
from agent.node.routing.table import HeldTable
from agent.node.routing.trust import Trust
from agent.security.tls import client_context
from agent.wire import PeerAddress

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from agent.node.cache import ModelCache
    from agent.node.serving import Serving

log = logging.getLogger("edgeagent.routing")


class Router:
    """Routing on one node: its table, peers, trust, clients and counts."""

    def __init__(self, config: "AgentConfig", cache: "ModelCache", serving: "Serving",
                 guard: Guard, *, clock: Callable[[], float] = time.monotonic) -> None:
        s, link = config.routing, config.coordinator
        self.config, self.cache, self.serving, self.clock = config, cache, serving, clock
        self.enabled = config.routes
        self.name = config.node_name
        self.peer_timeout = s.peer_timeout_ms / 1000.0
        self.table = HeldTable(s.max_table_age_s)
        self.peers = PeerBook(s.peer_backoff_s, s.peer_backoff_max_s)
        self.stats = RoutingStats()
        tls = config.tls
        self.trust = Trust(self.name, guard, read_token(s.token_file),
                           checks_certificates=tls is not None and tls.client_auth != "none")
        ca = s.ca_file or (link.ca_file if link else None)
        cert = s.cert_file or (link.cert_file if link else None)
        key = s.key_file or (link.key_file if link else None)
        own = s.ca_file or s.cert_file or s.key_file  # else the coordinator link's files
        self.http_client = HttpForwarder(
            s.connections_per_peer,
            client_context(ca, cert, key, prefix="routing." if own else "coordinator.")
            if ca or cert else None)
        self.grpc_client = GrpcForwarder(_grpc_credentials(ca, cert, key))
        self.forwarder = Forwarder(self.http_client, self.grpc_client, self.trust,
                                   self.peers, self.stats, self._answer_within, clock)
        self.address: PeerAddress | None = None
        self._reported: dict[str, dict[str, int]] = {}  # totals at the last report

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.http_client.start()

    async def close(self) -> None:
        await self.http_client.close()
        await self.grpc_client.close()

    def listening(self, url: str, grpc_address: str | None) -> None:
        """Where this node listens (``edgeagent serve`` once bound): what it reports
        as its address unless ``coordinator.advertise_url``/``advertise_grpc`` say."""
        link = self.config.coordinator
        advertised = link.advertise_url if link else None
        parts = urlsplit(advertised or url)
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # every interface: the machine's name reaches it
            host = socket.gethostname()
        netloc = f"[{host}]" if ":" in host else host
        http_url = advertised or f"{parts.scheme}://{netloc}:{parts.port}"
        grpc = link.advertise_grpc if link and link.advertise_grpc else None
        if grpc is None and grpc_address is not None:
            grpc = f"{netloc}:{grpc_address.rpartition(':')[2]}"
        self.address = PeerAddress(http_url.rstrip("/"), grpc)

    # -- the table ---------------------------------------------------------------------
    def take(self, directives: Any) -> None:
        """The routing part of the coordinator's answer to a report."""
        before = self.table.version
        self.table.take(directives, self.clock())
        if self.table.version != before:
            table = self.table.table
            self.peers.forget(set(table.nodes) if table is not None else set())
            log.info("routing table %s: %d model(s) over %d node(s)", self.table.version,
                     len(table.models) if table else 0, len(table.nodes) if table else 0)

    def knows(self, model: str) -> bool:
        """Whether the table held names ``model`` (it may be routed, not stored here)."""
        table = self.table.table
        return table is not None and model in table.models

    def route(self, model: str, *, grpc: bool = False) -> tuple[str | None, str | None]:
        """(the peer to forward ``model``'s next request to, None: here; the fallback
        reason when it is served here though planned elsewhere, else None). ``grpc``:
        only peers with a gRPC address may take it."""
        now = self.clock()
        table = self.table.current(now)
        if table is None:
            held = self.table.table
            stale = held is not None and self.name not in held.models.get(model, {self.name: 1})
            return None, "stale_table" if stale else None
        weights = table.models.get(model)
        if not weights or (len(weights) == 1 and self.name in weights):
            return None, None
        weights = {n: w for n, w in weights.items()  # a node the table cannot reach: none
                   if n == self.name or (n in table.nodes and (table.nodes[n].grpc
                                                               or not grpc))}
        pick = self.peers.choose(model, weights, self.name, self._local_busy(model), now)
        if pick is None:
            return None, "peers_down"
        return (None, None) if pick == self.name else (pick, None)

    def _local_busy(self, model: str) -> int:
        try:
            return self.cache.entry(model).account.in_flight
        except CacheError:
            return 0

    def _answer_within(self, model: str, hard: float | None) -> tuple[float, float]:
        """(seconds to connect, seconds to answer) for a forward: the client's
        deadline when it set one (half of it at most to connect: the rest is left to
        serve here should the peer not be reached), else the model's SLO plus
        ``peer_timeout_ms``."""
        if hard is not None:
            return min(self.peer_timeout, hard / 2), hard
        try:
            slo = self.serving.runtime(self.cache.entry(model)).settings.slo
        except CacheError:
            slo = self.config.slo.latency_ms / 1000.0
        return self.peer_timeout, slo + self.peer_timeout

    # -- calls -----------------------------------------------------------------------
    def peer_for(self, call: Call) -> str | None:
        """The peer that serves ``call`` (None: this node), its mark judged first: a
        marked call is served here, or refused (``MarkRefused``, 403) when its sender
        is not a fleet node."""
        if call.mark is not None:
            self.stats.received(call.model, self.trust.sender(call.mark, self.table.table))
            return None
        return self.peer_of(call.model, grpc=call.protocol == V2_GRPC)

    def peer_of(self, model: str, *, grpc: bool = False) -> str | None:
        """The peer that serves ``model``'s next call (None: here), a fallback counted
        where the table ran it elsewhere; ``grpc``: a peer with a gRPC address."""
        if not self.enabled:
            return None
        peer, why = self.route(model, grpc=grpc)
        if why is not None:
            self.stats.fallback(model, why)
        return peer

    async def forward(self, call: Call, peer: str) -> Answer | None:
        """``peer``'s answer to ``call`` (``forward.Forwarder.forward``); None: serve it
        here."""
        table = self.table.table
        if table is None or peer not in table.nodes:  # a member's peer gone meanwhile
            if call.body is None:
                raise PeerFailed(f"node {peer!r} is no longer in the routing table")
            return None
        return await self.forwarder.forward(call, peer, table.nodes[peer])

    async def metadata(self, peer: str, model: str, version: int | None
                       ) -> dict[str, Any]:
        """``model``'s signature (``{"inputs", "outputs"}``) as ``peer`` serves it: a
        selection app checks its members without loading one that runs elsewhere.
        A failure is ``LoadFailed`` (the app cannot be checked now: 503)."""
        table = self.table.table
        path = f"/v2/models/{quote(model, safe='')}" + (
            f"/versions/{version}" if version is not None else "")
        assert self.http_client.session is not None
        try:
            if table is None or peer not in table.nodes:
                raise ValueError("no longer in the routing table")
            async with self.http_client.session.get(
                    table.nodes[peer].url + path, headers=dict(self.trust.outgoing()),
                    timeout=aiohttp.ClientTimeout(total=self.peer_timeout)) as answer:
                doc = await answer.json(loads=orjson.loads, content_type=None)
                if answer.status != 200:
                    raise ValueError(doc.get("error") if isinstance(doc, dict) else doc)
        except Exception as exc:  # noqa: BLE001 - any failure: the app waits, retried
            raise LoadFailed(f"member {model!r} on node {peer!r}: its signature could not "
                             f"be read ({exc})", retry_after=1.0) from None
        return {"inputs": doc.get("inputs") or [], "outputs": doc.get("outputs") or []}

    # -- reports and views -------------------------------------------------------------
    def interval(self) -> dict[str, dict[str, int]]:
        """Per model, what routing did since the last call (``forwarded``, ``errors``,
        ``fallbacks``, ``received``): the reporter's deltas."""
        totals = self.stats.totals()
        out = {}
        for model, now in totals.items():
            before = self._reported.get(model, {})
            delta = {k: v - before.get(k, 0) for k, v in now.items()}
            if any(delta.values()):
                out[model] = delta
        self._reported = totals
        return out

    def describe_model(self, model: str) -> dict[str, Any]:
        """``model``'s routing for ``/v1/cache``: its planned nodes and its counts."""
        table = self.table.table
        return {"planned": dict(table.models.get(model, {})) if table else {},
                **self.stats.describe(model)}

    def describe(self) -> dict[str, Any]:
        """``GET /v1/routing``: the table, its age, the peers and every model's counts."""
        now = self.clock()
        table = self.table.table
        age = self.table.age(now)
        peers = {}
        for name, address in sorted((table.nodes if table else {}).items()):
            h = self.peers.health.get(name)
            peers[name] = {
                "url": address.url, "grpc": address.grpc, "up": self.peers.up(name, now),
                "failures": h.failures if h else 0,
                "retry_in_s": round(max(h.down_until - now, 0.0), 3) if h else 0.0,
                "last_error": h.last_error if h else None,
                "outstanding": sum(n for (m, p), n in self.peers.outstanding.items()
                                   if p == name)}
        models = sorted(set(table.models if table else ()) | set(self.stats.models))
        return {"enabled": self.enabled, "node": self.name,
                "address": self.address.to_json() if self.address else None,
                "version": self.table.version,
                "age_s": None if age is None else round(age, 3),
                "max_age_s": self.table.limit_s(),
                "trusted": self.table.current(now) is not None,
                "peer_timeout_ms": self.peer_timeout * 1000.0,
                "marks_refused": self.trust.refused, "peers": peers,
                "models": {m: self.describe_model(m) for m in models},
                "http": self.http_client.describe()}


def _grpc_credentials(ca: Any, cert: Any, key: Any) -> Any:
    """gRPC channel credentials for ``https://`` peers: their CA (None: the system's)
    and this node's certificate when it has one."""
    import grpc

    def read(path: Any) -> bytes | None:
        return open(path, "rb").read() if path is not None else None

    return grpc.ssl_channel_credentials(root_certificates=read(ca),
                                        private_key=read(key), certificate_chain=read(cert))
