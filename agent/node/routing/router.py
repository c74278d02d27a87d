"""The router: where each inference request is served, and the forward when it is
another node.

Every front end makes one call before it decodes a request (``http`` for KServe v2
and TF Serving REST, ``grpc`` for KServe v2 gRPC); ``None`` means "serve it here".
The rules, in order:

1. A request marked as forwarded (``trust.MARK``) is served here, never forwarded
   again (at most one hop), if its sender is a fleet node (``trust.Trust.sender``;
   else 403).
2. With routing off, no table, or a table older than its limit (``table.HeldTable``):
   served here (the last a *fallback* when that table ran the model elsewhere).
3. A model the table gives no node is served here; otherwise one of its nodes is
   chosen by the plan's replicas, fewest outstanding first (``peers.PeerBook``), this
   node included when it runs the model (its share takes no hop).
4. The chosen peer gets the request as it arrived (the body's bytes, the client's
   request id and parameters inside it), with the mark and this node's own
   credentials; never the client's. It has the client's deadline (its ``timeout``
   parameter or gRPC deadline) when there is one, else the model's SLO plus
   ``routing.peer_timeout_ms``, to answer, and ``peer_timeout_ms`` to connect.
5. Its answer is passed on when it is a result or the request's own fault (400, 413);
   when it is busy (429, 503, 507) or lacks the model (404), the request is served
   here; when it fails (no connection, no answer in time, 401, 403, 5xx) the request
   is served here and the peer is skipped with backoff. A peer's failure never
   reaches the client, but a client's own deadline passing does (503, as here).

Every answer names the node that served it (``edgeagent-served-by``, a header or gRPC
trailing metadata).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson
from aiohttp import web

from agent.backends.base import DATATYPES, InvalidInput, datatype_of
from agent.security.credentials import read_token
from agent.security.httpauth import Guard
from agent.node.admission import Shed
from agent.node.cache import CacheError, LoadFailed
from agent.node.routes import send_body
from agent.node.routing.grpc import BUSY, PASSED, GrpcFailed, GrpcForwarder
from agent.node.routing.http import HttpForwarder, PeerFailed
from agent.node.routing.peers import PeerBook
from agent.node.routing.stats import RoutingStats
from agent.node.routing.table import HeldTable
from agent.node.routing.trust import MARK, SERVE_MS, SERVED_BY, Trust
from agent.node.call import MAX_TIMEOUT_US
from agent.security.tls import client_context
from agent.wire import PeerAddress

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from agent.node.cache import ModelCache
    from agent.node.serving import Serving

log = logging.getLogger("edgeagent.routing")

#: A v2 JSON body up to this size is read for its ``timeout`` parameter (the client's
#: deadline); a larger one is passed on unread (its deadline is the peer's to keep).
READ_DEADLINE_BYTES = 64 * 1024
#: The peer's answers passed to the client as they are: results and the request's
#: own faults (serving it here would answer the same).
PASS_ON = frozenset({200, 400, 413})
#: The peer could not serve it now, or not at all: served here, the peer kept.
BUSY_STATUSES = frozenset({404, 429, 503, 507})
#: Where a request a peer forwarded here keeps its arrival (its serving time is said).
ARRIVED = web.RequestKey("arrived", float)


def client_timeout(body: bytes | bytearray, header_length: int | None) -> float | None:
    """The client's ``timeout`` parameter (seconds) of a v2 body, read only when its
    JSON is small (``READ_DEADLINE_BYTES``); None when absent, unread or malformed
    (the serving node then answers the body's fault)."""
    head = body if header_length is None else body[:header_length]
    if len(head) > READ_DEADLINE_BYTES:
        return None
    try:
        params = orjson.loads(head).get("parameters") or {}
        raw = params.get("timeout")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) \
            or not 0 < raw <= MAX_TIMEOUT_US:
        return None
    return raw / 1e6


