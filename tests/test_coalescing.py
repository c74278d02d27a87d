"""The coalescing selector's contract (agent.http.coalescing): no sleep while idle, the
rest of the interval slept after a poll that found work, never a sleep before a poll
that would not wait, a timer's deadline kept, 0 disables; and an asyncio loop on it
serving real sockets. Real epoll (the default selector) on a socket pair; the clock
and sleep are injected."""

from __future__ import annotations

import asyncio
import selectors
import socket

import pytest

from agent.http.coalescing import CoalescingSelector, coalescing_loop_factory


class FakeTime:
    """A monotonic clock that only ``sleep`` (and ``advance``) moves; sleeps recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def selector(interval_s: float, t: FakeTime, sock: socket.socket) -> CoalescingSelector:
    sel = CoalescingSelector(interval_s, clock=t.clock, sleep=t.sleep)
    sel.register(sock, selectors.EVENT_READ)
    return sel


def after_work(interval_s: float, pair) -> tuple[CoalescingSelector, FakeTime]:
    """A selector on ``pair[0]`` whose last poll found it readable (the data still
    there), at the fake clock's 100.000."""
    a, b = pair
    t = FakeTime()
    sel = selector(interval_s, t, a)
    b.send(b"x")
    assert len(sel.select(None)) == 1
    return sel, t


def test_idle_polls_never_sleep(pair):
    a, b = pair
    t = FakeTime()
    sel = selector(0.005, t, a)
    assert sel.select(0.001) == []  # nothing ready: the real epoll waited 1 ms
    assert sel.select(0.001) == []
    b.send(b"x")  # the first readiness after idling is taken at once
    assert len(sel.select(None)) == 1
    assert t.sleeps == []
    sel.close()


def test_after_work_the_rest_of_the_interval_is_slept(pair):
    a, _ = pair
    sel, t = after_work(0.005, pair)
    t.advance(0.001)  # the loop ran its callbacks for 1 ms
    assert len(sel.select(None)) == 1  # still readable: polled after the rest
    assert t.sleeps == [0.004]
    a.recv(10)
    t.advance(0.0065)  # callbacks took longer than the interval: no sleep
    assert sel.select(0.01) == []
    assert t.sleeps == [0.004]
    assert sel.select(0.001) == []  # that poll found nothing: idle, no sleep
    assert t.sleeps == [0.004]
    sel.close()


def test_a_poll_that_would_not_wait_never_sleeps(pair):
    sel, t = after_work(0.005, pair)
    assert len(sel.select(0)) == 1  # the loop has callbacks ready: polled at once
    assert t.sleeps == []
    sel.close()


def test_a_timer_due_sooner_cuts_the_sleep_short(pair):
    sel, t = after_work(0.005, pair)
    pair[0].recv(10)
    assert sel.select(0.002) == []  # a timer due in 2 ms: slept 2 ms, then polled at once
    assert t.sleeps == [0.002]
    sel.close()


def test_zero_disables(pair):
    sel, t = after_work(0.0, pair)
    for _ in range(3):
        assert len(sel.select(None)) == 1
    assert t.sleeps == []
    sel.close()


def test_a_loop_on_it_answers_many_connections_in_few_polls():
    """An echo server on the coalescing loop: 50 clients, each of whose messages is
    answered; the selector polls (wakes) fewer times than it got messages."""
    polls = []

    class Counting(CoalescingSelector):
        def select(self, timeout=None):
            ready = super().select(timeout)
            if ready:
                polls.append(len(ready))
            return ready

    async def main() -> list[bytes]:
        async def echo(reader, writer):
            while data := await reader.read(100):
                writer.write(data)
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(50)]
        polls.clear()
        answers = []
        for round_ in range(3):
            for i, (_, w) in enumerate(conns):
                w.write(b"%d.%d;" % (round_, i))
            for i, (r, _) in enumerate(conns):
                answers.append(await r.readexactly(len(b"%d.%d;" % (round_, i))))
        for _, w in conns:
            w.close()
        server.close()
        return answers

    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(
            Counting(0.005))) as runner:
        answers = runner.run(main())
    assert answers == [b"%d.%d;" % (r, i) for r in range(3) for i in range(50)]
    # the server's 150 reads and the clients' 150 in far fewer wakes than one each
    assert sum(polls) >= 300 and len(polls) < 150


def test_loop_factory_makes_a_selector_loop_with_the_interval():
    loop = coalescing_loop_factory(0.002)()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert isinstance(loop._selector, CoalescingSelector)
        assert loop._selector.interval_s == 0.002
    finally:
        loop.close()
