"""Refusing reports early: a coordinator or report worker that cannot answer every report
on time says so at once (503 with ``Retry-After``) instead of answering them all late.

A fleet that comes back at once (a coordinator restarted, a network healed) offers more
reports in a second than one event loop answers; left alone, they wait in the kernel's
buffers and the loop's queue, every answer comes late and nodes time out and retry into
the same queue. A ``Shedder`` watches two signs that the process is past what it holds:

* its event loop's **lag** (how late a timer set every ``PROBE_S`` fires, smoothed over
  ``SMOOTHING_S``): the work waiting for the CPU, whether this process used it all or
  the machine gave it less (a single stall, a collection, barely moves it);
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
import time
from typing import Callable

from agent.errors import AgentError

PROBE_S = 0.05  # the lag probe's timer
SMOOTHING_S = 0.5  # the lag's time constant: a stall shorter than this barely counts


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
        self.refused = 0

    def observe(self, late_s: float, elapsed_s: float) -> None:
        """A probe fired ``late_s`` late, ``elapsed_s`` after the last one: the smoothed
        lag moves towards it by as much of ``SMOOTHING_S`` as passed."""
        weight = 1.0 - math.exp(-max(0.0, elapsed_s) / SMOOTHING_S)
        self.lag += weight * (max(0.0, late_s) - self.lag)

    async def watch(self) -> None:
        """Keep ``lag`` (run as a task for as long as the process serves)."""
        while True:
            start = self.clock()
            await asyncio.sleep(PROBE_S)
            elapsed = self.clock() - start
            self.observe(elapsed - PROBE_S, elapsed)

    def check(self, queued: int) -> None:
        """``Overloaded`` (counted in ``refused``) while the lag or ``queued`` is over its
        limit."""
        if self.lag > self.max_lag_s:
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
