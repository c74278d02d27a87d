"""Reading a request's body: within ``read_timeout_s`` of its headers (a client that
sends half a body does not hold a connection), a piece at a time into one growing
buffer (``body_timeout_middleware``; handlers take it from ``request_body``), decoded
here from its ``Content-Encoding`` (gzip, deflate) in bounded steps (aiohttp's own
decoding is off: ``agent.http.eventloop.handler_args``), each piece counted as it arrives,
decoded, against the size limit and the bytes of bodies in flight (``BodyMemory``)."""

from __future__ import annotations

import asyncio
import collections
import zlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from agent.http.connections import Busy
from agent.errors import AgentError, json_error

BODY: web.RequestKey[bytes | bytearray] = web.RequestKey("body")  # read by the middleware


class NoRoomForBody(AgentError):
    """The bodies in flight kept a request waiting past its time: a 503."""

    status = 503
    retry_after = 1.0


class BadBody(AgentError):
    """A body that cannot be decoded, or ends before its length: a 400."""

    status = 400


#: What a body is counted ahead of what has arrived: as much again as it has, at least
#: ``STEP_MIN`` and at most ``STEP_MAX`` (fewer counts for a large body; a trickle holds
#: little more than it sent).
STEP_MIN = 2**16
STEP_MAX = 2**20

#: The most a compressed body inflates by in one step before the bytes are counted.
DECODE_STEP = 2**16


class Body:
    """One body being read, as ``BodyMemory`` counts it: at most ``claim`` bytes (its
    Content-Length, or the size limit when its decoded size is not announced)."""

    __slots__ = ("claim", "counted", "reading", "waiting")

    def __init__(self, claim: int) -> None:
        self.claim = claim
        self.counted = 0
        self.reading = True
        self.waiting = False


