"""A raw HTTP/1.1 lane in front of aiohttp: the few requests a server answers thousands of
times a second (a node's lease or report) parsed and answered below aiohttp's web layer,
every other request served by aiohttp on the same connection.

``RawLane`` is one connection's protocol (``limited_site(front=...)`` puts it behind the
connection's ``Gate``, so the connection is counted and bounded as any other). It reads
requests itself and hands each complete one to ``take``, which answers it at once
(``RawAnswer``: written with aiohttp's status line and headers: ``Content-Type``,
``Content-Length``, ``Date``, ``Server``, the answer's own) or returns None. It hands the
connection over to aiohttp, with every byte read and not answered, at the first request
that

* ``take`` does not answer,
* is not a plain HTTP/1.1 request a lane may take: a request line or header aiohttp's
  parser might judge otherwise (not ASCII, obsolete folding, a repeated header), a
  ``Transfer-Encoding``, ``Content-Encoding``, ``Expect``, ``Upgrade`` or ``Connection``
  other than ``keep-alive``, a ``Content-Length`` that is not a number or past
  ``max_body``,
* has not all arrived with its head: its body comes later, or its head is past
  ``HEAD_LIMIT`` bytes without its end.

From then on aiohttp's request handler (``make_handler()``) is the connection's: its
answers (400, 401, 403, 408, 413, 429, forwarding), limits and timeouts are as without a
lane. Requests may be pipelined or split across reads; answers go out in order. A
connection waits at most ``timeout_s`` for a request's whole head after it opened or
after its last answer was written, as aiohttp's keep-alive timer does: then it is
closed (idle, or with part of a head). While the peer does not read its answers (the
transport asks to pause writing) the lane reads nothing more.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, NamedTuple

from aiohttp.http import SERVER_SOFTWARE

#: Bytes of a request head past which, without its end, aiohttp's parser judges it
#: (its longest line, 8190 bytes by default, or 400).
HEAD_LIMIT = 8190

_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (/[\x21-\x7e]*) HTTP/1\.1")
#: Header lines, each ``name:value`` ended by CRLF (a name of token characters, a value of
#: printable ASCII and tabs, its surrounding blanks not part of it).
_HEADERS = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\x20-\x7e\t]*\r\n)*")
#: Headers whose request the lane leaves to aiohttp (``connection`` unless keep-alive).
_NOT_TAKEN = frozenset({"transfer-encoding", "content-encoding", "expect", "upgrade",
                        "te", "trailer"})


class RawRequest(NamedTuple):
    """One request as read: method, target (path and query, as sent), headers (names in
    lower case; each sent once) and the whole body."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class RawAnswer(NamedTuple):
    """An answer: its status, body, content type and further headers."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


#: ``take(request, lane)``: the answer, or None to hand the connection to aiohttp.
Take = Callable[[RawRequest, "RawLane"], RawAnswer | None]


class HttpDate:
    """The ``Date`` header's value at ``clock()`` (epoch seconds), formatted once a
    second."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._second, self._value = -1, ""

    def now(self) -> str:
        second = int(self.clock())
        if second != self._second:
            self._second, self._value = second, formatdate(second, usegmt=True)
        return self._value


def render(answer: RawAnswer, date: str) -> bytes:
    """``answer`` as aiohttp writes it on the wire (HTTP/1.1, kept alive), dated
    ``date``."""
    return b"%s%d\r\nDate: %s\r\nServer: %s\r\n\r\n%s" % (
        _head(answer.status, answer.content_type, answer.headers), len(answer.body),
        date.encode("latin-1"), _SERVER, answer.body)


_SERVER = SERVER_SOFTWARE.encode("latin-1")


