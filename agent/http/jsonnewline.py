"""JSON answers end with a newline, as a line of text does (``curl -s`` then leaves the
shell's prompt on a line of its own): one middleware, first in an app's chain, so it
sees every answer, errors included. An answer already ending so (the inference
encoders write their newline as they encode) or streamed passes as it is.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


def ending_line(body: bytes) -> bytes:
    """A JSON answer's ``body`` ending with its newline (an empty one as it is)."""
    return body + b"\n" if body and not body.endswith(b"\n") else body


@web.middleware
async def json_newline(request: web.Request, handler: Any) -> web.StreamResponse:
    response = await handler(request)
    if type(response) is web.Response and response.content_type == "application/json":
        body = response.body
        if isinstance(body, (bytes, bytearray)):
            response.body = ending_line(bytes(body))
    return response
