"""A report worker's forward: a request it does not answer itself goes to its coordinator
as it came, over the coordinator's Unix socket, with the real peer address and
certificate name and issue time in headers the coordinator trusts only with the forward
key it gave the worker (``agent.security.httpauth.FORWARD_KEY``); the answer comes back
as it is, less the hop-by-hop headers (RFC 9110 §7.6.1)."""

from __future__ import annotations

import asyncio

from aiohttp import ClientError, ClientSession, web

from agent.errors import json_error
from agent.http.body import request_body
from agent.security.httpauth import (FORWARD_KEY, FORWARDED_ISSUED, FORWARDED_NAME,
                                     FORWARDED_PEER, certificate_issued, certificate_name)

#: Hop-by-hop and framing headers, which a forwarder sets itself.
HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                 "upgrade", "proxy-authorization", "proxy-authenticate", "host",
                 "content-length", "content-encoding", "date", "server",
                 FORWARD_KEY.lower(), FORWARDED_PEER.lower(), FORWARDED_NAME.lower(),
                 FORWARDED_ISSUED.lower()})


async def forward(request: web.Request, session: ClientSession, forward_key: str
                  ) -> web.StreamResponse:
    """``request`` to the coordinator over ``session`` (its Unix socket) with
    ``forward_key`` and the peer's address and certificate, and its answer back; 503
    with ``Retry-After`` while it does not answer."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    headers[FORWARD_KEY] = forward_key
    headers[FORWARDED_PEER] = request.remote or "unknown"
    name = certificate_name(request.transport)
    if name:
        headers[FORWARDED_NAME] = name
        issued = certificate_issued(request.transport)
        if issued is not None:
            headers[FORWARDED_ISSUED] = repr(issued)
    try:
        async with session.request(
                request.method, request.rel_url, headers=headers,
                data=bytes(await request_body(request)) if request.body_exists else None,
                allow_redirects=False) as answer:
            body = await answer.read()
            return web.Response(status=answer.status, body=body, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in HOP})
    except (ClientError, asyncio.TimeoutError) as exc:
        return json_error(503, f"the coordinator behind this report worker does not "
                          f"answer ({type(exc).__name__}); try again", {"Retry-After": "1"})
