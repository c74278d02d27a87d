"""Admission control: deadlines, MArk's bouncer and Faro's tail drop.

Every request gets a deadline at arrival: its model's SLO latency, or the client's
``timeout`` when that is tighter. Before it is queued:

- *tail drop* (Faro §5): a model queue already holding ``max_queue`` requests rejects;
- *bouncer* (MArk §4.1): the completion time predicted from the queue ahead, the
  batches running and the measured batch latencies must fall before the deadline;
- a *cold* model's expected (remaining) load time counts against the deadline.

A rejection is ``Shed``: 503 with ``Retry-After`` (seconds until the queue is expected to
drain, at least 1), at once rather than after queueing to fail later.

Decision: the bouncer rejects for the SLO only when *others* make the request late
(queue ahead, busy workers, a load); a request that would miss its SLO on an idle model
is served (and counted as a violation), since rejecting it would leave a model whose SLO
is below its own latency unusable. A client ``timeout`` is a hard deadline: such requests
are rejected whenever they cannot make it, and dropped if it passes while queued.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

from agent.errors import retry_after_seconds
from agent.node.cache import CacheError


class Shed(CacheError):
    """A request rejected to protect latency (503 + Retry-After); ``reason`` names why:
    ``queue_full``, ``deadline``, ``cold``, ``expired``, ``unloaded`` or ``shutdown``."""

    status = 503

    def __init__(self, message: str, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = float(retry_after_seconds(retry_after))


@dataclass(frozen=True)
class Deadline:
    at: float
    hard: bool  # from the client's timeout: the answer is useless after it

    def left(self, now: float) -> float:
        return self.at - now


def deadline_for(arrived: float, slo: float, timeout: float | None) -> Deadline:
    """The SLO deadline, or the client's ``timeout`` (seconds) when tighter."""
    if timeout is not None and timeout < slo:
        return Deadline(arrived + timeout, True)
    return Deadline(arrived + slo, False)


@dataclass(frozen=True)
class QueueState:
    """What a model's batcher looks like to an arriving request."""

    queued_rows: int          # rows waiting, all shapes
    queued_requests: int
    limit: int                # rows per batch now
    workers: int
    running_left: tuple[float, ...]  # seconds left of each batch running now
    arrival_rate: float = 0.0  # rows per second joining the queue
    excess: float = 0.0  # seconds a batch takes over typical at the SLO's percentile
    limit_step: int = 0   # the limit grows this much per full batch (AIMD) ...
    limit_cap: int = 0    # ... up to this many rows
    #: Rows of each queued request, oldest first, as the batcher groups them (None:
    #: ``queued_rows`` requests of one row each).
    sizes: tuple[int, ...] | None = None


class _Ahead:
    """The queue ahead of a request as it will run (``predict_finish``): each worker's
    free time (a heap), the batch limit as AIMD grows it, the batches run."""

    def __init__(self, now: float, q: QueueState, cost: Callable[[int], float]) -> None:
        self.q, self.cost, self.batches = q, cost, 0
        self.limit = max(1, q.limit)
        self.cap = max(self.limit, q.limit_cap)
        self.free = [now + max(left, 0.0) for left in q.running_left][:q.workers]
        self.free += [now] * (max(q.workers, 1) - len(self.free))
        heapq.heapify(self.free)

    def run(self, size: int) -> None:
        """A batch of ``size`` rows on the worker free first."""
        start = heapq.heappop(self.free)
        heapq.heappush(self.free, start + self.cost(size))
        self.batches += 1
        if size >= self.limit and self.q.limit_step > 0:  # a full batch: AIMD grows it
            self.limit = min(self.limit + self.q.limit_step, self.cap)


