"""Refusing reports early: a coordinator or report worker that cannot answer every report
on time says so at once (503 with ``Retry-After``) instead of answering them all late.

A fleet that comes back at once (a coordinator restarted, a network healed) offers more
reports in a second than one event loop answers; left alone, they wait in the kernel's
buffers and the loop's queue, every answer comes late and nodes time out and retry into
the same queue. A ``Shedder`` watches two signs that the process is past what it holds:

* its event loop's **lag** (how late a timer set every ``PROBE_S`` fires, smoothed over
  ``SMOOTHING_S``; a single stall, a collection, barely moves it), counted only while
  the loop is **saturated**: its thread had work (on a CPU or waiting for one, Linux's
  ``/proc/thread-self/schedstat``) for at least ``SATURATED`` of the time. A loop that
  is late because the machine is busy but that still idles between reports keeps up
  with them: refusing would only waste what its refusals and the nodes' retries cost.
  Where there is no schedstat, the lag alone counts;
* its **queue**: reports answered but not yet written (the coordinator's group commit)
  or handed over (a report worker's), which grows when the store or the coordinator is
  slower than the reports.

While either is over its limit (``report_shed_lag_ms``, ``report_shed_queue``) a report
is refused before it is parsed (``Overloaded``); the node keeps serving on its last
directives and reports again between ``Retry-After`` and twice that (``agent.backoff``).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Callable

from agent.errors import AgentError

PROBE_S = 0.05  # the lag probe's timer
SMOOTHING_S = 0.5  # the lag's time constant: a stall shorter than this barely counts
SATURATED = 0.9  # the share of time with work past which the loop's lag counts


class Overloaded(AgentError):
    """A report refused while the process that got it is overloaded: 503, report again
    after ``retry_after``."""

    status = 503


class Shedder:
    """Whether to refuse a report now (``check``), from the loop's lag (``watch`` keeps
    it) and the queue the caller names."""

    def __init__(self, max_lag_s: float, max_queue: int, retry_after_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_lag_s, self.max_queue, self.retry_after_s = max_lag_s, max_queue, retry_after_s
        self.clock = clock
        self.lag = 0.0  # seconds, smoothed
        self.busy = 0.0  # the share of time the loop's thread had work, smoothed
        self.refused = 0

    def observe(self, late_s: float, elapsed_s: float, busy_s: float | None = None) -> None:
        """A probe fired ``late_s`` late, ``elapsed_s`` after the last one, the loop's
        thread having had work for ``busy_s`` of them (None: unknown, taken as all):
        the smoothed figures move towards these by as much of ``SMOOTHING_S`` as
        passed."""
        elapsed_s = max(0.0, elapsed_s)
        weight = 1.0 - math.exp(-elapsed_s / SMOOTHING_S)
        self.lag += weight * (max(0.0, late_s) - self.lag)
        share = 1.0 if busy_s is None or elapsed_s <= 0 else min(1.0, busy_s / elapsed_s)
        self.busy += weight * (share - self.busy)

    async def watch(self) -> None:
        """Keep ``lag`` and ``busy`` (run as a task on the loop, for as long as the
        process serves)."""
        busy = _ThreadBusy()
        try:
            while True:
                start, had = self.clock(), busy.seconds()
                await asyncio.sleep(PROBE_S)
                elapsed, has = self.clock() - start, busy.seconds()
                self.observe(elapsed - PROBE_S, elapsed,
                             None if had is None or has is None else has - had)
        finally:
            busy.close()

    @property
    def saturated(self) -> bool:
        """The loop runs late while it always has work."""
        return self.lag > self.max_lag_s and self.busy >= SATURATED

    def check(self, queued: int) -> None:
        """``Overloaded`` (counted in ``refused``) while the loop is saturated or
        ``queued`` is over its limit."""
        if self.saturated:
            why = f"its event loop runs {self.lag * 1000:.0f} ms late"
        elif queued > self.max_queue:
            why = f"{queued} answered reports wait to be written"
        else:
            return
        self.refused += 1
        error = Overloaded(f"the coordinator is busy ({why}): keep serving on the last "
                           f"directives and report again after Retry-After")
        error.retry_after = self.retry_after_s
        raise error


class _ThreadBusy:
    """This thread's seconds with work (on a CPU, or runnable and waiting for one), from
    Linux's ``/proc/thread-self/schedstat``, opened in the thread that makes it; None
    where there is none."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def seconds(self) -> float | None:
        if self._fd is None:
            return None
        try:
            on_cpu, waiting, _ = os.pread(self._fd, 128, 0).split()
            return (int(on_cpu) + int(waiting)) / 1e9
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
