"""A queue, a batcher and workers for one loaded model (Clipper §4.3).

Requests wait in one arrival-ordered queue. A free worker forms a batch from the oldest
request and the queued requests with the same *batch key* (same input names, datatypes
and non-batch dimensions, same backend parameters) up to the tuner's limit in rows,
concatenates their tensors along the batch dimension, runs the backend once, and
splits the outputs back by rows. When fewer rows are queued than the tuner's target,
it waits until the oldest request has waited the tuner's window for more.

Decisions where the papers are vague:

- The limit counts rows, not requests; a request larger than the limit runs alone and
  is never split.
- Delayed batching never waits past the oldest request's ``dispatch_by`` (its deadline
  less the margin and a full batch's predicted time), so the window never makes a
  request late and admission need not count it.
- Delayed batching also stops waiting once no request has arrived for ``GAP_FACTOR`` mean
  inter-arrival times, counted from the last arrival or the last batch answered
  (whose clients may come back): with closed-loop clients all waiting on the queue,
  nothing more will come, and waiting out the window would only lower throughput.
- A batch that fails is re-run request by request, so only the request at fault gets
  the error. A model whose outputs do not have the batch's row count as their first
  dimension (no real batch dimension) is switched to single-request batches for good.
- A model whose inputs or outputs lack a variable first dimension is never batched
  (``batchable`` False): it still gets the queue, admission control and its workers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np

from agent import tracing
from agent.backends.base import Backend, BackendUnavailable, TensorSpec
from agent.node.admission import Deadline, QueueState, Shed
from agent.node.batch_tuner import BatchTuner
from agent.node.stats import ModelStats

log = logging.getLogger("edgeagent.batching")

#: Stop waiting for a batch after this many mean inter-arrival times without an arrival.
GAP_FACTOR = 2.0
#: A batch of a size whose typical run is measured at or under this many seconds runs on
#: the event loop itself, where its backend allows it (``Backend.RUNS_IN_PLACE``): the
#: hand-off to an inference thread and back, two wake-ups, would cost more than the run.
IN_PLACE_S = 0.0002
#: Request parameters that only shape the response or the scheduling, never the outputs.
_NOT_FOR_BACKEND = frozenset({"timeout", "binary_data_output", "priority"})


def backend_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The request parameters that may reach the backend (and so split batches)."""
    return {k: v for k, v in parameters.items() if k not in _NOT_FOR_BACKEND}


def rows_of(inputs: dict[str, np.ndarray]) -> int:
    """Rows (batch dimension) of a request: the first dimension of its first input."""
    for array in inputs.values():
        return int(array.shape[0]) if array.ndim else 1
    return 1


