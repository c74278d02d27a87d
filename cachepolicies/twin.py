"""The agent's twin: a discrete-event replay of what the node agent's cache and batcher
do with a trace, for response times when loads are the bottleneck.

It follows ``agent.node.cache`` and ``agent.node.batching`` step by step:

- a request records its access and takes a reference on its model when it arrives (a
  model with requests in flight or waiting for its load is never a victim);
- a miss starts one load (single flight: later requests for the model wait on it); with
  a disk tier (``cachepolicies.tiers``) it first pulls the model's files when they are
  not on disk: the pull waits for one of ``max_concurrent_pulls`` pull slots (FIFO),
  then makes room on disk and downloads (``DiskBooks.fetch``: its download seconds, at
  least its bytes over ``pull_bandwidth``, the agent's cap per pull); then the load
  takes one of ``load_concurrency`` load slots (FIFO), then waits in the *room
  queue* (``cachepolicies.roomqueue``, the agent's own, with the same verbs: deadline
  then arrival, head-of-line: a later load never overtakes the head)
  until ``MemoryPool.reserve`` finds room for its peak (``load_peak`` × size, at most
  what could ever be freed for it: the capacity less the other pinned resident models)
  among idle unpinned models; it runs for the model's penalty (load + cold first run;
  or the slot time a node measured, the profiles' ``load_slot_seconds``), then commits
  its steady size, frees its slot and wakes the next loads;
- a coordinator's directives (``Directive``), at their time: the models they pin are
  never victims from then on (until the next directives), and those they prefetch
  that are neither resident nor loading start a load with no request waiting, as the
  agent's reporter applies them (``ModelCache.ensure_loaded`` of each, at once);
- a load that has waited ``load_wait_max_s`` (for a slot or room) gives up, and one
  that only pinned models keep from room while nothing under way could free any is
  refused at once: its requests fail (the agent's 503);
- with ``cold_start="reject"`` a request for a model not loaded whose known penalty
  (from an earlier load) outlasts the SLO fails at once and starts the load, as the
  agent's ``Serving._check_cold`` does;
- a loaded model serves its queue with ``workers`` workers, each taking up to the AIMD
  limit of rows (Clipper: +``aimd_step`` after a full batch within
  ``budget_fraction`` × SLO, × 0.9 after one over it and a ceiling below its size, never
  above ``max_batch_size``); a batch of b rows runs ``exec_seconds + (b − 1) × per-row
  seconds`` (per-row: the profiles' ``exec_seconds_per_row``; unknown: ``exec_seconds``,
  no gain from batching).

What it leaves out (the error to expect: docs/simulator.md): the batcher's delay window
(it waits only when requests arrive faster than a batch's fixed cost), admission control
and tail drop, unload time, HTTP and event-loop overhead, and measurement noise.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cachepolicies.base import Policy
from cachepolicies.pool import MemoryPool
from cachepolicies.roomqueue import RoomQueue, Waiter
from cachepolicies.tiers import DiskBooks
from cachepolicies.traces import Profiles, Trace

#: Clipper's multiplicative decrease of the batch limit (the agent's ``BACKOFF``).
BACKOFF = 0.9
COLD_START = ("serve", "reject")


@dataclass(frozen=True)
class Queueing:
    """The agent's settings the twin replays. The defaults here are neutral (no limit
    but one worker per model, no batching); ``edgeagent simulate --queueing`` fills them
    from the agent's own declarations (``agent.config``), so an unflagged run predicts an
    unflagged agent."""

    workers: int = 1                       # per model (``batching.workers``)
    load_concurrency: int | None = None    # load slots; None: unbounded
    max_batch_size: int = 1                # rows per batch at most; < 2: never batched
    aimd_step: int = 2
    batch_budget_seconds: float = math.inf  # one batch's share of the SLO
    load_peak: float = 1.0                 # bytes a load holds, per byte of its model
    load_wait_max_s: float = math.inf
    cold_start: str = "serve"
    slo_seconds: float = math.inf          # a response above it is an SLO violation
    max_concurrent_pulls: int | None = None  # pull slots (the disk tier); None: unbounded
    pull_bandwidth: float | None = None    # bytes per second per pull; None: no cap

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"queueing needs at least 1 worker per model, got {self.workers}")
        if self.load_concurrency is not None and self.load_concurrency < 1:
            raise ValueError(f"load_concurrency must be >= 1, got {self.load_concurrency}")
        if self.cold_start not in COLD_START:
            raise ValueError(f"cold_start must be one of {', '.join(COLD_START)}, "
                             f"got {self.cold_start!r}")
        if self.load_peak < 1:
            raise ValueError(f"load_peak must be >= 1, got {self.load_peak}")
        if self.load_wait_max_s < 0:
            raise ValueError(f"load_wait_max_s must be >= 0, got {self.load_wait_max_s}")
        if self.max_concurrent_pulls is not None and self.max_concurrent_pulls < 1:
            raise ValueError(f"max_concurrent_pulls must be >= 1, got "
                             f"{self.max_concurrent_pulls}")
        if self.pull_bandwidth is not None and not self.pull_bandwidth > 0:
            raise ValueError(f"pull_bandwidth must be > 0 bytes/s, got {self.pull_bandwidth}")


@dataclass(frozen=True)
class Directive:
    """What a coordinator's directives made a node do at ``at`` (the trace's seconds):
    keep ``pinned`` resident from then on (never victims; the pins before are lifted),
    and load those of ``prefetch`` (model ids, in order) that are not resident or
    loading, each not pinned only until it has been loaded once under these directives
    (renewed directives do not load again a model its use evicted), as the agent does."""

    at: float
    pinned: frozenset[int] = frozenset()
    prefetch: tuple[int, ...] = ()


@dataclass
class Outcome:
    """What one twin replay measured: per-request response seconds (NaN: failed), the
    loads per model, and the seconds loads waited for a slot or room."""

    response: np.ndarray
    loads: list[int]
    load_wait_seconds: float
    events: list[tuple[float, str, int]] | None  # (time, what, model) when asked

    def stats(self, slo_seconds: float) -> dict[str, float | int]:
        """Response statistics of the requests served (0 without any), the requests that
        failed, and the SLO violations (served later than ``slo_seconds``, or failed)."""
        served = self.response[~np.isnan(self.response)]
        failed = len(self.response) - len(served)

        def stat(statistic) -> float:
            return float(statistic(served)) if served.size else 0.0

        return dict(failed=failed, mean_response_seconds=stat(np.mean),
                    p95_response_seconds=stat(lambda r: np.percentile(r, 95)),
                    p99_response_seconds=stat(lambda r: np.percentile(r, 99)),
                    slo_violations=int(np.count_nonzero(served > slo_seconds)) + failed)


# Event kinds, in the order ties are handled (directives first, then an arrival before
# a load's end, as the existing queueing replay did; give-ups last; downloads done
# after them).
_DIRECT, _ARRIVE, _LOADED, _BATCH_DONE, _GIVE_UP, _PULLED = -1, 0, 1, 2, 3, 4


def replay(trace: Trace, profiles: Profiles, capacity: int, policy: Policy,
           settings: Queueing, *, disk: DiskBooks | None = None,
           directives: Sequence[Directive] = (), log_events: bool = False) -> Outcome:
    """Replay ``trace`` through the twin (the module docstring's model); ``disk``: the
    disk tier a miss pulls its files into first (None: every model's files on disk),
    made with ``settings.pull_bandwidth``; ``directives``: the coordinator's pins and
    prefetches, each at its time."""
    return _Twin(trace, profiles, capacity, policy, settings, disk, directives,
                 log_events).run()


class _Twin:
    """The replay's state and its event handlers (one instance per replay)."""

    def __init__(self, trace: Trace, profiles: Profiles, capacity: int, policy: Policy,
                 settings: Queueing, disk: DiskBooks | None,
                 directives: Sequence[Directive], log_events: bool) -> None:
        self.s = settings
        self.directives = list(directives)
        self.pinned: frozenset[int] = frozenset()
        #: the last directives' (pins, prefetches), and the models loaded since they
        #: came: a model not pinned is loaded for a plan once, then kept by use
        self.plan: tuple[frozenset[int], tuple[int, ...]] | None = None
        self.prefetched: set[int] = set()
        self.disk = disk
        self.sizes = profiles.size_bytes.tolist()
        self.penalties = profiles.penalty_seconds.tolist()
        self.exec_seconds = profiles.exec_seconds.tolist()
        per_row = profiles.exec_seconds_per_row
        # Unknown per-row cost: a batch of b rows costs b single runs (no batching gain).
        self.per_row = (self.exec_seconds if per_row is None else
                        [e if math.isnan(p) else p
                         for e, p in zip(self.exec_seconds, per_row.tolist())])
        slot = profiles.load_slot_seconds
        # How long a load holds its slot: as the node measured it where it did (the
        # load and the runtime's hand-offs), else the penalty.
        self.hold = (self.penalties if slot is None else
                     [p if math.isnan(t) else t
                      for p, t in zip(self.penalties, slot.tolist())])
        self.model_of = trace.model_ids.tolist()
        self.arrivals = trace.timestamps.tolist()
        n = len(self.sizes)
        self.pool = MemoryPool(capacity, policy)
        self.policy = policy
        self.peak = [int(size * settings.load_peak) for size in self.sizes]
        self.need = list(self.peak)               # what the current load reserves
        self.in_flight = [0] * n
        self.waiters: dict[int, list[int]] = {}  # model loading -> its requests
        self.load_id = [0] * n                    # the current load's token per model
        self.asked = [0.0] * n                    # when the current load asked
        self.stage = [""] * n                     # "", "slot", "room", "loading"
        self.loaded_once = [False] * n
        self.queue: list[deque[int]] = [deque() for _ in range(n)]
        self.busy = [0] * n
        self.limit = [1] * n
        self.ceiling: list[int | None] = [None] * n
        self.slots = settings.load_concurrency or math.inf
        self.slot_queue: deque[int] = deque()
        self.pull_slots = settings.max_concurrent_pulls or math.inf
        self.pull_queue: deque[int] = deque()
        #: Loads waiting for room: the agent's own room queue, this replay its ``Room``.
        self.rooms = RoomQueue(self)
        self.waiter: dict[int, Waiter] = {}        # model -> its load's place in it
        self.loads = [0] * n
        self.load_wait = 0.0
        self.response = np.full(len(trace), np.nan)
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.now = 0.0                             # the event being handled's time
        self.log: list[tuple[float, str, int]] | None = [] if log_events else None

    def schedule(self, at: float, kind: int, what: object) -> None:
        heapq.heappush(self.events, (at, kind, self.seq, what))
        self.seq += 1

    def note(self, now: float, what: str, model: int) -> None:
        if self.log is not None:
            self.log.append((now, what, model))

    def run(self) -> Outcome:
        for i, arrival in enumerate(self.arrivals):
            self.schedule(arrival, _ARRIVE, i)
        for directive in self.directives:
            self.schedule(directive.at, _DIRECT, directive)
        while self.events:
            now, kind, _, what = heapq.heappop(self.events)
            self.now = now
            if kind == _DIRECT:
                self.direct(what, now)
            elif kind == _ARRIVE:
                self.arrive(what, now)
            elif kind == _LOADED:
                self.loaded(what, now)
            elif kind == _BATCH_DONE:
                self.batch_done(what, now)
            elif kind == _GIVE_UP:
                self.give_up(what, now)
            else:  # _PULLED: the files are on disk, the load asks for its slot
                self.pulled(what, now)
        return Outcome(self.response, self.loads, self.load_wait, self.log)

    # -- requests ----------------------------------------------------------------------
    def arrive(self, i: int, now: float) -> None:
        m = self.model_of[i]
        self.policy.record_access(m, now)
        if self.disk is not None:
            self.disk.record_access(m, now)
        if m in self.pool:
            self.in_flight[m] += 1
            self.queue[m].append(i)
            self.dispatch(m, now)
            return
        if self.s.cold_start == "reject" and self.loaded_once[m] \
                and self.penalty(m) + self.exec_seconds[m] > self.s.slo_seconds:
            if m not in self.waiters:  # the agent loads it in the background
                self.waiters[m] = []
                self.fetch(m, now)
            return  # failed at once (NaN)
        self.in_flight[m] += 1
        if m in self.waiters:  # single flight
            self.waiters[m].append(i)
            return
        self.waiters[m] = [i]
        self.fetch(m, now)

    def direct(self, directive: Directive, now: float) -> None:
        """The coordinator's directives: its pins replace the last, its prefetches of
        models neither resident nor loading start a load that no request waits on."""
        self.pinned = directive.pinned
        plan = (directive.pinned, directive.prefetch)
        if plan != self.plan:  # a new plan: each of its models is loaded once again
            self.plan, self.prefetched = plan, set()
        for m in directive.prefetch:
            if m in self.pool or m in self.waiters \
                    or (m in self.prefetched and m not in self.pinned):
                continue
            self.note(now, "prefetch", m)
            self.waiters[m] = []
            self.fetch(m, now)
        self.rooms.changed(now)  # a pin lifted may have made room

    def dispatch(self, m: int, now: float) -> None:
        """Free workers of ``m`` take batches from its queue."""
        queue = self.queue[m]
        while queue and self.busy[m] < self.s.workers:
            rows = min(len(queue), self.limit[m] if self.s.max_batch_size >= 2 else 1)
            batch = [queue.popleft() for _ in range(rows)]
            self.busy[m] += 1
            seconds = self.batch_seconds(m, rows)
            self.schedule(now + seconds, _BATCH_DONE, (m, batch, seconds))

    def batch_done(self, what: tuple[int, list[int], float], now: float) -> None:
        m, batch, seconds = what
        self.busy[m] -= 1
        self.tune(m, len(batch), seconds)
        for i in batch:
            self.response[i] = now - self.arrivals[i]
        self.in_flight[m] -= len(batch)
        self.dispatch(m, now)
        if self.in_flight[m] == 0:
            self.rooms.changed(now)

    def tune(self, m: int, rows: int, seconds: float) -> None:
        """The agent's AIMD batch limit (``agent.node.batch_tuner.AimdLimit``) after a
        batch of ``rows`` that took ``seconds``, with its ceiling after an overshoot."""
        s, limit = self.s, self.limit[m]
        if s.max_batch_size < 2:
            return
        if seconds > s.batch_budget_seconds:
            if rows >= limit:
                self.ceiling[m] = max(1, min(self.ceiling[m] or rows, rows - 1))
            if rows <= limit:
                limit = max(1, math.floor(limit * BACKOFF))
                self.limit[m] = min(limit, self.ceiling[m] or limit)
            return
        if rows < limit:
            return
        target = min(limit + s.aimd_step, s.max_batch_size)
        ceiling = self.ceiling[m]
        if ceiling is not None and target > ceiling:
            if limit < ceiling:
                target = ceiling
            elif self.batch_seconds(m, limit + s.aimd_step) <= s.batch_budget_seconds:
                self.ceiling[m] = None  # a step fits the budget again
            else:
                target = limit
        self.limit[m] = target

    def batch_seconds(self, m: int, rows: int) -> float:
        return self.exec_seconds[m] + (rows - 1) * self.per_row[m]

    # -- loads ---------------------------------------------------------------------------
    def penalty(self, m: int) -> float:
        """What a miss on ``m`` costs now: its load, plus its download while its files
        are not on disk."""
        return self.penalties[m] if self.disk is None else self.disk.penalty(m)

    def fetch(self, m: int, now: float) -> None:
        """A miss's first step: ``m``'s files onto disk when they are not there (a pull,
        in its turn for a pull slot), then ``start_load``."""
        if self.disk is None or not self.disk.needs_pull(m):
            self.start_load(m, now)
            return
        self.pull_queue.append(m)
        self.take_pull_slots(now)

    def take_pull_slots(self, now: float) -> None:
        """Pulls waiting for a slot start in arrival order, as the agent's semaphore
        lets them: room on disk (models being pulled or loaded keep their files), then
        the download (capped by ``pull_bandwidth``: the tier's download seconds)."""
        while self.pull_slots > 0 and self.pull_queue:
            m = self.pull_queue.popleft()
            self.pull_slots -= 1
            seconds = self.disk.fetch(m, now, self.pool, self.waiters.__contains__)
            if seconds > 0:
                self.note(now, "pull", m)
                self.schedule(now + seconds, _PULLED, m)
            else:  # nothing to wait for: its slot is free again at once
                self.pull_slots += 1
                self.start_load(m, now)

    def pulled(self, m: int, now: float) -> None:
        self.pull_slots += 1
        self.take_pull_slots(now)
        self.start_load(m, now)

    def start_load(self, m: int, now: float) -> None:
        """A load prices itself (its peak, capped at what could ever be freed for it:
        the capacity less the other pinned resident models, as the agent's ``_price``)
        and asks for a load slot."""
        pinned = sum(self.pool.sizes[k] for k in self.pinned if k != m and k in self.pool)
        self.need[m] = min(self.peak[m], self.pool.capacity - pinned)
        self.load_id[m] += 1
        self.asked[m] = now
        self.stage[m] = "slot"
        self.slot_queue.append(m)
        if math.isfinite(self.s.load_wait_max_s):
            self.schedule(now + self.s.load_wait_max_s, _GIVE_UP,
                          (m, self.load_id[m], "gave up"))
        self.take_slots(now)

    def take_slots(self, now: float) -> None:
        while self.slots > 0 and self.slot_queue:
            m = self.slot_queue.popleft()
            self.slots -= 1
            self.stage[m] = "room"
            self.waiter[m] = self.rooms.ask(m, self.need[m],
                                            self.asked[m] + self.s.load_wait_max_s)
            self.note(now, "slot", m)
        self.rooms.changed(now)

    def evictable(self, key: int) -> bool:
        return self.in_flight[key] == 0 and key not in self.pinned

    # -- the room queue's Room: the memory pool as the agent's memory tier keeps it ------
    def take(self, waiter: Waiter, now: float) -> list | None:
        """Room for a waiting load (victims among idle models), and its load starts."""
        m = waiter.key
        victims = self.pool.reserve(self.need[m], now, self.evictable)
        if victims is None:
            return None  # until a request finishes or a load commits
        del self.waiter[m]
        self.stage[m] = "loading"
        self.loads[m] += 1
        self.load_wait += now - self.asked[m]
        self.note(now, "load", m)
        self.schedule(now + self.hold[m], _LOADED, m)
        return victims

    def futile(self, waiter: Waiter) -> Exception | None:
        """Refuse a load only the pinned models stand in the way of, as the agent's
        pool does: nothing under way (a load running or waiting for its slot, an
        unpinned model in use) could ever free its room. Its requests fail at once
        (the refusal is settled as an event at this instant)."""
        m = waiter.key
        if self.pool.reserved or any(
                k != m and ((k in self.waiters and self.stage[k] != "room")
                            or (self.in_flight[k] and k in self.pool
                                and k not in self.pinned))
                for k in range(len(self.sizes))):
            return None
        self.schedule(self.now, _GIVE_UP, (m, self.load_id[m], "refused"))
        return RuntimeError(f"no room for model {m}: the pinned models hold it")

    def give_back(self, waiter: Waiter) -> None:
        raise AssertionError("a granted load of the twin always runs")

    def loaded(self, m: int, now: float) -> None:
        self.pool.commit(m, self.need[m], self.sizes[m], self.penalty(m), now)
        self.note(now, "loaded", m)
        self.stage[m] = ""
        self.loaded_once[m] = True
        self.prefetched.add(m)  # (whoever asked: the plan's model is in memory once)
        self.slots += 1
        self.queue[m].extend(self.waiters.pop(m))
        self.dispatch(m, now)
        self.take_slots(now)  # the pool changed: ``rooms.changed`` there

    def give_up(self, what: tuple[int, int, str], now: float) -> None:
        """A load waited past ``load_wait_max_s`` ("gave up") or was refused by the room
        ("refused": already out of its queue): its requests fail."""
        m, load, why = what
        if load != self.load_id[m] or self.stage[m] not in ("slot", "room"):
            return  # that load got its room
        if self.stage[m] == "slot":
            self.slot_queue.remove(m)
        else:
            self.rooms.withdraw(self.waiter.pop(m))  # (refused: no longer queued)
            self.slots += 1
        self.stage[m] = ""
        self.load_wait += now - self.asked[m]
        self.note(now, why, m)
        self.in_flight[m] -= len(self.waiters.pop(m))  # their requests fail (NaN)
        self.take_slots(now)
