"""Trace-driven cache simulation: replay a trace against one policy under a byte budget.

The simulator owns the budget and drives the policy through its four verbs only, as the
node agent's cache does: ``record_access`` on every request; on a miss, when the model
does not fit, ``choose_victims(need, now)`` and ``remove`` for each victim, then
``admit(model, size, penalty, now)``. Oracles get the trace's model ids as ``future``.

Without queueing, a request costs its model's load penalty on a miss and nothing on a
hit (``load_delay_seconds`` sums the penalties paid). With ``queueing=N`` the replay
follows the CremeBrulee testbed (paper Fig. 4) with N workers, and the agent's cache:
requests wait in one FIFO queue for a worker, and cache decisions happen when one takes
a worker (``now`` = then). A hit executes for ``exec_seconds``; a miss loads the model
(its penalty), then executes; the request holds its worker throughout. A model being
loaded, or waiting for room, is a hit that waits for that load (single flight). A load
reserves its bytes all or nothing; when models with requests in flight (never evicted)
hold the room it needs, it waits in the *room queue* (FIFO, as the agent's) until enough
of them finish, while hits go on being served. The model is admitted when its load
ends, as in the agent.

With a disk capacity, a miss crosses three tiers (``cachepolicies.tiers``): the files
first (a download when they are not on disk), then the memory reservation and the load;
the replay is then the Python one (``_replay``), and in the queueing replay a miss waits
for its download before it queues for room.

Both loops below drive ``cachepolicies.pool.MemoryPool``, the miss path the node agent's
cache drives too (reserve all or nothing → commit; one ``miss_penalty``). The policies'
decisions are compiled kernels, and so is the plain replay (``replay.replay``): a
compiled copy of ``_replay`` for speed, held equal to it decision by decision by a
property test (``test_the_compiled_loop_decides_as_the_python_verbs``). The queueing
replay runs in Python only, on the pool itself.
"""

from __future__ import annotations

import gc
import heapq
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from cachepolicies import replay
from cachepolicies.base import Policy
from cachepolicies.pool import MemoryPool, PolicyContractError
from cachepolicies.registry import make_policy
from cachepolicies.tiers import DiskTier, check_disk_capacity
from cachepolicies.traces import Profiles, Trace, check_capacity