def batch_key(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Hashable:
    """Requests with equal keys can share a batch: same tensors but for the first
    dimension, same backend parameters. Inputs disagreeing on their first dimension get
    a key of their own (they are run alone)."""
    firsts = {a.shape[0] if a.ndim else None for a in inputs.values()}
    if len(firsts) != 1 or None in firsts:
        return ("alone", object())
    shapes = tuple((name, a.dtype, a.shape[1:]) for name, a in sorted(inputs.items()))
    params = json.dumps(parameters, sort_keys=True, default=str) if parameters else ""
    return shapes, params


def has_batch_dimension(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> bool:
    """Whether every input and output has a variable first dimension (Triton's rule for
    a model that supports batching)."""
    specs = list(inputs) + list(outputs)
    return bool(inputs) and all(len(s.shape) >= 1 and s.shape[0] == -1 for s in specs)


@dataclass(eq=False)
class Pending:
    """One queued request."""

    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    rows: int
    key: Hashable
    enqueued: float
    deadline: Deadline
    future: asyncio.Future = field(repr=False)
    #: Latest time its batch may start and still meet the deadline (bounds the window).
    dispatch_by: float = float("inf")
    #: After this its answer is useless (a selection app cut it): dropped, never run.
    expires: float = float("inf")
    #: Its spans while queued and run (``agent.tracing.Queued``; None: not traced).
    trace: Any = field(default=None, repr=False)

    @property
    def weight(self) -> int:
        """Rows counted against the batch limit (an empty request still costs a slot)."""
        return max(self.rows, 1)

    def resolve(self, outputs: dict[str, np.ndarray]) -> None:
        if not self.future.done():
            self.future.set_result(outputs)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
            if self.trace is not None:  # tracing
                self.trace.dropped(exc)


class ModelBatcher:
    """Queue + batcher + workers of one loaded model version."""

    def __init__(self, name: str, backend: Backend, executor: Executor | None,
                 tuner: BatchTuner, *, batchable: bool, workers: int = 1,
                 clock: Callable[[], float],
                 on_batch: Callable[[int, float], None] | None = None,
                 stats: ModelStats | None = None) -> None:
        self.name, self.backend, self.executor, self.tuner = name, backend, executor, tuner
        self.batchable = batchable
        self.clock = clock
        self.on_batch = on_batch
        self.stats = stats  # queue and compute times, executions (Triton's statistics)
        self.queue: list[Pending] = []
        self.queued_rows = 0
        # running batches: worker id (or the request run in place) -> (started, expected s)
        self.running: dict[object, tuple[float, float]] = {}
        self.closed: Shed | None = None
        self._changed = asyncio.Event()
        self._last_arrival: float | None = None
        self._last_done: float | None = None
        self._wanted = 0
        self._next_id = 0
        self._workers: dict[int, asyncio.Task] = {}
        self.set_workers(workers)

    # -- state -----------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.tuner.limit if self.batchable else 1

    @property
    def workers(self) -> int:
        return self._wanted

    def state(self, now: float) -> QueueState:
        """The queue as an arriving request sees it (for admission)."""
        batched = self.batchable
        step, cap = self.tuner.growth() if batched else (0, 1)
        return QueueState(
            queued_rows=self.queued_rows, queued_requests=len(self.queue),
            limit=self.limit, workers=max(self._wanted, 1),
            running_left=tuple(started + expected - now
                               for started, expected in self.running.values()),
            arrival_rate=self.tuner.arrivals.rate(now) if batched else 0.0,
            excess=self.tuner.profile.excess(), limit_step=step, limit_cap=cap,
            sizes=tuple(p.weight for p in self.queue))

    def predict(self, rows: int) -> float | None:
        """Typical seconds of a batch of ``rows`` (admission adds the SLO percentile's
        excess to the request's own batch: ``QueueState.excess``)."""
        return self.tuner.profile.predict(rows)

    # -- requests --------------------------------------------------------------------
    def submit(self, pending: Pending) -> None:
        """Queue an admitted request; its future gets the outputs or an error."""
        if self.closed is not None:
            raise self.closed
        self.queue.append(pending)
        self.queued_rows += pending.weight
        self._last_arrival = pending.enqueued
        self._changed.set()

    def can_run_now(self) -> bool:
        """Whether a request arriving now would be dispatched alone at once anyway (queue
        empty, a worker free, no window to wait): then ``run_now`` saves the hand-off."""
        return (self.closed is None and not self.queue and len(self.running) < self._wanted
                and (not self.batchable or self.tuner.window <= 0))

    async def run_now(self, pending: Pending) -> dict[str, np.ndarray]:
        """Run ``pending`` as a batch of its own in the caller's task, on a free worker's
        slot (the workers wait while every slot is busy)."""
        self._last_arrival = pending.enqueued
        await self._run(pending, [pending], pending.weight >= self.limit)
        return await pending.future

    def fail_queued(self, error: Shed) -> int:
        """Answer every queued request with ``error``; returns how many there were."""
        queued, self.queue, self.queued_rows = self.queue, [], 0
        for pending in queued:
            pending.fail(error)
        return len(queued)

    # -- workers ---------------------------------------------------------------------
    def set_workers(self, count: int) -> None:
        """Run batches on ``count`` workers (>= 1); extra ones stop after their batch."""
        if count < 1:
            raise ValueError("a model needs at least one worker")
        self._wanted = count
        while len(self._workers) < count and self.closed is None:
            wid, self._next_id = self._next_id, self._next_id + 1
            task = asyncio.get_running_loop().create_task(self._work(wid),
                                                          name=f"batcher:{self.name}:{wid}")
            self._workers[wid] = task
        self._changed.set()

    async def close(self, error: Shed, timeout: float = 10.0) -> None:
        """Refuse new requests, answer queued ones with ``error``, let running batches
        finish (up to ``timeout`` s, then cancel them: their requests get ``error`` too)."""
        self.closed = error
        self.fail_queued(error)
        self._changed.set()
        tasks = list(self._workers.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)

    def _retiring(self) -> bool:
        return self.closed is not None or len(self._workers) > self._wanted

    async def _work(self, wid: int) -> None:
        try:
            while not self._retiring():
                try:
                    batch, full = await self._next_batch()
                    if batch:
                        await self._run(wid, batch, full)
                except Exception:  # noqa: BLE001 - a bug must not stop the worker
                    log.exception("batcher of %s: unexpected error (batch answered with it)",
                                  self.name)
        finally:
            self._workers.pop(wid, None)

    async def _wait(self, timeout: float | None) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _expire(self, now: float) -> None:
        """Drop requests whose client timeout (or caller's cut) passed while queued, and
        cancelled ones."""
        keep = []
        for p in self.queue:
            if p.future.done():
                continue
            if (p.deadline.hard and now > p.deadline.at) or now > p.expires:
                p.fail(Shed("the request's timeout passed while it was queued", "expired"))
                continue
            keep.append(p)
        if len(keep) != len(self.queue):
            self.queue = keep
            self.queued_rows = sum(p.weight for p in keep)

    async def _next_batch(self) -> tuple[list[Pending], bool]:
        while not self._retiring():
            now = self.clock()
            self._expire(now)
            if not self.queue or len(self.running) >= self._wanted:
                await self._wait(None)  # nothing to do, or every slot busy (run_now)
                continue
            head = self.queue[0]
            limit = self.limit
            if not self.batchable:
                return self._take(head.key, 1)
            tuner = self.tuner
            window = tuner.window
            ready = sum(p.weight for p in self.queue if p.key == head.key)
            if window <= 0 or ready >= min(tuner.target, limit):
                return self._take(head.key, limit)
            until = min(head.enqueued + window, head.dispatch_by)
            if tuner.settings.adaptive:
                rate = tuner.arrivals.rate(now)
                last = max(self._last_arrival or 0.0, self._last_done or 0.0)
                if rate > 0 and last > 0:
                    until = min(until, last + GAP_FACTOR / rate)
            if now >= until:
                return self._take(head.key, limit)
            await self._wait(until - now)
        return [], False

    def _take(self, key: Hashable, limit: int) -> tuple[list[Pending], bool]:
        """Remove and return the oldest requests with ``key`` up to ``limit`` rows (the
        first always), and whether the limit left some behind (a full batch)."""
        batch: list[Pending] = []
        rest: list[Pending] = []
        rows, full = 0, False
        for p in self.queue:
            if p.key != key:
                rest.append(p)
            elif not batch or (rows + p.weight <= limit and not full):
                batch.append(p)
                rows += p.weight
            else:
                rest.append(p)
                full = True
        self.queue = rest
        self.queued_rows -= rows
        return batch, full or rows >= limit

    # -- running ---------------------------------------------------------------------
    async def _run(self, wid: object, batch: list[Pending], full: bool) -> None:
        rows = sum(p.weight for p in batch)
        self.running[wid] = (self.clock(), self.predict(rows) or 0.0)
        traced = None if batch[0].trace is None else tracing.batch_began(  # tracing
            batch, self.name)
        try:
            await self._infer(batch, full)
        except Exception as exc:
            for p in batch:
                p.fail(exc)
            raise
        except BaseException:  # cancelled: the agent is stopping
            for p in batch:
                p.fail(self.closed or Shed(f"model {self.name!r} stopped serving", "shutdown"))
            raise
        finally:
            self.running.pop(wid, None)
            self._last_done = self.clock()
            if self.queue:
                self._changed.set()  # a slot is free for what queued meanwhile
            if traced is not None:  # tracing
                tracing.batch_ended(traced)

    async def _backend_run(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                           rows: int) -> dict[str, np.ndarray]:
        """The backend's outputs for one batch of ``rows``: in place on the event loop
        where that size was measured to run within ``IN_PLACE_S``, else off the loop."""
        if self.backend.RUNS_IN_PLACE:
            typical = self.tuner.profile.typical(rows)
            if typical is not None and typical <= IN_PLACE_S:
                return self.backend.infer(inputs, parameters)
        return await self.backend.infer_async(inputs, parameters, self.executor)

    def _observe(self, rows: int, seconds: float, full: bool) -> None:
        self.tuner.observe_batch(self.clock(), rows, seconds, full)
        if self.on_batch is not None:
            self.on_batch(rows, seconds)

    async def _infer_one(self, p: Pending, full: bool) -> None:
        started = self.clock()
        try:
            outputs = await self._backend_run(p.inputs, p.parameters, p.weight)
        except Exception as exc:  # noqa: BLE001 - the request's answer
            p.fail(exc)
            return
        seconds = self.clock() - started
        self._observe(p.weight, seconds, full)
        if self.stats is not None:
            self.stats.executed(p.weight, [started - p.enqueued], 0.0, seconds, 0.0)
        p.resolve(outputs)

    async def _infer(self, batch: list[Pending], full: bool) -> None:
        if len(batch) == 1:
            await self._infer_one(batch[0], full)
            return
        gathering = self.clock()
        merged = {name: np.concatenate([p.inputs[name] for p in batch])
                  for name in batch[0].inputs}
        started = self.clock()
        try:
            outputs = await self._backend_run(merged, batch[0].parameters,
                                              sum(p.weight for p in batch))
        except BackendUnavailable as exc:  # the runtime's fault, not a request's
            for p in batch:
                p.fail(exc)
            return
        except Exception as exc:  # noqa: BLE001 - find the request at fault
            log.debug("batch of %d on %s failed (%s); re-running one by one", len(batch),
                      self.name, exc)
            for p in batch:
                await self._infer([p], False)
            return
        seconds = self.clock() - started
        total = sum(p.rows for p in batch)
        if any(a.ndim == 0 or a.shape[0] != total for a in outputs.values()):
            log.warning("model %s: outputs %s do not follow the batch dimension (%d rows); "
                        "batching is off for it", self.name,
                        {k: list(a.shape) for k, a in outputs.items()}, total)
            self.batchable = False
            for p in batch:
                await self._infer([p], False)
            return
        self._observe(sum(p.weight for p in batch), seconds, full)
        splitting = self.clock()
        offset, parts = 0, []
        for p in batch:
            parts.append({k: a[offset:offset + p.rows] for k, a in outputs.items()})
            offset += p.rows
        if self.stats is not None:
            self.stats.executed(sum(p.weight for p in batch),
                                [gathering - p.enqueued for p in batch],
                                started - gathering, seconds, self.clock() - splitting)
        for p, part in zip(batch, parts):
            p.resolve(part)