@functools.lru_cache(maxsize=64)
def _head(status: int, content_type: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """An answer's status line and headers up to its ``Content-Length`` value (the
    few kinds a lane answers, each made once)."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return (f"HTTP/1.1 {status} {reason}\r\n{extra}Content-Type: {content_type}\r\n"
            f"Content-Length: ").encode("latin-1")


class RawLanes:
    """The lanes of one listener: ``front`` for ``limited_site``; ``close`` when the
    server stops (before its runner's cleanup, which closes aiohttp's connections: a
    lane's connection is not aiohttp's until handed over). ``taken`` and
    ``handed_over`` count requests answered here and connections handed over."""

    def __init__(self, take: Take, *, timeout_s: float, max_body: int,
                 date: HttpDate | None = None) -> None:
        self.take, self.timeout_s, self.max_body = take, timeout_s, max_body
        self.date = date if date is not None else HttpDate()
        self.lanes: set[RawLane] = set()  # open and not handed over
        self.taken = 0
        self.handed_over = 0
        self.closed = False

    def front(self, make_handler: Callable[[], Any]) -> Callable[[], RawLane]:
        """The protocol factory of a listener whose aiohttp handlers ``make_handler``
        makes."""
        return lambda: RawLane(make_handler, self)

    def close(self) -> None:
        """Close every connection not handed over, and each new one: no request is
        answered here from now on (none is in progress: each is answered as read)."""
        self.closed = True
        for lane in list(self.lanes):
            lane.transport.close()
        self.lanes.clear()


class RawLane(asyncio.Protocol):
    """One connection: requests ``take`` answers, then (from the first it does not)
    aiohttp's handler."""

    def __init__(self, make_handler: Callable[[], Any], lanes: RawLanes) -> None:
        self._make_handler, self._lanes, self._take = make_handler, lanes, lanes.take
        self._timeout_s, self._max_body = lanes.timeout_s, lanes.max_body
        self.transport: Any = None
        #: What ``take`` keeps of this connection (its peer, once worked out).
        self.memo: Any = None
        self._inner: Any = None  # aiohttp's handler, once handed over
        self._buffer = b""
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self._lanes.closed:
            transport.close()
            return
        self._lanes.lanes.add(self)
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self._timeout_s
        self._timer = loop.call_at(self._deadline, self._expire)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        answers: list[bytes] = []
        start = self._serve(data, answers)
        if answers:
            self.transport.write(b"".join(answers) if len(answers) > 1 else answers[0])
            self._lanes.taken += len(answers)
            self._deadline = asyncio.get_running_loop().time() + self._timeout_s
        if start is None:
            return
        if start >= 0:  # the rest waits for more: part of a head
            self._buffer = data[start:]
        else:
            self._hand_over(data[-start - 1:])

    def _serve(self, data: bytes, answers: list[bytes]) -> int | None:
        """Answer the whole requests in ``data`` that may be; then None (all read), the
        offset of a partial head (to keep), or ``-1 - offset`` of the request to hand
        over."""
        start, size = 0, len(data)
        while start < size:
            if self._paused or self.transport.is_closing():
                return start  # read again once the peer takes its answers
            end = data.find(b"\r\n\r\n", start)
            if end < 0:
                return start if size - start <= HEAD_LIMIT else -1 - start
            request = _parse(data, start, end, self._max_body)
            if request is None:
                return -1 - start
            request, stop = request
            answer = self._take(request, self) if stop <= size else None
            if answer is None:
                return -1 - start
            answers.append(render(answer, self._lanes.date.now()))
            start = stop
        return None

    def _hand_over(self, rest: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._lanes.lanes.discard(self)
        self._lanes.handed_over += 1
        self._inner = self._make_handler()
        self._inner.connection_made(self.transport)
        if self._paused:  # aiohttp pauses its writes, and reads as it sees fit
            self.transport.resume_reading()
            self._inner.pause_writing()
        if rest:
            self._inner.data_received(rest)

    def _expire(self) -> None:
        self._timer = None
        if self._inner is not None or self.transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        if self._paused or self.transport.get_write_buffer_size():
            self._deadline = loop.time() + self._timeout_s  # answering: not idle
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._expire)
            return
        self.transport.close()  # idle, or part of a head: as aiohttp's keep-alive timer

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return False  # a partial request that can no longer end: close

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lanes.lanes.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._paused = True
        if self._inner is not None:
            self._inner.pause_writing()
        else:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._inner is not None:
            self._inner.resume_writing()
            return
        self.transport.resume_reading()
        if self._buffer:  # requests read before the pause
            data, self._buffer = self._buffer, b""
            self.data_received(data)


def _parse(data: bytes, start: int, end: int, max_body: int
           ) -> tuple[RawRequest, int] | None:
    """The request whose head is ``data[start:end]`` and where it ends (its body may not
    all be in ``data``), or None when the lane leaves it to aiohttp."""
    first = data.find(b"\r\n", start, end)
    if first < 0:
        first = end
    line = _REQUEST_LINE.fullmatch(data, start, first)
    if line is None or _HEADERS.fullmatch(data, first + 2, end + 2) is None:
        return None
    headers: dict[str, str] = {}
    for raw in data[first + 2:end].decode("ascii").split("\r\n") if first < end else ():
        name, _, value = raw.partition(":")
        name = name.lower()
        if name in headers or name in _NOT_TAKEN:
            return None
        headers[name] = value.strip(" \t")
    if headers.get("connection", "keep-alive").lower() != "keep-alive":
        return None
    length = headers.get("content-length", "0")
    if not length.isdigit() or len(length) > 12 or int(length) > max_body:
        return None
    stop = end + 4 + int(length)
    return RawRequest(line[1].decode("ascii"), line[2].decode("ascii"), headers,
                      data[end + 4:stop]), stop