class BodyMemory:
    """The bytes of request bodies in flight, bounded by ``limit_bytes``.

    A body's bytes are counted as they arrive (decoded), a step ahead
    (``STEP_MIN``..``STEP_MAX``), never what it only announces: a client that announces
    a large body and sends nothing holds nothing. Its bytes stay counted until its
    answer is written (``close``). A piece is counted at once when it fits and keeps every body
    being read able to finish; otherwise its body waits (its connection unread) until
    it does, or until the body's deadline (then ``NoRoomForBody``, 503).

    "Able to finish" is the banker's rule over the bodies still arriving, each needing
    up to its ``claim`` (capped at the limit) less what it holds: the pieces that are
    counted leave an order in which every such body gets its rest once those before it
    are answered (bodies read whole and other reservations are answered without
    waiting for anyone). So bodies half read never wait for each other: the one
    nearest its end always has room coming, and two large bodies arriving together are
    read one after the other instead of both stopping halfway. A body that fits alone
    always may grow (one larger than the whole limit is read when nothing else is in
    flight: it is within the size limit, so it can be served).

    What a peer holds is what it sent, plus at most one claim: a silent peer's claim
    waits last in that order and blocks no one; a trickle holds its own bytes until
    its deadline.

    ``reserve_aside`` is for room that must be promised before any byte arrives (a
    gRPC message, received whole by grpcio): such promises wait in their own queue,
    never ahead of bodies, and take at most the share of the limit they are given."""

    def __init__(self, limit_bytes: int, step_min: int = STEP_MIN,
                 step_max: int = STEP_MAX) -> None:
        self.limit_bytes = limit_bytes
        self.step_min, self.step_max = step_min, step_max
        self.in_flight_bytes = 0
        self.peak_bytes = 0
        self.aside_bytes = 0  # promised by ``reserve_aside``
        self.waits = 0  # pieces that waited for room
        self.refused = 0  # bodies that waited past their time (503)
        self._reading: set[Body] = set()
        self._claims = 0  # the reading bodies' claims (capped), in all
        self._waiting: collections.deque[tuple[Body, int, asyncio.Future]] = \
            collections.deque()
        self._aside: collections.deque[tuple[int, int, asyncio.Future]] = \
            collections.deque()

    # -- bodies --------------------------------------------------------------------------

    def open(self, claim: int) -> Body:
        """A body about to be read, of at most ``claim`` bytes; nothing counted yet."""
        body = Body(claim)
        self._reading.add(body)
        self._claims += min(claim, self.limit_bytes)
        return body

    def count(self, body: Body, arrived: int) -> bool:
        """``body`` has ``arrived`` bytes: count them (and a step ahead where that
        fits) if they fit now; False, counting nothing, if they must wait (``room``)."""
        if arrived <= body.counted:
            return True
        ahead = min(body.claim, arrived + min(self.step_max, max(self.step_min, arrived)))
        for target in (max(ahead, arrived), arrived):
            if self._allowed(body, target - body.counted):
                self._grow(body, target - body.counted)
                return True
        return False

    async def room(self, body: Body, arrived: int) -> None:
        """Wait until ``body``'s ``arrived`` bytes fit, then count them (the caller
        bounds the wait: ``body.waiting`` says it was waiting)."""
        self.waits += 1
        turn = asyncio.get_running_loop().create_future()
        item = (body, arrived - body.counted, turn)
        self._waiting.append(item)
        body.waiting = True
        try:
            await turn
        finally:
            body.waiting = False
            if not turn.done():
                self._waiting.remove(item)

    def finish(self, body: Body, size: int) -> None:
        """``body`` has arrived whole, ``size`` bytes: it holds them (not the step
        ahead) until ``close``, and needs nothing more."""
        if body.reading:
            body.reading = False
            self._reading.discard(body)
            self._claims -= min(body.claim, self.limit_bytes)
        if size < body.counted:
            self.in_flight_bytes -= body.counted - size
            body.counted = size
        self._wake()

    def close(self, body: Body) -> None:
        """``body``'s answer is written (or it is given up): its bytes are free."""
        self.finish(body, 0)

    def _grow(self, body: Body, size: int) -> None:
        body.counted += size
        self.take(size)

    def _allowed(self, body: Body, size: int) -> bool:
        others = self.in_flight_bytes - body.counted
        if others and self.in_flight_bytes + size > self.limit_bytes:
            return False
        return self._claims <= self.limit_bytes or self._safe(body, size)

    def _safe(self, body: Body, size: int) -> bool:
        """Whether, with ``size`` more bytes counted for ``body``, every body still
        arriving can get the rest of its claim in some order (the banker's rule)."""
        limit = self.limit_bytes
        needs = []
        held = 0
        for b in self._reading:
            counted = b.counted + size if b is body else b.counted
            needs.append((max(0, min(b.claim, limit) - counted), counted))
            held += counted
        needs.sort()
        for need, counted in needs:
            if need + held > limit:
                return False
            held -= counted
        return True

    # -- room promised ahead ---------------------------------------------------------

    async def reserve_aside(self, size: int, share: int) -> None:
        """Count ``size`` bytes promised before they arrive, once they fit within the
        limit and ``share`` (all such promises together), after the promises already
        waiting; bodies never wait behind it. The caller bounds the wait."""
        if not self._aside and self._aside_fits(size, share):
            self._take_aside(size)
            return
        self.waits += 1
        turn = asyncio.get_running_loop().create_future()
        item = (size, share, turn)
        self._aside.append(item)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # let in just then: give it back
                self.release_aside(size)
            elif item in self._aside:
                self._aside.remove(item)
                self._wake()  # those behind it may fit now
            raise

    def release_aside(self, size: int, keep: int = 0) -> None:
        """``size`` promised bytes are no longer promised; ``keep`` of them (what
        arrived) stay counted in flight until ``release``d."""
        self.aside_bytes -= size
        self.release(size - keep)

    def _aside_fits(self, size: int, share: int) -> bool:
        return (self.in_flight_bytes + size <= self.limit_bytes
                and self.aside_bytes + size <= share)

    def _take_aside(self, size: int) -> None:
        self.aside_bytes += size
        self.take(size)

    # -- counting --------------------------------------------------------------------

    def take(self, size: int) -> None:
        """Count ``size`` bytes now, whatever is in flight."""
        self.in_flight_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.in_flight_bytes)

    def release(self, size: int) -> None:
        """``size`` bytes are no longer in flight."""
        self.in_flight_bytes -= size
        self._wake()

    def _wake(self) -> None:
        """Let in the waiting pieces that are allowed now (in the order they came),
        then the promises that fit."""
        if not self._waiting and not self._aside:
            return
        for item in list(self._waiting):
            body, size, turn = item
            if turn.done():
                continue
            if self._allowed(body, size):
                self._waiting.remove(item)
                self._grow(body, size)
                turn.set_result(True)
        while self._aside and self._aside_fits(*self._aside[0][:2]):
            size, _, turn = self._aside.popleft()
            if not turn.done():  # else its call went away, and takes itself out
                self._take_aside(size)
                turn.set_result(True)

    def describe(self) -> dict[str, int]:
        return {"in_flight_bytes": self.in_flight_bytes, "limit_bytes": self.limit_bytes,
                "peak_bytes": self.peak_bytes, "reading": len(self._reading),
                "waiting": len(self._waiting) + len(self._aside),
                "waits": self.waits, "refused": self.refused}


# -- Content-Encoding --------------------------------------------------------------------------


class UnsupportedEncoding(AgentError):
    """A ``Content-Encoding`` this server does not decode: 415."""

    status = 415


class _Inflate:
    """gzip (members one after another) or deflate (zlib-wrapped, or raw as some
    clients send it), ``DECODE_STEP`` bytes out at a time."""

    def __init__(self, gzip: bool) -> None:
        self.gzip = gzip
        self._decoder: Any = None
        self._ended = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._decoder is None:
                if self._ended and not self.gzip:
                    raise BadBody("bytes after the end of the deflate stream")
                wbits = 16 + zlib.MAX_WBITS if self.gzip else (
                    zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS)
                self._decoder = zlib.decompressobj(wbits)
                self._ended = False
            try:
                out = self._decoder.decompress(data, DECODE_STEP)
            except zlib.error as exc:
                raise BadBody(f"the body is not valid {self.name}: {exc}") from None
            data = self._decoder.unconsumed_tail
            if out:
                yield out
            if self._decoder.eof:
                data = self._decoder.unused_data + data
                self._decoder, self._ended = None, True

    @property
    def name(self) -> str:
        return "gzip" if self.gzip else "deflate"

    def end(self) -> None:
        if self._decoder is not None or not self._ended:
            raise BadBody(f"the body's {self.name} stream ends early")


