"""The lane a node's report or lease takes past the middleware chain: thousands a
second, each paying for the whole chain otherwise (in a small request such as a lease,
the chain costs as much as aiohttp's whole HTTP layer).

A request may take it when its whole body has arrived (no read timeout to watch, no
body memory to hold), it is not compressed (the chain decodes that), and either its
credential may post it or none is needed and it names this server (no ``Origin``, a
``Host`` of its own: the DNS rebinding guard's rule). Any other request takes the chain,
which answers 401, 403, 408 and 429 as for every path (a refusal is counted there,
once). The coordinator and its report workers use it alike.
"""

from __future__ import annotations

from aiohttp import web

from agent.security.httpauth import Guard, Need, names_this_server, request_peer


def takes_lane(request: web.Request, guard: Guard, names: frozenset[str], need: Need,
               forward_key: str | None = None) -> bool:
    """Whether ``request`` (a report or lease needing ``need``) may skip the chain:
    ``guard`` judges its credential, ``names`` are this server's (``own_names``)."""
    if not request.content.is_eof() or "Content-Encoding" in request.headers:
        return False
    peer = request_peer(request, forward_key, certificates=True)
    if not guard.checks(peer.name):
        return "Origin" not in request.headers and names_this_server(
            request.headers.get("Host"), names)
    header = request.headers.get("Authorization", "")
    if guard.holds_back(header, peer.address, peer.name):
        return False  # a throttled peer's token is not judged: the chain answers 429
    return guard.judge(header, need, peer.name, peer.issued).status == 200
