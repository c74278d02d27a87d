"""Reading a request's body: within ``read_timeout_s`` of its headers (a client that
sends half a body does not hold a connection), a large one a piece at a time into one
growing buffer (``body_timeout_middleware``; handlers take it from ``request_body``),
counted against a bound on the bytes of bodies in flight (``BodyMemory``)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from aiohttp import web

from agent.errors import AgentError, json_error

BODY = web.RequestKey("body", bytearray)  # a body the middleware read in place


class NoRoomForBody(AgentError):
    """The bodies in flight kept a request waiting past its time: a 503."""

    status = 503
    retry_after = 1.0


#: What a body of unknown length (chunked) waits for before it is read, and counts in
#: steps of while it streams.
CHUNKED_STEP = 2**20


class BodyMemory:
    """The bytes of request bodies in flight, bounded by ``limit_bytes``: a body takes
    its Content-Length from before it is read until its answer is written. One that
    does not fit waits, in arrival order, for earlier ones to finish; one larger than
    the whole limit is let in when nothing else is in flight (it is within the request
    size limit, so it can be served). A body of unknown length (chunked) waits for its
    first ``CHUNKED_STEP`` bytes the same way, then is counted while it streams
    (``grow``): a piece that does not fit refuses it at once (503) rather than wait, as
    bodies half read and waiting for each other would never finish."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.in_flight_bytes = 0
        self.peak_bytes = 0
        self.waits = 0  # bodies that waited for room
        self.refused = 0  # bodies that waited past their time (503)
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def _fits(self, size: int) -> bool:
        return self.in_flight_bytes == 0 or self.in_flight_bytes + size <= self.limit_bytes

    def grow(self, held: int, size: int) -> bool:
        """Count ``size`` more bytes for a body that holds ``held`` bytes already, if
        they fit now (or nothing else is in flight); False, counting nothing, if not."""
        if self.in_flight_bytes != held and self.in_flight_bytes + size > self.limit_bytes:
            return False
        self.take(size)
        return True

    def take(self, size: int) -> None:
        """Count ``size`` bytes now, whatever is in flight."""
        self.in_flight_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.in_flight_bytes)

    async def reserve(self, size: int, timeout: float) -> None:
        """Count ``size`` bytes once they fit (after the bodies already waiting);
        ``NoRoomForBody`` after ``timeout`` seconds."""
        if not self._waiting and self._fits(size):
            self.take(size)
            return
        self.waits += 1
        turn = asyncio.get_running_loop().create_future()
        item = (size, turn)
        self._waiting.append(item)
        try:
            async with asyncio.timeout(timeout):
                await turn
        except BaseException as exc:  # the time ran out, or the client went away
            if turn.done() and not turn.cancelled():  # let in just then: give it back
                self.release(size)
            elif item in self._waiting:
                self._waiting.remove(item)
                self.release(0)  # those behind it may fit now
            if isinstance(exc, TimeoutError):
                self.refused += 1
                raise NoRoomForBody(
                    f"no memory for the request's body of {size} bytes within {timeout:g} "
                    f"s: {self.in_flight_bytes} bytes of bodies are in flight, the limit "
                    f"is {self.limit_bytes} (max_request_bytes_in_flight)") from None
            raise

    def release(self, size: int) -> None:
        """``size`` bytes are no longer in flight; let in the waiting bodies that fit."""
        self.in_flight_bytes -= size
        while self._waiting and self._fits(self._waiting[0][0]):
            size_next, turn = self._waiting.popleft()
            if not turn.done():  # else its request went away, and takes itself out
                self.take(size_next)
                turn.set_result(True)

    def describe(self) -> dict[str, int]:
        return {"in_flight_bytes": self.in_flight_bytes, "limit_bytes": self.limit_bytes,
                "peak_bytes": self.peak_bytes, "waiting": len(self._waiting),
                "waits": self.waits, "refused": self.refused}