@dataclass(frozen=True)
class SimulationResult:
    """What one (policy, capacity) replay measured; ``to_dict`` is the JSON object."""

    policy: str
    capacity_bytes: int
    requests: int
    hits: int
    misses: int
    load_delay_seconds: float  # sum of load penalties paid on misses
    mean_load_delay_seconds: float  # per request
    evictions: int
    bytes_loaded: int
    workers: int | None = None  # queueing mode only, like the two below
    mean_response_seconds: float | None = None
    p99_response_seconds: float | None = None
    disk_capacity_bytes: int | None = None  # with a disk tier only, like the five below
    disk_policy: str | None = None
    downloads: int | None = None
    bytes_downloaded: int | None = None
    download_delay_seconds: float | None = None  # part of load_delay_seconds
    disk_evictions: int | None = None

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, object]:
        """The fields as a JSON-ready dict; queueing and disk fields only in those modes."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def simulate(
    trace: Trace,
    profiles: Profiles,
    capacity_bytes: int,
    policy_spec: str,
    *,
    seed: int = 0,
    queueing: int | None = None,
    disk_capacity: int | None = None,
    disk_policy: str | None = None,
) -> SimulationResult:
    """Replay ``trace`` with the policy ``policy_spec`` names under ``capacity_bytes``.

    ``queueing`` is None (count load delay only) or the number of workers N >= 1 (also
    measure response times). ``disk_capacity`` (bytes) adds the disk tier, starting
    empty, under ``disk_policy`` (default: ``policy_spec``); None: every model's files
    are on disk throughout. Raises ``SimulationInputError`` before the run when a
    requested model is larger than the whole capacity (or disk).
    """
    capacity_bytes = int(capacity_bytes)
    check_capacity(trace, profiles, capacity_bytes)
    if queueing is not None and queueing < 1:
        raise ValueError(f"queueing needs at least 1 worker, got {queueing}")
    policy = make_policy(policy_spec, future=trace.model_ids, seed=seed)
    disk = None
    if disk_capacity is not None:
        disk_capacity = int(disk_capacity)
        check_disk_capacity(trace, profiles, disk_capacity)
        disk_policy = disk_policy or policy_spec
        disk = DiskTier(disk_capacity, make_policy(disk_policy, future=trace.model_ids,
                                                   seed=seed), profiles)
    # The cycle collector would only cost time here; cycles, if any, go after the run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        response = None
        if queueing is not None:
            counts, response = _replay_queued(trace, profiles, capacity_bytes, policy, queueing,
                                              disk)
        elif disk is None and _runs_compiled(policy):
            counts = _replay_compiled(trace, profiles, capacity_bytes, policy)
        else:
            counts = _replay(trace, profiles, capacity_bytes, policy, disk)
    finally:
        if collecting:
            gc.enable()
    misses, evictions, bytes_loaded, delay = counts
    tier = {} if disk is None else {"disk_capacity_bytes": disk_capacity,
                                    "disk_policy": disk_policy, **disk.totals()}
    if disk is not None:
        delay += tier["download_delay_seconds"]
    requests = len(trace)
    return SimulationResult(
        policy=policy_spec,
        capacity_bytes=capacity_bytes,
        requests=requests,
        hits=requests - misses,
        misses=misses,
        load_delay_seconds=delay,
        mean_load_delay_seconds=delay / requests if requests else 0.0,
        evictions=evictions,
        bytes_loaded=bytes_loaded,
        workers=queueing,
        mean_response_seconds=_stat(response, np.mean),
        p99_response_seconds=_stat(response, lambda r: np.percentile(r, 99)),
        **tier,
    )


def _stat(response: np.ndarray | None, statistic) -> float | None:
    """A statistic of the response times; None without queueing, 0 without requests."""
    if response is None:
        return None
    return float(statistic(response)) if response.size else 0.0


def sweep(
    trace: Trace,
    profiles: Profiles,
    capacities: Sequence[int],
    policy_specs: Sequence[str],
    *,
    seed: int = 0,
    queueing: int | None = None,
    progress: bool = True,
    disk_capacity: int | None = None,
    disk_policy: str | None = None,
) -> list[SimulationResult]:
    """``simulate`` for every (policy, capacity), policy-major, one after the other.

    All specs and capacities are checked before the first run; ``progress`` shows a
    tqdm bar on stderr.
    """
    for spec in [*policy_specs, *([disk_policy] if disk_policy else [])]:
        make_policy(spec, future=(), seed=seed)  # raises on a bad spec, before any run
    for capacity in capacities:
        check_capacity(trace, profiles, int(capacity))
    if disk_capacity is not None:
        check_disk_capacity(trace, profiles, int(disk_capacity))
    runs = [(spec, int(capacity)) for spec in policy_specs for capacity in capacities]
    results = []
    bar = tqdm(runs, desc="simulate", unit="run", file=sys.stderr, disable=not progress)
    for spec, capacity in bar:
        bar.set_postfix_str(f"{spec} @ {capacity} B", refresh=False)
        results.append(
            simulate(trace, profiles, capacity, spec, seed=seed, queueing=queueing,
                     disk_capacity=disk_capacity, disk_policy=disk_policy)
        )
    return results


_VERBS = ("record_access", "admit", "choose_victims", "remove")


def _runs_compiled(policy: Policy) -> bool:
    """True when the policy's verbs are the kernel-backed ones, not Python overrides."""
    return all(name not in vars(policy) and getattr(type(policy), name) is getattr(Policy, name)
               for name in _VERBS)


def _replay_compiled(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy
) -> tuple[int, int, int, float]:
    """``_replay`` by the compiled loop."""
    table = policy._intern_all(np.arange(len(profiles)))  # model id -> policy id
    ids = table[trace.model_ids]
    times = np.ascontiguousarray(trace.timestamps, dtype=np.float64)

    def by_id(column: np.ndarray) -> np.ndarray:
        out = np.zeros(policy._capacity, column.dtype)
        out[table] = column
        return out

    size, penalty = by_id(profiles.size_bytes), by_id(profiles.penalty_seconds)
    trims = policy.trims_eviction_set
    loads, status = replay.replay(policy._state, trims, ids, times, size, penalty, capacity)
    if status == replay.TOO_LITTLE:
        raise PolicyContractError(f"{policy.name}'s victims freed too little")
    if status != replay.DONE:
        raise policy._out_of_step(int(trace.model_ids[status]))
    return _totals(loads[table], profiles, resident_count=len(policy))


