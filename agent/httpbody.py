"""Reading a request's body: within ``read_timeout_s`` of its headers (a client that
sends half a body does not hold a connection), and a large one into one buffer a piece
at a time (``body_timeout_middleware``); handlers take it from ``request_body``."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agent.errors import json_error

BODY = web.RequestKey("body", bytearray)  # a body the middleware read in place


def body_timeout_middleware(seconds: float, max_bytes: int | None = None,
                            in_place_bytes: int = 2**20) -> Any:
    """An aiohttp middleware that reads each request's body within ``seconds`` of its
    headers, else answers 408 and closes the connection. A body over the app's
    ``client_max_size`` raises aiohttp's 413 here, as it would in ``request.read()``.

    Without ``max_bytes`` (the app's ``client_max_size``), ``request.read()`` reads the
    body, and the handler's ``request.read()`` returns it again. With it, a body whose
    Content-Length is over ``in_place_bytes`` (and within ``max_bytes``) is read a piece
    at a time into one buffer of that length (aiohttp's ``read()`` collects the pieces
    and then copies them all at once, holding the event loop ~0.1 s for 30 MB); the
    handler must then take the body from ``request_body``."""
    async def read(request: web.Request) -> None:
        length = request.content_length
        if max_bytes is None or length is None or not in_place_bytes < length <= max_bytes:
            await request.read()
            return
        body = bytearray(length)
        view, got = memoryview(body), 0
        async for piece in request.content.iter_any():  # aiohttp stops at the length
            view[got:got + len(piece)] = piece
            got += len(piece)
        if got != length:
            raise web.HTTPBadRequest(text=f"the body ended after {got} of its {length} bytes")
        request[BODY] = body

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.body_exists:
            try:
                async with asyncio.timeout(seconds):
                    await read(request)
            except TimeoutError:
                response = json_error(408, f"request body not received within {seconds:g} s "
                                           "of its headers (read_timeout_s)")
                response.force_close()
                return response
        return await handler(request)

    return read_body_in_time


async def request_body(request: Any) -> bytes | bytearray:
    """The request's body: the buffer ``body_timeout_middleware`` read it into, or
    ``request.read()``."""
    body = request.get(BODY)
    return body if body is not None else await request.read()
