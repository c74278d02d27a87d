"""Open connections as a resource: a server process holds at most ``total`` of them, and
at most ``per_peer`` from one address, counted at accept (before the open-file limit
can refuse the next one) and during a TLS handshake, which has a deadline of its own.

A connection past either bound closes the oldest idle connection of the same group
(the peer's, or all) and takes its place; when every one is busy, it is closed at
once. Idle: its TLS handshake not done, or its handler waiting for the next request
(a request head arriving a byte at a time is idle); busy: a request read or answered
(``Busy``, which ``agent.http.body``'s middleware holds while its request runs, and the
answer's bytes not yet written). So a stranger's connections cannot keep a new
client out, and the busy ones of other clients are never cut.

``limited_site`` serves an aiohttp runner through ``Gate``, a protocol that counts its
connection in ``Connections`` and hands the bytes to aiohttp's own; with TLS it makes
the handshake itself (``loop.start_tls``), so a connection that never starts one can
be closed like any other idle one. Defaults follow the open-file limit
(``connection_limits``)."""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

log = logging.getLogger("edgeagent.connections")


class ConnectionLimits(NamedTuple):
    total: int
    per_peer: int


def open_files_limit() -> int:
    """This process's soft limit on open files (RLIMIT_NOFILE)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def connection_limits(total: int | None = None, per_peer: int | None = None,
                      open_files: int | None = None) -> ConnectionLimits:
    """The bounds, each given or derived from the open-file limit: ``total`` a quarter
    of it (as much again for gRPC's listener on an agent, the other half for model
    files, outgoing connections, the store), ``per_peer`` a quarter of ``total``."""
    if total is None:
        total = max(16, (open_files or open_files_limit()) // 4)
    if per_peer is None:
        per_peer = max(4, total // 4)
    return ConnectionLimits(total, min(per_peer, total))


def server_connections(config: Any) -> Connections:
    """The ``Connections`` of a server whose ``config`` (an agent's or a coordinator's)
    has ``max_connections``, ``max_connections_per_peer`` and ``read_timeout_s`` (the
    TLS handshake's deadline)."""
    return Connections(connection_limits(config.max_connections,
                                         config.max_connections_per_peer),
                       config.read_timeout_s)


def peer_address(transport: Any) -> str:
    """The address a connection comes from (an IPv4 address mapped into IPv6 as
    itself)."""
    peer = transport.get_extra_info("peername")
    address = peer[0] if isinstance(peer, (tuple, list)) and peer else str(peer)
    return address.removeprefix("::ffff:")


class Connections:
    """The connections one server process holds, in the order they were accepted."""

    def __init__(self, limits: ConnectionLimits, handshake_timeout: float) -> None:
        self.limits = limits
        self.handshake_timeout = handshake_timeout
        # in accept order; an OrderedDict finds its first entry at once (a dict whose
        # first entries were deleted walks past their slots)
        self._open: OrderedDict[Gate, None] = OrderedDict()
        self._peers: dict[str, OrderedDict[Gate, None]] = {}
        self.closed_idle = 0  # idle connections closed for a newer one
        self.refused = 0  # connections closed at accept: every other was busy
        self.peak = 0

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, gate: Gate) -> bool:
        """Count ``gate``'s new connection, closing an idle one for it where a bound is
        reached; False (nothing counted) when every connection in the way is busy."""
        peer = self._peers.get(gate.peer, OrderedDict())
        if len(peer) >= self.limits.per_peer and not self._close_oldest_idle(peer):
            return self._refuse(gate, "per_peer")
        if len(self._open) >= self.limits.total and not self._close_oldest_idle(self._open):
            return self._refuse(gate, "total")
        self._open[gate] = None
        self._peers.setdefault(gate.peer, OrderedDict())[gate] = None
        self.peak = max(self.peak, len(self._open))
        return True

    def _refuse(self, gate: Gate, bound: str) -> bool:
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            log.warning("connection from %s refused: every connection is busy at the bound "
                        "of %d (max_connections%s); %d refused so far", gate.peer,
                        getattr(self.limits, bound), "" if bound == "total" else "_per_peer",
                        self.refused)
        return False

    def _close_oldest_idle(self, group: OrderedDict[Gate, None]) -> bool:
        for gate in group:
            if gate.idle:
                self.forget(gate)
                gate.abort()
                self.closed_idle += 1
                return True
        return False

    def forget(self, gate: Gate) -> None:
        """``gate``'s connection is gone (or going): no longer counted."""
        if gate not in self._open:
            return
        del self._open[gate]
        peer = self._peers[gate.peer]
        del peer[gate]
        if not peer:
            del self._peers[gate.peer]

    def abort_handshakes(self) -> None:
        """Close the connections still in their TLS handshake (the server stops)."""
        for gate in [g for g in self._open if g.handshaking]:
            self.forget(gate)
            gate.abort()

    def describe(self) -> dict[str, int]:
        return {"open": len(self._open), "peak": self.peak, "max": self.limits.total,
                "max_per_peer": self.limits.per_peer, "peers": len(self._peers),
                "closed_idle": self.closed_idle, "refused": self.refused}