def _grpc_timeout(request: Any) -> float | None:
    """The ``timeout`` request parameter (microseconds) of a ``ModelInferRequest``."""
    param = request.parameters.get("timeout") if "timeout" in request.parameters else None
    if param is None or param.WhichOneof("parameter_choice") not in ("int64_param",
                                                                     "uint64_param",
                                                                     "double_param"):
        return None
    raw = getattr(param, param.WhichOneof("parameter_choice"))
    return raw / 1e6 if 0 < raw <= MAX_TIMEOUT_US else None


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

    def _failed(self, model: str, peer: str, why: str) -> None:
        skip = self.peers.failed(peer, self.clock(), why)
        self.stats.failed(model, peer)
        self.stats.fallback(model, "peer_failed")
        log.warning("routing: peer %s failed (%s); %s served here, the peer skipped for "
                    "%.3g s", peer, why, model, skip)

    # -- HTTP --------------------------------------------------------------------------
    async def http(self, request: "web.Request", name: str, body: bytes | bytearray
                   ) -> "web.StreamResponse | None":
        """The answer of the peer that served this KServe v2 or TF Serving REST
        request for ``name`` (its ``body`` as read); None: serve it here."""
        if MARK in request.headers:
            self.stats.received(name, self.trust.http_sender(request, self.table.table))
            request[ARRIVED] = time.perf_counter()
            return None
        if not self.enabled:
            return None
        peer, why = self.route(name)
        if why is not None:
            self.stats.fallback(name, why)
        if peer is None:
            return None
        header = request.headers.get("Inference-Header-Content-Length")
        hard = None
        if not request.path.endswith(":predict"):  # TF Serving REST has no timeout
            try:
                hard = client_timeout(body, int(header) if header is not None else None)
            except ValueError:
                return None  # a malformed header: served here, which says so
        return await self._forward_http(request, name, body, peer, header, hard)

    async def _forward_http(self, request: "web.Request", name: str,
                            body: bytes | bytearray, peer: str, header: str | None,
                            hard: float | None) -> "web.StreamResponse | None":
        table = self.table.table
        assert table is not None
        headers = dict(self.trust.outgoing())
        headers["Content-Type"] = request.headers.get("Content-Type", "application/json")
        if header is not None:
            headers["Inference-Header-Content-Length"] = header
        if "X-Request-Id" in request.headers:
            headers["X-Request-Id"] = request.headers["X-Request-Id"]
        connect_s, answer_s = self._answer_within(name, hard)
        started = time.perf_counter()
        self.peers.started(name, peer)
        try:
            status, kept, data = await self.http_client.post(
                table.nodes[peer].url + request.raw_path,
                body if isinstance(body, bytes) else bytes(body), headers,
                connect_s=connect_s, answer_s=answer_s)
        except PeerFailed as exc:
            if hard is not None and exc.timed_out and time.perf_counter() - started >= hard:
                self.stats.failed(name, peer)
                raise Shed(f"the request's timeout passed while node {peer!r} served "
                           f"it", "deadline") from None
            self._failed(name, peer, str(exc))
            return None
        finally:
            self.peers.ended(name, peer)
        if status in PASS_ON:
            self.peers.succeeded(peer)
            serving = kept.pop(SERVE_MS, None)
            self.stats.answered(name, peer, status, time.perf_counter() - started,
                                _seconds(serving))
            kept.setdefault(SERVED_BY, peer)
            if status == 200:
                content_type = kept.pop("Content-Type", "application/json").split(";")[0]
                return await send_body(request, data, content_type, kept)
            return web.Response(status=status, body=data, headers=kept)
        if status in BUSY_STATUSES:
            self.stats.answered(name, peer, status, time.perf_counter() - started, None)
            self.stats.fallback(name, "peer_busy")
            return None
        self._failed(name, peer, f"answered {status}")
        return None

    def served_http(self, request: "web.Request", response: "web.StreamResponse") -> None:
        """Name this node on an inference answer it served (a forwarded one names its
        peer already), with its serving time when a peer forwarded the request."""
        if SERVED_BY not in response.headers:
            response.headers[SERVED_BY] = self.name
        arrived = request.get(ARRIVED)
        if arrived is not None:
            response.headers[SERVE_MS] = f"{(time.perf_counter() - arrived) * 1000:.3f}"

    # -- gRPC --------------------------------------------------------------------------
    async def grpc(self, context: Any, name: str, message: bytes, request: Any
                   ) -> bytes | None:
        """The answer (a serialized ``ModelInferResponse``) of the peer that served this
        ``ModelInfer`` call for ``name`` (``message`` as received, ``request`` parsed
        from it); None: serve it here. Either way the answer's trailing metadata names
        the node that served it."""
        metadata = dict(context.invocation_metadata() or ())
        mark = metadata.get(MARK)
        context.set_trailing_metadata(((SERVED_BY, self.name),))
        if mark is not None:
            self.stats.received(name, self.trust.grpc_sender(context, mark, metadata,
                                                             self.table.table))
            return None
        if not self.enabled:
            return None
        peer, why = self.route(name, grpc=True)
        if why is not None:
            self.stats.fallback(name, why)
        if peer is None:
            return None
        table = self.table.table
        assert table is not None
        hard = _grpc_timeout(request)
        remaining = context.time_remaining()
        if remaining is not None and (hard is None or remaining < hard):
            hard = max(remaining, 1e-6)
        _, answer_s = self._answer_within(name, hard)
        out = self.trust.outgoing()
        started = time.perf_counter()
        self.peers.started(name, peer)
        try:
            answer, trailing = await self.grpc_client.infer(
                table.nodes[peer].grpc, message, out, answer_s,
                tls=table.nodes[peer].url.startswith("https://"))
        except PeerFailed as exc:
            if hard is not None and exc.timed_out:
                self.stats.failed(name, peer)
                raise Shed(f"the request's timeout passed while node {peer!r} served "
                           f"it", "deadline") from None
            self._failed(name, peer, str(exc))
            return None
        except GrpcFailed as exc:
            if exc.code in PASSED:
                self.peers.succeeded(peer)
                self.stats.answered(name, peer, PASSED[exc.code],
                                    time.perf_counter() - started, None)
                raise InvalidInput(f"node {peer!r}: {exc.details}") from None
            if exc.code in BUSY or exc.code.name == "NOT_FOUND":
                self.stats.answered(name, peer, 503, time.perf_counter() - started, None)
                self.stats.fallback(name, "peer_busy")
                return None
            self._failed(name, peer, f"answered {exc.code.name}: {exc.details}")
            return None
        finally:
            self.peers.ended(name, peer)
        self.peers.succeeded(peer)
        said = dict(trailing)
        self.stats.answered(name, peer, 200, time.perf_counter() - started,
                            _seconds(said.get(SERVE_MS)))
        context.set_trailing_metadata(((SERVED_BY, said.get(SERVED_BY, peer)),))
        return answer

    # -- selection apps' members ------------------------------------------------------
    def member_peer(self, model: str) -> str | None:
        """The peer a selection app's call of member ``model`` goes to (None: here);
        a member planned elsewhere counts as available to the app."""
        if not self.enabled:
            return None
        peer, why = self.route(model)
        if why is not None:
            self.stats.fallback(model, why)
        return peer

    async def member_metadata(self, peer: str, model: str, version: int | None
                              ) -> dict[str, Any]:
        """A member's signature (``{"inputs", "outputs"}``) as ``peer`` serves it: a
        selection app checks its members without loading one that runs elsewhere.
        A failure is ``CacheError`` (the app cannot be checked now: 503)."""
        table = self.table.table
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        assert self.http_client.session is not None
        try:
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

    async def member(self, peer: str, model: str, version: int | None,
                     inputs: dict[str, np.ndarray], output: str, timeout: float
                     ) -> tuple[None, dict[str, np.ndarray]]:
        """A selection app's member call served by ``peer``: ``inputs`` sent in the
        binary extension of v2, ``output`` asked back in it; (None, outputs) as
        ``Serving.infer`` answers (no local entry). A failure raises: the app counts
        the member missing and answers with the others."""
        table = self.table.table
        if table is None or peer not in table.nodes:
            raise PeerFailed(f"node {peer!r} is no longer in the routing table")
        body, header = encode_member_request(inputs, output)
        headers = dict(self.trust.outgoing())
        headers.update({"Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(header)})
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        started = time.perf_counter()
        self.peers.started(model, peer)
        try:
            status, kept, data = await self.http_client.post(
                table.nodes[peer].url + path, body, headers,
                connect_s=min(self.peer_timeout, timeout / 2), answer_s=max(timeout, 1e-3))
        except PeerFailed as exc:
            if not exc.timed_out:
                self.peers.failed(peer, self.clock(), str(exc))
            self.stats.failed(model, peer)
            raise
        finally:
            self.peers.ended(model, peer)
        self.stats.answered(model, peer, status, time.perf_counter() - started,
                            _seconds(kept.get(SERVE_MS)))
        if status != 200:
            raise PeerFailed(f"node {peer!r} answered {status}: {data[:200]!r}")
        self.peers.succeeded(peer)
        return None, decode_member_answer(data, kept.get("Inference-Header-Content-Length"))

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


def encode_member_request(inputs: dict[str, np.ndarray], output: str
                          ) -> tuple[bytes, int]:
    """(body, its JSON header's length): ``inputs`` as a v2 request in the binary
    extension, asking ``output`` back in it."""
    header = {"inputs": [{"name": name, "datatype": datatype_of(a), "shape": list(a.shape),
                          "parameters": {"binary_data_size": a.nbytes}}
                         for name, a in inputs.items()],
              "outputs": [{"name": output, "parameters": {"binary_data": True}}]}
    head = orjson.dumps(header)
    return b"".join([head, *(np.ascontiguousarray(a).tobytes() for a in inputs.values())]), \
        len(head)


def decode_member_answer(data: bytes, header: str | None) -> dict[str, np.ndarray]:
    """The outputs of a v2 answer (binary extension or JSON)."""
    length = int(header) if header else len(data)
    doc = orjson.loads(data[:length])
    out, at = {}, length
    for item in doc.get("outputs") or ():
        dtype = DATATYPES[item["datatype"]]
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[item["name"]] = np.frombuffer(data[at:at + size], dtype).reshape(item["shape"])
            at += size
        else:
            out[item["name"]] = np.asarray(item["data"], dtype).reshape(item["shape"])
    return out


def _seconds(ms: str | None) -> float | None:
    try:
        return float(ms) / 1000.0 if ms is not None else None
    except ValueError:
        return None


def _grpc_credentials(ca: Any, cert: Any, key: Any) -> Any:
    """gRPC channel credentials for ``https://`` peers: their CA (None: the system's)
    and this node's certificate when it has one."""
    import grpc

    def read(path: Any) -> bytes | None:
        return open(path, "rb").read() if path is not None else None

    return grpc.ssl_channel_credentials(root_certificates=read(ca),
                                        private_key=read(key), certificate_chain=read(cert))