def body_timeout_middleware(seconds: float, max_bytes: int | None = None,
                            in_place_bytes: int = 2**20, memory: BodyMemory | None = None
                            ) -> Any:
    """An aiohttp middleware that reads each request's body within ``seconds`` of its
    headers, else answers 408 and closes the connection. A body over the app's
    ``client_max_size`` raises aiohttp's 413 here, as it would in ``request.read()``.
    With ``memory``, the body is counted there until the handler is done (its answer
    written), after waiting up to ``seconds`` for room (then ``NoRoomForBody``, 503).

    Without ``max_bytes`` (the app's ``client_max_size``), ``request.read()`` reads the
    body, and the handler's ``request.read()`` returns it again. With it, a body whose
    Content-Length is over ``in_place_bytes`` (and within ``max_bytes``) is read a piece
    at a time into one growing buffer, which the handler takes from ``request_body``
    (aiohttp's ``read()`` copies its buffer into a new bytes object at the end, holding
    the event loop for the whole copy)."""
    async def read(request: web.Request, counted: list[int]) -> None:
        length = request.content_length
        if length is None and memory is not None and max_bytes is not None:
            request[BODY] = await read_chunked(request, max_bytes, counted)
            return
        if max_bytes is None or length is None or not in_place_bytes < length <= max_bytes:
            await request.read()
            return
        body = bytearray()  # grown piece by piece: no body-sized zeros written up front
        async for piece in request.content.iter_any():  # aiohttp stops at the length
            body += piece
        if len(body) != length:
            raise web.HTTPBadRequest(
                text=f"the body ended after {len(body)} of its {length} bytes")
        request[BODY] = body

    async def read_chunked(request: web.Request, largest: int, counted: list[int]
                           ) -> bytearray:
        """A body of unknown length, counted in ``memory`` (``counted[0]`` bytes so
        far) a step ahead of what has arrived."""
        assert memory is not None
        body = bytearray()
        async for piece in request.content.iter_any():
            if len(body) + len(piece) > largest:
                raise web.HTTPRequestEntityTooLarge(max_size=largest,
                                                    actual_size=len(body) + len(piece))
            body += piece
            if len(body) > counted[0]:
                step = max(len(body) - counted[0], min(CHUNKED_STEP, largest - counted[0]))
                if not memory.grow(counted[0], step):
                    memory.refused += 1
                    raise NoRoomForBody(
                        f"no memory for the rest of a chunked body after {len(body)} bytes: "
                        f"{memory.in_flight_bytes} bytes of bodies are in flight, the limit "
                        f"is {memory.limit_bytes} (max_request_bytes_in_flight)")
                counted[0] += step
        return body

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.body_exists:
            return await handler(request)
        counted = [0]  # the bytes counted in memory for this body, released at its end
        length = request.content_length
        if memory is not None and length is not None and (max_bytes is None
                                                          or length <= max_bytes):
            await memory.reserve(length, seconds)
            counted[0] = length
        elif memory is not None and length is None and max_bytes is not None:  # chunked
            first = min(CHUNKED_STEP, max_bytes)
            await memory.reserve(first, seconds)
            counted[0] = first
        try:
            try:
                async with asyncio.timeout(seconds):
                    await read(request, counted)
            except TimeoutError:
                response = json_error(408, f"request body not received within {seconds:g} s "
                                           "of its headers (read_timeout_s)")
                response.force_close()
                return response
            if memory is not None and not counted[0]:  # chunked, no size limit: once read
                counted[0] = len(await request_body(request))
                memory.take(counted[0])
            return await handler(request)
        finally:
            if counted[0]:
                memory.release(counted[0])

    return read_body_in_time


async def request_body(request: Any) -> bytes | bytearray:
    """The request's body: the buffer ``body_timeout_middleware`` read it into, or
    ``request.read()``."""
    body = request.get(BODY)
    return body if body is not None else await request.read()