def predict_finish(now: float, rows: int, q: QueueState,
                   predict: Callable[[int], float | None]) -> float:
    """When a request of ``rows`` rows joining the queue now is expected to be answered.

    The queue ahead runs as the batcher forms its batches (``ModelBatcher._take``): the
    queued requests in order fill a batch up to the limit, one that does not fit starts
    the next, and one over the limit runs alone (never split); each batch runs on the
    worker free first, at its typical time. The limit grows by ``q.limit_step`` per
    batch that reaches it, up to ``q.limit_cap``, as AIMD will grow it (planning with
    today's limit alone sheds a whole burst while the limit is still ramping up). The
    request joins the last batch if it fits there, else that batch runs first and the
    request starts the next one (alone when over the limit); a batch it heads also
    takes the rows expected to arrive before it starts, up to the limit (so it costs
    more under load). The SLO percentile's excess over the typical times is added once
    for the whole path, as ``q.excess × √k`` for the k batches it waits for on its
    worker (its own, the one running, those queued ahead): independent noise adds up in
    variance, so a sum of per-batch p99s would be far above the p99 of the sum and shed
    requests that make their SLO, and one batch's excess alone too little under a long
    queue. The delayed-batching
    window does not count: the batcher never waits past the latest start that keeps
    the oldest queued request within its deadline (``Pending.dispatch_by``), so a
    request is never refused for a wait that would be cut short for it. Unmeasured
    sizes cost 0 (optimistic: a model is not refused before anything is known about
    it)."""
    ahead = _Ahead(now, q, lambda size: predict(size) or 0.0)
    batch = 0  # rows of the batch being formed
    for size in q.sizes if q.sizes is not None else (1,) * q.queued_rows:
        size = max(size, 1)
        if batch and batch + size > ahead.limit:
            ahead.run(batch)
            batch = 0
        batch += size
        if batch >= ahead.limit:
            ahead.run(batch)
            batch = 0
    if batch and batch + rows > ahead.limit:
        ahead.run(batch)
        batch = 0
    start = heapq.heappop(ahead.free)
    size = batch + rows
    if size < ahead.limit:
        joining = int(q.arrival_rate * max(start - now, 0.0))
        size = min(ahead.limit, size + joining)
    running = any(left > 0 for left in q.running_left[:q.workers])
    batches = 1 + int(running) + math.ceil(ahead.batches / max(q.workers, 1))
    return start + ahead.cost(size) + q.excess * math.sqrt(batches)


def drain_seconds(q: QueueState, predict: Callable[[int], float | None]) -> float:
    """Seconds until the queue now waiting is expected to be served (for Retry-After)."""
    return predict_finish(0.0, 0, q, predict) if q.queued_rows else 0.0


def admit(now: float, deadline: Deadline, rows: int, q: QueueState, max_queue: int,
          predict: Callable[[int], float | None], *, load_left: float = 0.0,
          margin: float = 0.0) -> float:
    """Raise ``Shed`` unless a request may join the queue; returns its predicted finish.

    ``load_left``: seconds until the model is loaded (0 when it is); ``margin``: seconds
    the predicted finish must leave before the deadline (predictions are estimates, the
    SLO a percentile)."""
    if q.queued_requests >= max_queue:
        raise Shed(f"queue full ({q.queued_requests} requests waiting, bound {max_queue})",
                   "queue_full", drain_seconds(q, predict))
    finish = predict_finish(now + load_left, rows, q, predict)
    if finish <= deadline.at - margin:
        return finish
    # Its own batch on an idle, loaded model, at the same percentile: a request with
    # nothing ahead of it is never refused (else a high excess would refuse every
    # request, and with none served the profile could never learn it is lower).
    alone = (predict(rows) or 0.0) + q.excess
    if deadline.hard or finish - now > alone + 1e-9:
        late_ms = (finish - deadline.at + margin) * 1000
        if load_left > 0 and q.queued_rows == 0:
            raise Shed(f"model is loading ({load_left:.3f}s left): the request would miss "
                       f"its deadline by {late_ms:.0f} ms", "cold", load_left)
        raise Shed(f"cannot meet the deadline: predicted {late_ms:.0f} ms late behind "
                   f"{q.queued_requests} queued request(s)", "deadline",
                   max(finish - now, drain_seconds(q, predict)))
    return finish
