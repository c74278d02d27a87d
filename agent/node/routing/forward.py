"""The forward: a ``Call`` passed to the peer node chosen for it, and the peer's answer
as an ``Answer``.

A call from a client goes on as it arrived: its body's bytes (never decoded here,
never copied), the headers that frame it, its path, the mark and this node's own
credentials (never the client's); over gRPC the message as received. The peer's answer
comes back as its bytes (``Answer.relayed``), which the front end passes on without
decoding. A selection app's member call has no body: its tensors go in v2's binary
extension and the outputs come back decoded.

The peer has the client's deadline (its ``timeout`` parameter or gRPC deadline) when
there is one, else the model's SLO plus ``routing.peer_timeout_ms``, to answer, and
``peer_timeout_ms`` (half the deadline at most) to connect. Its answer is passed on
when it is a result or the request's own fault (400, 413); when it is busy (429, 503,
507) or lacks the model (404), the call is served here; when it fails (no connection,
no answer in time, 401, 403, 5xx) the call is served here and the peer is skipped with
backoff. A peer's failure never reaches the client, but a client's own deadline passing
does (503, as here). A member call has nothing to fall back on: ``PeerFailed``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable
from urllib.parse import quote

import numpy as np
import orjson

from agent.backends.base import DATATYPES, InvalidInput, datatype_of
from agent.node.admission import Shed
from agent.node.call import TF_REST, V2_GRPC, Answer, Call, Decoded, Relayed
from agent.node.routing.grpc import BUSY, PASSED, GrpcFailed, GrpcForwarder
from agent.node.routing.http import HttpForwarder, PeerFailed
from agent.node.routing.peers import PeerBook
from agent.node.routing.stats import RoutingStats
from agent.node.routing.trust import SERVE_MS, SERVED_BY, Trust
from agent.wire import PeerAddress

log = logging.getLogger("edgeagent.routing")

#: The peer's answers passed to the client as they are: results and the request's
#: own faults (serving it here would answer the same).
PASS_ON = frozenset({200, 400, 413})
#: The peer could not serve it now, or not at all: served here, the peer kept.
BUSY_STATUSES = frozenset({404, 429, 503, 507})
#: The headers of a call that travel with its body.
FRAMING = ("Content-Type", "Inference-Header-Content-Length", "X-Request-Id")


class Forwarder:
    """Forwards calls to peers over the kept-alive HTTP and gRPC clients, keeping the
    peers' health and the routing counts."""

    def __init__(self, http: HttpForwarder, grpc: GrpcForwarder, trust: Trust,
                 peers: PeerBook, stats: RoutingStats,
                 within: Callable[[str, float | None], tuple[float, float]],
                 clock: Callable[[], float]) -> None:
        """``within(model, deadline)``: (seconds to connect, seconds to answer)."""
        self.http, self.grpc, self.trust = http, grpc, trust
        self.peers, self.stats, self.within, self.clock = peers, stats, within, clock

    async def forward(self, call: Call, peer: str, address: PeerAddress
                      ) -> Answer | None:
        """``peer``'s answer to ``call``; None: serve it here (counted as a fallback).
        A call without a body (a member call) has nothing to fall back on:
        ``PeerFailed`` instead of None."""
        model, hard = call.model, call.deadline()
        connect_s, answer_s = self.within(model, hard)
        started = time.perf_counter()
        self.peers.started(model, peer)
        try:
            if call.protocol == V2_GRPC and call.body is not None:
                status, kept, data = await self._grpc(call, peer, address, answer_s)
            else:
                path, body, headers = self._http_request(call)
                status, kept, data = await self.http.post(
                    address.url + path, body, headers, connect_s=connect_s,
                    answer_s=answer_s)
        except PeerFailed as exc:
            if hard is not None and exc.late:
                self.stats.failed(model, peer)
                raise Shed(f"the request's timeout passed while node {peer!r} served "
                           f"it", "deadline") from None
            return self._failed(call, peer, str(exc))
        finally:
            self.peers.ended(model, peer)
        return self._answer(call, peer, status, kept, data, time.perf_counter() - started)

    def _http_request(self, call: Call) -> tuple[str, Any, dict[str, str]]:
        """(path, body, headers) of the HTTP forward: the call's as they came, or a
        member call's tensors as a v2 request in the binary extension."""
        headers = dict(self.trust.outgoing())
        version = "" if call.version is None else f"/versions/{call.version}"
        model = quote(call.model, safe="")
        if call.body is None:
            assert isinstance(call.inputs, Decoded), "a call without a body is decoded"
            body, length = encode_binary_request(call.inputs.tensors)
            headers.update({"Content-Type": "application/octet-stream",
                            "Inference-Header-Content-Length": str(length)})
            return f"/v2/models/{model}{version}/infer", body, headers
        given = call.headers
        for name in FRAMING:
            if name in given:
                headers[name] = given[name]
        headers.setdefault("Content-Type", "application/json")
        path = f"/v1/models/{model}{version}:predict" if call.protocol == TF_REST \
            else f"/v2/models/{model}{version}/infer"
        return path, call.body, headers

    async def _grpc(self, call: Call, peer: str, address: PeerAddress, answer_s: float
                    ) -> tuple[int, dict[str, str], bytes]:
        """The gRPC forward as (status, trailing metadata, answer): its error statuses
        as HTTP's (``INVALID_ARGUMENT`` 400 with the details as the body; busy 503;
        any other a failure: ``PeerFailed``)."""
        if not address.grpc:
            raise PeerFailed(f"node {peer!r} has no gRPC address")
        try:
            answer, trailing = await self.grpc.infer(
                address.grpc, call.body, self.trust.outgoing(), answer_s,
                tls=address.url.startswith("https://"))
        except GrpcFailed as exc:
            if exc.code in PASSED:
                return PASSED[exc.code], {}, exc.details.encode()
            if exc.code in BUSY or exc.code.name == "NOT_FOUND":
                return 503, {}, b""
            raise PeerFailed(f"answered {exc.code.name}: {exc.details}") from None
        return 200, dict(trailing), answer

    def _answer(self, call: Call, peer: str, status: int, kept: dict[str, str], data: bytes,
                round_trip: float) -> Answer | None:
        """The peer's answer to ``call`` as an ``Answer`` (a client's call: its bytes as
        they came; a member call: its outputs decoded); None: serve it here."""
        model, relays = call.model, call.body is not None
        if status not in PASS_ON and status not in BUSY_STATUSES:
            return self._failed(call, peer, f"answered {status}")
        serving = _seconds(kept.pop(SERVE_MS, None)) if status in PASS_ON else None
        self.stats.answered(model, peer, status, round_trip, serving)
        if status in BUSY_STATUSES:
            if not relays:
                raise PeerFailed(f"node {peer!r} answered {status}")
            self.stats.fallback(model, "peer_busy")
            return None
        self.peers.succeeded(peer)
        served_by = kept.pop(SERVED_BY, peer)
        if not relays or (status != 200 and call.protocol == V2_GRPC):
            if status != 200:  # the request's own fault, said as this node says it
                raise InvalidInput(f"node {peer!r}: {data[:1000].decode(errors='replace')}")
            outputs = decode_binary_answer(data, kept.get("Inference-Header-Content-Length"))
            return Answer(outputs, model, call.version, call.request_id, served_by=served_by)
        return Answer({}, model, call.version, call.request_id, served_by=served_by,
                      relayed=Relayed(status, kept, data))

    def _failed(self, call: Call, peer: str, why: str) -> None:
        """Skip ``peer`` for a while; the call is served here (a member call: missing,
        ``PeerFailed``)."""
        model, relays = call.model, call.body is not None
        skip = self.peers.failed(peer, self.clock(), why)
        self.stats.failed(model, peer)
        log.warning("routing: peer %s failed (%s); %s %s, the peer skipped for %.3g s",
                    peer, why, model, "served here" if relays else "missing", skip)
        if not relays:
            raise PeerFailed(f"node {peer!r}: {why}")
        self.stats.fallback(model, "peer_failed")
        return None

def encode_binary_request(inputs: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """(body, its JSON header's length): ``inputs`` as a v2 request in the binary
    extension, asking every output back in it."""
    header = {"inputs": [{"name": name, "datatype": datatype_of(a), "shape": list(a.shape),
                          "parameters": {"binary_data_size": a.nbytes}}
                         for name, a in inputs.items()],
              "parameters": {"binary_data_output": True}}
    head = orjson.dumps(header)
    return b"".join([head, *(np.ascontiguousarray(a).tobytes() for a in inputs.values())]), \
        len(head)


def decode_binary_answer(data: bytes, header: str | None) -> dict[str, np.ndarray]:
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
