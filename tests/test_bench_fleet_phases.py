"""``bench/coordinator_scale.py``'s simulated nodes keep their random phases (issue 36):
a fleet whose first answers came in one burst (a warm-up's herd of TLS handshakes held
them) still reports spread over the interval in the measured window, not in the burst's
instant every interval after, which queued leases at an idle coordinator and was read
as TLS latency. The bench's own clients (``SimulatedNode``, ``Simulation``) against a
real loopback server, plain and TLS (certificates made here), that holds its answers
until the burst and then answers at once (a stand-in for the coordinator, which cannot
be made to hold its answers until one instant; it answers as the coordinator does)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from agent.http.eventloop import run_event_loop
from bench.coordinator_scale import (Simulation, SimulatedNode, busiest_share,
                                     lease_request, tls_context)
from tests.helpers import issue_cert, make_ca

NODES = 60
INTERVAL = 1.0
BURST_AT = 1.2  # s after the start: every answer held until then comes at once
WINDOW = (2.0, 4.0)  # the measured window, s after the start


class HoldingServer(asyncio.Protocol):
    """Answers a lease probe (``{}``) with ``{"report":true}`` and anything else with
    an answer version, as the coordinator does; an answer due before ``release`` (loop
    time) is written then, all in one burst."""

    def __init__(self, release: float) -> None:
        self.release = release
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            body, self.buf = rest[:length], rest[length:]
            answer = b'{"report":true}\n' if body == b"{}" else b'{"answer":1}\n'
            message = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" \
                b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
            loop = asyncio.get_running_loop()
            loop.call_at(max(loop.time(), self.release), self.write, message)

    def write(self, message: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(message)


class RecordingNode(SimulatedNode):
    """A simulated node that keeps the due time of every message it sends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fired: list[float] = []

    def fire(self) -> None:
        self.fired.append(self.due)
        super().fire()


def _server_context(directory: Path) -> tuple[ssl.SSLContext, str]:
    ca = make_ca(directory)
    leaf = issue_cert(ca, directory, "coordinator")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(leaf.cert_file, leaf.key_file)
    return server, str(ca.cert_file)


async def _fleet(tls: bool, directory: Path) -> tuple[Simulation, list[RecordingNode]]:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    server_ctx, ca_file = _server_context(directory) if tls else (None, None)
    server = await loop.create_server(lambda: HoldingServer(start + BURST_AT),
                                      "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    sim = Simulation(loop, port, tls_context(ca_file), INTERVAL,
                     (start + WINDOW[0], start + WINDOW[1]), False, start=start)
    request = lease_request(0, 1)  # (the body is not the point here)
    nodes = [RecordingNode(sim, i, request, (i + 0.5) / NODES) for i in range(NODES)]
    for node in nodes:
        loop.call_at(node.due, node.fire)
    await asyncio.sleep(start + WINDOW[1] + 0.5 - loop.time())
    for node in nodes:
        if node.transport is not None:
            node.transport.close()
    server.close()
    await server.wait_closed()
    return sim, nodes


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_nodes_answered_in_one_burst_keep_their_phases(tls, tmp_path):
    # on uvloop, as the bench: its clock counts whole milliseconds, so an answer can
    # come "before" the due time of the message it answers
    sim, nodes = run_event_loop(_fleet(tls, tmp_path))
    lo, hi = sim.measure
    assert sim.stats["broken"] == sim.stats["other"] == 0, sim.stats["statuses"]
    assert sim.stats["leases"] > 0  # they renewed leases after their full reports
    phases = []
    for node in nodes:
        in_window = [due for due in node.fired if lo <= due < hi]
        # one message a slot, each on the node's own phase
        assert len(in_window) == round((hi - lo) / INTERVAL), (node.i, node.fired)
        for due in in_window:
            slots = (due - sim.start) / INTERVAL - node.phase
            assert abs(slots - round(slots)) < 1e-6, (node.i, due)
        phases.append((in_window[0] - lo) % INTERVAL)
    assert sim.stats["offered"] == sim.stats["ok"] == NODES * round((hi - lo) / INTERVAL)
    # spread as drawn (one node every 1/60 s): the burst put all 60 in one slice, and
    # in one millisecond
    most, uniform = busiest_share(phases, INTERVAL, 0.1)
    assert uniform == NODES * 0.1 / INTERVAL
    assert most <= 2 * uniform, phases
    assert busiest_share(phases, INTERVAL, 0.001)[0] <= 2, phases