def body_decoder(encoding: str | None) -> _Inflate | None:
    """The decoder of a ``Content-Encoding`` (None: none to undo); 415 for another.
    Not br or zstd: their decoders keep a window of the stream's choosing (megabytes)
    beside the bytes counted."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return None
    if name in ("gzip", "x-gzip"):
        return _Inflate(gzip=True)
    if name == "deflate":
        return _Inflate(gzip=False)
    raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported: send the "
                              "body as it is, or as gzip or deflate")


# -- the middleware ----------------------------------------------------------------------------


class BodyTooLarge(Exception):
    """A body passed the size limit while it was read (answered 413)."""


def body_timeout_middleware(seconds: float, max_bytes: int,
                            memory: BodyMemory | None = None) -> Any:
    """An aiohttp middleware that reads each request's body within ``seconds`` of its
    headers, else answers 408 and closes the connection. The body is read a piece at a
    time into one buffer (the first piece kept as it came), decoded from its
    ``Content-Encoding`` ``DECODE_STEP`` bytes at a time; one over ``max_bytes``
    (decoded; ``max_request_size``) is refused with 413 as soon as it passes it, and
    its connection closed; an encoding not decoded here gets 415. With
    ``memory``, each piece is counted there as it arrives until the handler is done
    (its answer written); a body kept waiting for room past ``seconds`` gets
    ``NoRoomForBody`` (503). While the request runs its connection is busy
    (``agent.http.connections.Busy``)."""
    async def read(request: web.Request, body: Body | None, decoder: Any) -> bytes | bytearray:
        length = request.content_length
        data: bytes | bytearray = b""
        total = steps = 0
        async for raw in request.content.iter_any():
            for piece in (decoder.pieces(raw) if decoder is not None else (raw,)):
                total += len(piece)
                if total > max_bytes:
                    raise BodyTooLarge()
                if body is not None and not memory.count(body, total):
                    await memory.room(body, total)
                if not data:
                    data = piece
                else:
                    if isinstance(data, bytes):
                        data = bytearray(data)
                    data += piece
                steps += 1
                if decoder is not None and steps % 16 == 0:
                    await asyncio.sleep(0)  # a large body inflates in turns with others
        if decoder is not None:
            decoder.end()
        elif length is not None and total != length:
            raise BadBody(f"the body ended after {total} of its {length} bytes")
        return data

    def too_large(decoded: bool) -> web.Response:
        response = json_error(413, f"request body over the limit of {max_bytes} bytes"
                                   f"{' once decoded' if decoded else ''} (max_request_size)")
        response.force_close()
        return response

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Any) -> web.StreamResponse:
        with Busy(request.transport):
            if not request.body_exists:
                return await handler(request)
            try:
                decoder = body_decoder(request.headers.get("Content-Encoding"))
            except UnsupportedEncoding as exc:
                response = json_error(415, str(exc))
                response.force_close()
                return response
            length = request.content_length
            if decoder is None and length is not None and length > max_bytes:
                return too_large(False)
            body = None
            if memory is not None:
                body = memory.open(length if decoder is None and length is not None
                                   else max_bytes)
            try:
                try:
                    content = request.content
                    if decoder is None and length is not None and content.is_eof() \
                            and content.total_bytes == length \
                            and (body is None or memory.count(body, length)):
                        request[BODY] = content.read_nowait()  # here whole: no wait
                    else:
                        async with asyncio.timeout(seconds):
                            request[BODY] = await read(request, body, decoder)
                except TimeoutError:
                    if body is not None and body.waiting:
                        memory.refused += 1
                        raise NoRoomForBody(
                            f"no memory for the request's body within {seconds:g} s: "
                            f"{memory.in_flight_bytes} bytes of bodies are in flight, the "
                            f"limit is {memory.limit_bytes} (max_request_bytes_in_flight)"
                        ) from None
                    response = json_error(408, f"request body not received within "
                                               f"{seconds:g} s of its headers (read_timeout_s)")
                    response.force_close()
                    return response
                except BodyTooLarge:
                    return too_large(decoder is not None)
                if body is not None:
                    memory.finish(body, len(request[BODY]))
                return await handler(request)
            finally:
                if body is not None:
                    memory.close(body)

    return read_body_in_time


async def request_body(request: Any) -> bytes | bytearray:
    """The request's body: the buffer ``body_timeout_middleware`` read it into, or
    ``request.read()``."""
    body = request.get(BODY)
    return body if body is not None else await request.read()
