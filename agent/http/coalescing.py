"""Wakes batched in time: an event loop's selector that, once a poll has found work, does
not poll again before ``interval_s`` has passed since that poll returned, so one wake
handles every connection that became ready meanwhile.

A server answering thousands of small requests a second from as many idle connections
is woken once per request (``epoll_wait`` returns one ready connection at a time), and
pays each wake's cost again (the loop's iteration, cold caches). ``CoalescingSelector``
sleeps the rest of the interval before a poll that would wait (never before one that
would not: the loop has callbacks ready), so under load the loop polls at most once per
interval and finds many connections ready at a time. An idle loop (its last poll found
nothing) polls at once, with the loop's own timeout: no wake-ups of its own. A timer
due within the rest of the interval cuts the sleep short. ``interval_s`` 0: the
platform's default selector as it is (epoll on Linux).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable


class CoalescingSelector(selectors.DefaultSelector):  # type: ignore[misc]
    """The default selector (``EpollSelector`` on Linux), polling at most once per
    ``interval_s`` while polls find work. ``clock`` (monotonic seconds) and ``sleep``
    are injected for tests."""

    def __init__(self, interval_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock, self._sleep = clock, sleep
        self._next_poll = 0.0  # no waiting poll before this (the clock's time)

    def select(self, timeout: float | None = None) -> list:
        if timeout is None or timeout > 0:
            rest = self._next_poll - self._clock()
            if rest > 0:
                if timeout is not None and timeout <= rest:
                    self._sleep(timeout)
                    timeout = 0
                else:
                    self._sleep(rest)
                    timeout = None if timeout is None else timeout - rest
        ready = super().select(timeout)
        if ready and self.interval_s > 0:
            self._next_poll = self._clock() + self.interval_s
        return ready


def coalescing_loop_factory(interval_s: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of asyncio loops (``asyncio.Runner(loop_factory=...)``) whose selector
    is a ``CoalescingSelector`` of ``interval_s``."""
    return lambda: asyncio.SelectorEventLoop(CoalescingSelector(interval_s))