def _replay(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy,
    disk: DiskTier | None = None,
) -> tuple[int, int, int, float]:
    """The replay loop: (misses, evictions, bytes loaded, load delay) for one replay
    (with ``disk``, the delay of the loads only: the downloads are the tier's)."""
    sizes = profiles.size_bytes.tolist()
    penalties = profiles.penalty_seconds.tolist()
    pool = MemoryPool(capacity, policy)
    loads = [0] * len(sizes)  # misses per model
    record = policy.record_access
    for key, now in zip(trace.model_ids.tolist(), trace.timestamps.tolist()):
        record(key, now)
        if disk is not None:
            disk.record_access(key, now)
        if key in pool:
            continue
        if disk is not None:
            disk.fetch(key, now, pool)
        pool.reserve(sizes[key], now)  # everything is evictable: never None
        penalty = penalties[key] if disk is None else disk.penalty(key)
        pool.commit(key, sizes[key], sizes[key], penalty, now)
        loads[key] += 1
    return _totals(loads, profiles, resident_count=len(pool.sizes))


def _totals(
    loads: list[int] | np.ndarray, profiles: Profiles, resident_count: int
) -> tuple[int, int, int, float]:
    """(misses, evictions, bytes loaded, load delay) from the loads per model.

    Every load but those still resident at the end was evicted exactly once.
    """
    counts = np.asarray(loads, dtype=np.int64)
    misses = int(counts.sum())
    loaded = int(counts @ profiles.size_bytes)
    delay = float(counts @ profiles.penalty_seconds)
    return misses, misses - resident_count, loaded, delay


_ARRIVE, _LOADED, _FINISH, _PULLED = 0, 1, 2, 3  # event kinds, in the order ties are handled


def _replay_queued(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy, workers: int,
    disk: DiskTier | None = None,
) -> tuple[tuple[int, int, int, float], np.ndarray]:
    """The N-worker replay of the module docstring, as discrete events (arrivals, loads
    done, requests done, downloads done); also returns response times. With ``disk``, a
    miss whose files are not on disk downloads them before it queues for room (the
    delay returned is the loads')."""
    sizes = profiles.size_bytes.tolist()
    penalties = profiles.penalty_seconds.tolist()
    exec_seconds = profiles.exec_seconds.tolist()
    model_of = trace.model_ids.tolist()
    arrivals = trace.timestamps.tolist()
    n_models = len(sizes)
    pool = MemoryPool(capacity, policy)
    loading: dict[int, list[int]] = {}   # model -> requests waiting for its load
    in_flight = [0] * n_models           # requests started, not finished, per model
    room_queue: deque[int] = deque()     # models whose load waits for room, FIFO
    ready: deque[int] = deque()          # requests waiting for a worker, FIFO
    free_workers = workers
    loads = [0] * n_models
    response = np.empty(len(trace))
    events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, request/model)
    seq = 0

    def schedule(at: float, kind: int, what: int) -> None:
        nonlocal seq
        heapq.heappush(events, (at, kind, seq, what))
        seq += 1

    def evictable(key: int) -> bool:
        return in_flight[key] == 0

    def grant(now: float) -> None:
        while room_queue:
            model = room_queue[0]
            if pool.reserve(sizes[model], now, evictable) is None:
                return  # until a request on a resident model finishes
            room_queue.popleft()
            loads[model] += 1
            schedule(now + penalties[model], _LOADED, model)

    def start(i: int, now: float) -> None:
        nonlocal free_workers
        free_workers -= 1
        model = model_of[i]
        policy.record_access(model, now)
        if disk is not None:
            disk.record_access(model, now)
        in_flight[model] += 1
        if model in pool:
            schedule(now + exec_seconds[model], _FINISH, i)
        elif model in loading:  # single flight: wait for the load under way or queued
            loading[model].append(i)
        else:
            loading[model] = [i]
            pull = 0.0 if disk is None else disk.fetch(model, now, pool, loading.__contains__)
            if pull > 0:
                schedule(now + pull, _PULLED, model)
            else:
                room_queue.append(model)
                grant(now)

    for i, arrival in enumerate(arrivals):
        schedule(arrival, _ARRIVE, i)
    while events:
        now, kind, _, what = heapq.heappop(events)
        if kind == _ARRIVE:
            if free_workers:
                start(what, now)
            else:
                ready.append(what)
        elif kind == _LOADED:
            size = sizes[what]
            penalty = penalties[what] if disk is None else disk.penalty(what)
            pool.commit(what, size, size, penalty, now)
            for i in loading.pop(what):
                schedule(now + exec_seconds[what], _FINISH, i)
        elif kind == _PULLED:
            room_queue.append(what)
            grant(now)
        else:
            model = model_of[what]
            in_flight[model] -= 1
            response[what] = now - arrivals[what]
            free_workers += 1
            if ready:
                start(ready.popleft(), now)
            if room_queue and in_flight[model] == 0:
                grant(now)
    return _totals(loads, profiles, resident_count=len(pool.sizes)), response
