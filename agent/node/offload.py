"""Decoding and encoding off the event loop (``Decoder``): inline, on a thread, or in a
child process, by the size of what is read or written.

The child is called over a socket pair, with every large buffer (a request body, an
array, an encoded answer) sent out of band of the pickle: the kernel copies it while
the sending and the receiving thread have let go of the GIL, so the agent's event loop
never waits for a copy of tens of megabytes (a ``ProcessPoolExecutor`` pickles them
whole and rebuilds them whole, holding the GIL throughout).
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from agent.errors import AgentError

T = TypeVar("T")

OUT_OF_BAND_BYTES = 64 * 2**10  # bytes and bytearrays from here on travel out of band
_HEAD = struct.Struct("!QI")  # the pickle's length, the number of buffers


class DecoderLost(AgentError):
    """The decoding child process died mid-request (killed, out of memory): a 503; the
    next large request starts a new one."""

    status = 503
    retry_after = 1.0


class ChildGone(Exception):
    """The other end of the socket closed."""


def forget_frames(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it without their tracebacks: those hold the
    frames that raised them, and with them the request's body and what it decoded to.
    A traceback kept in a reference cycle (an error held by a frame it passed
    through, or by the future that carried it across a thread) is freed only by the
    garbage collector, which a serving process runs rarely (``agent.http.eventloop.settle_gc``)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    return exc


def detached(exc: BaseException) -> BaseException:
    """A fresh copy of ``exc`` (its type, arguments and attributes) with no traceback
    and nothing chained, to raise in its place; ``exc`` itself forgets its frames
    (``forget_frames``)."""
    forget_frames(exc)
    try:
        fresh = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an error that cannot be copied is raised as it is
        return exc
    fresh.__cause__ = fresh.__context__ = None
    return fresh


def _out_of_band(value: Any) -> Any:
    """``value`` with its large bytes-like parts (at the top, or in a top-level tuple)
    marked to travel out of band; numpy arrays do so by themselves."""
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) >= OUT_OF_BAND_BYTES:
        return pickle.PickleBuffer(value)
    if isinstance(value, tuple):
        return tuple(_out_of_band(v) for v in value)
    return value


def send(sock: socket.socket, value: Any) -> None:
    """Write ``value``: a header, its pickle, then each out-of-band buffer as is."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(_out_of_band(value), protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    sizes = struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
    sock.sendall(_HEAD.pack(len(data), len(views)) + sizes + data)
    for view in views:
        sock.sendall(view)


def _read_into(sock: socket.socket, buffer: Any) -> Any:
    view, got = memoryview(buffer), 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ChildGone("the socket closed")
        got += n
    return buffer


def _fresh(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes, not zeroed first (``bytearray(size)`` would
    write ``size`` zeros holding the GIL; these pages are first touched by the kernel's
    copy into them)."""
    return memoryview(np.empty(size, np.uint8))


def receive(sock: socket.socket) -> Any:
    """The next value ``send`` wrote; its buffers arrive as writable memoryviews (numpy
    arrays on them), or read-only ones for a read-only original. ChildGone when the
    other end closed."""
    length, count = _HEAD.unpack(_read_into(sock, bytearray(_HEAD.size)))
    sizes = struct.unpack(f"!{count}Q", _read_into(sock, bytearray(8 * count)))
    data = _read_into(sock, bytearray(length))
    buffers = [_read_into(sock, _fresh(size)) for size in sizes]
    return pickle.loads(data, buffers=buffers)


def _child_main(sock: socket.socket) -> None:
    """The child: call what comes, answer ("ok", result) or ("error", exception), until
    the agent closes its end."""
    while True:
        try:
            fn, args = receive(sock)
        except (ChildGone, ConnectionError):
            return
        # a body arrives as a memoryview: the codecs want bytes (a copy, in the child)
        args = tuple(bytes(a) if isinstance(a, memoryview) else a for a in args)
        try:
            answer: tuple = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, who raises it
            answer = ("error", forget_frames(exc))
        try:
            send(sock, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            send(sock, ("error", RuntimeError(f"{type(answer[1]).__name__}: {exc}")))
        # nothing of this call may outlive it: the body goes before the next one arrives
        fn = args = answer = None  # type: ignore[assignment]


class _Child:
    """One child process ("spawn": the agent has threads) and the agent's end of its
    socket; ``call`` blocks (run it on a thread), one call at a time."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.process = multiprocessing.get_context("spawn").Process(
            target=_child_main, args=(theirs,), daemon=True, name="edgeagent-decoder")
        self.process.start()
        theirs.close()

    def call(self, fn: Callable[..., T], args: tuple) -> T:
        try:
            send(self.sock, (fn, args))
            status, value = receive(self.sock)
        except (ChildGone, ConnectionError):
            raise DecoderLost("the process decoding large requests died; retry") from None
        if status == "error":
            try:
                raise value
            finally:  # else this frame (holding the body) and the error hold each other
                value = args = None
        return value

    def close(self) -> None:
        self.sock.close()  # the child sees the end of its input and exits
        self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2)


class Decoder:
    """Runs a decode (or an encode) where it does not stall the event loop, by the size
    of what it reads: here up to ``thread_bytes`` (a hop costs more than a small
    decode), on a thread up to ``process_bytes``, above that in a child process. The
    JSON parse and numpy's reading of nested lists hold the GIL throughout (for as long
    as the body is large), so on a thread they would still stall every other
    request; in the child they do not, and the parse's millions of Python objects
    never enter the agent's memory: only the body goes there and the arrays come back,
    both out of band (module docstring). One child, started on first use, decodes one
    large body at a time; one that died answers ``DecoderLost`` (503) and the next
    large request starts a new one. ``fn`` must be a module-level function (it is
    pickled by name)."""

    def __init__(self, thread_bytes: int = 256 * 2**10, process_bytes: int = 4 * 2**20
                 ) -> None:
        self.thread_bytes, self.process_bytes = thread_bytes, process_bytes
        self._child: _Child | None = None
        self._turn = asyncio.Lock()

    async def run(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, where ``size`` (bytes read or written) says. Its error is raised
        as a fresh copy (``detached``): the original's traceback holds ``args`` (the
        body), and the future that carried it from a thread holds that traceback in a
        cycle the garbage collector alone would free."""
        error: BaseException | None = None
        try:
            return await self._run(size, fn, args)
        except Exception as exc:  # noqa: BLE001 - raised again below, detached
            error = detached(exc)
        args = ()
        try:
            raise error
        finally:
            error = None

    async def _run(self, size: int, fn: Callable[..., T], args: tuple) -> T:
        if size <= self.thread_bytes:
            return fn(*args)
        if size <= self.process_bytes:
            return await asyncio.to_thread(fn, *args)
        async with self._turn:
            if self._child is None:
                self._child = await asyncio.to_thread(_Child)
            child = self._child
            try:
                return await asyncio.to_thread(child.call, fn, args)
            except DecoderLost:
                self._child = None
                await asyncio.to_thread(child.close)
                raise

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None
