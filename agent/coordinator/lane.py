"""The lane a node's report or lease takes past the middleware chain: thousands a
second, each paying for the whole chain otherwise (in a small request such as a lease,
the chain costs as much as aiohttp's whole HTTP layer).

A request may take it when its whole body has arrived (no read timeout to watch, no
body memory to hold), it is not compressed (the chain decodes that), and either its
credential may post it or none is needed and it names this server (no ``Origin``, a
``Host`` of its own: the DNS rebinding guard's rule). Any other request takes the chain,
which answers 401, 403, 408 and 429 as for every path (a refusal is counted there,
once). The coordinator and its report workers use it alike; a report worker also takes
it below aiohttp's web layer (``raw_take``, for ``agent.http.rawlane``): the same rule,
the same answers and errors, any other request left to aiohttp on the same connection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent.errors import AgentError, error_response, json_error
from agent.http.jsonnewline import ending_line
from agent.http.rawlane import RawAnswer, RawLane, RawRequest, Take
from agent.security.httpauth import (Guard, Need, Peer, certificate_issued, certificate_name,
                                     names_this_server, request_peer)

#: A report's or lease's target as the raw lane takes it (a name aiohttp's router would
#: decode or normalise, a query: left to aiohttp).
LANE_TARGET = re.compile(r"/v1/nodes/([^/%?#.][^/%?#]*)/(report|lease)")


def takes_lane(request: web.Request, guard: Guard, names: frozenset[str], need: Need,
               forward_key: str | None = None) -> bool:
    """Whether ``request`` (a report or lease needing ``need``) may skip the chain:
    ``guard`` judges its credential, ``names`` are this server's (``own_names``)."""
    if not request.content.is_eof() or "Content-Encoding" in request.headers:
        return False
    headers = request.headers
    return lane_allows(guard, names, need, request_peer(request, forward_key,
                                                        certificates=True),
                       headers.get("Authorization", ""), headers.get("Host"),
                       "Origin" in headers)


def lane_allows(guard: Guard, names: frozenset[str], need: Need, peer: Peer,
                authorization: str, host: str | None, origin: bool) -> bool:
    """The lane's rule for a whole, uncompressed request from ``peer`` with these
    ``Authorization`` and ``Host`` headers (``origin``: it has an ``Origin``)."""
    if not guard.checks(peer.name):
        return not origin and names_this_server(host, names)
    if guard.holds_back(authorization, peer.address, peer.name):
        return False  # a throttled peer's token is not judged: the chain answers 429
    return guard.judge(authorization, need, peer.name, peer.issued).status == 200


def transport_peer(transport: Any) -> Peer:
    """A connection's peer as ``request_peer`` names a request's (with certificates)."""
    address = transport.get_extra_info("peername")
    remote = str(address[0]) if isinstance(address, (list, tuple)) and address else None
    return Peer(remote or "unknown", certificate_name(transport),
                certificate_issued(transport))


def raw_take(guard: Guard, names: Callable[[], frozenset[str]],
             answer: Callable[[str, str, bytes], bytes | None],
             log: logging.Logger) -> Take:
    """A raw lane's ``take`` for ``POST`` reports and leases that may take the lane:
    ``answer(kind, node, body)`` ("report" or "lease") gives the JSON answer, raises an
    ``AgentError`` (answered as the chain's error middleware answers it) or returns
    None (the request is left to aiohttp)."""

    def take(request: RawRequest, lane: RawLane) -> RawAnswer | None:
        target = LANE_TARGET.fullmatch(request.target) if request.method == "POST" else None
        if target is None:
            return None
        peer = lane.memo
        if peer is None:
            peer = lane.memo = transport_peer(lane.transport)
        headers = request.headers
        if not lane_allows(guard, names(), Need("report", target[1]), peer,
                           headers.get("authorization", ""), headers.get("host"),
                           "origin" in headers):
            return None
        try:
            body = answer(target[2], target[1], request.body)
        except AgentError as exc:
            if exc.public:
                log.warning("POST %s: %s", request.target, exc)
            return _raw_response(error_response(exc))
        except Exception:  # noqa: BLE001 - answered, as the chain answers a bug
            log.exception("unhandled error on POST %s", request.target)
            return _raw_response(json_error(500, "internal error (logged)"))
        if body is None:
            return None
        return RawAnswer(200, ending_line(body))

    return take


def _raw_response(response: web.Response) -> RawAnswer:
    """An error answer as the chain writes it (``json_newline``'s newline included)."""
    return RawAnswer(response.status, ending_line(bytes(response.body)),
                     response.headers["Content-Type"],
                     tuple((k, v) for k, v in response.headers.items()
                           if k != "Content-Type"))


def lane_metrics_lines(prefix: str, taken: int, handed_over: int) -> list[str]:
    """Prometheus text: the requests the raw lane answered and the connections it handed
    to aiohttp (whatever it does not answer: other paths, compressed or chunked bodies,
    a credential the chain must judge), summed over the processes."""
    return [f"# HELP {prefix}_raw_lane_answered_total Reports and leases answered on the "
            "raw lane, below aiohttp.", f"# TYPE {prefix}_raw_lane_answered_total counter",
            f"{prefix}_raw_lane_answered_total {taken}",
            f"# HELP {prefix}_raw_lane_handed_over_total Connections the raw lane handed "
            "to aiohttp, with what it had read.",
            f"# TYPE {prefix}_raw_lane_handed_over_total counter",
            f"{prefix}_raw_lane_handed_over_total {handed_over}"]