class Gate(asyncio.Protocol):
    """One accepted connection: counted in ``connections``, then (after its TLS
    handshake, if ``ssl_context``) served by the protocol ``make_protocol`` returns,
    which gets every call a protocol gets."""

    def __init__(self, connections: Connections, make_protocol: Callable[[], Any],
                 ssl_context: Any = None) -> None:
        self.connections = connections
        self._make_protocol = make_protocol
        self._ssl_context = ssl_context
        self.raw: Any = None  # the TCP transport
        self.transport: Any = None  # what the protocol writes to (TLS's, or the raw one)
        self.inner: Any = None
        self.peer = ""
        self.busy = 0  # requests being served (``Busy``)
        self._tls_started = False  # the TLS protocol reads the TCP transport
        self._raw_early: list[bytes] = []  # bytes read before it did
        self._early: list[bytes] = []  # bytes decrypted before the protocol was made
        self._early_eof = False
        self._handshake: asyncio.Task | None = None

    @property
    def handshaking(self) -> bool:
        return self.inner is None

    @property
    def idle(self) -> bool:
        if self.inner is None:
            return True
        return not self.busy and not self.transport.get_write_buffer_size()

    def abort(self) -> None:
        self.raw.abort()

    def connection_made(self, transport: Any) -> None:
        self.raw = transport
        self.peer = peer_address(transport)
        if not self.connections.admit(self):
            transport.abort()
            return
        if self._ssl_context is None:
            self._serve(transport)
            return
        # asyncio reads nothing before the TLS layer takes over; uvloop starts reading
        # once this returns, and what it reads first is handed to that layer
        transport.pause_reading()
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls())

    async def _start_tls(self) -> None:
        loop = asyncio.get_running_loop()
        handshake = loop.create_task(loop.start_tls(
            self.raw, self, self._ssl_context, server_side=True,
            ssl_handshake_timeout=self.connections.handshake_timeout))
        await asyncio.sleep(0)  # its first step (before this one resumes) took the transport
        self._tls_started = True
        if self._raw_early:
            # after the TLS protocol's connection_made, which start_tls scheduled
            loop.call_soon(_feed, self.raw, b"".join(self._raw_early))
            self._raw_early = []
        try:
            transport = await handshake
        except Exception as exc:  # noqa: BLE001 - late, refused or broken: close it
            log.debug("TLS handshake from %s failed: %s", self.peer, exc)
            self.connections.forget(self)
            self.raw.abort()
            return
        if transport is None or transport.is_closing():
            self.connections.forget(self)
            return
        self._serve(transport)

    def _serve(self, transport: Any) -> None:
        self.transport = transport
        self.inner = self._make_protocol()
        self.inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.inner.data_received(data)
        if self._early_eof and not self.inner.eof_received():
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        elif self._tls_started:  # decrypted before ``_start_tls`` resumed
            self._early.append(data)
        else:  # read before the TLS protocol took the transport over
            self._raw_early.append(data)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        if not self._tls_started:  # gone before its handshake began
            return False
        self._early_eof = True
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.connections.forget(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


def _feed(transport: Any, data: bytes) -> None:
    """Hand ``data`` to the (buffered) protocol reading ``transport``, as if just read."""
    protocol = transport.get_protocol()
    view = memoryview(data)
    try:
        while view and not transport.is_closing():
            buffer = protocol.get_buffer(len(view))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            protocol.buffer_updated(size)
            view = view[size:]
    except Exception:  # noqa: BLE001 - a broken handshake: the connection goes
        transport.abort()


class Busy:
    """``with Busy(transport):`` the connection of ``transport`` is busy while the block
    runs: not closed for a newer one (a transport ``LimitedSite`` did not accept:
    nothing)."""

    __slots__ = ("gate",)

    def __init__(self, transport: Any) -> None:
        protocol = transport.get_protocol() if transport is not None else None
        self.gate = protocol if isinstance(protocol, Gate) else None

    def __enter__(self) -> None:
        if self.gate is not None:
            self.gate.busy += 1

    def __exit__(self, *exc: Any) -> None:
        if self.gate is not None:
            self.gate.busy -= 1


def limited_site(runner: Any, host: str, port: int, connections: Connections, *,
                 ssl_context: Any = None, backlog: int = 128,
                 reuse_port: bool = False,
                 front: Callable[[Any], Callable[[], Any]] | None = None) -> Any:
    """An aiohttp site for ``runner`` on ``host:port`` whose connections go through
    ``Gate``s counted in ``connections`` (with TLS when ``ssl_context``). ``front``:
    given aiohttp's protocol factory, the factory of the protocol that serves each
    connection instead (``agent.http.rawlane``)."""
    from aiohttp import web

    class LimitedSite(web.BaseSite):
        @property
        def name(self) -> str:
            return f"{'https' if ssl_context else 'http'}://{host}:{port}"

        async def start(self) -> None:
            await super().start()
            server = front(runner.server) if front is not None else runner.server
            self._server = await asyncio.get_running_loop().create_server(
                lambda: Gate(connections, server, ssl_context), host, port,
                backlog=backlog, reuse_port=reuse_port or None)

        async def stop(self) -> None:
            await super().stop()
            connections.abort_handshakes()

    return LimitedSite(runner, backlog=backlog)
