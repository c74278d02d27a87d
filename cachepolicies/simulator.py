"""Trace-driven cache simulation: replay a trace against one policy under a byte budget.

The simulator owns the budget and drives the policy through its four verbs only, as the
node agent's cache does: ``record_access`` on every request; on a miss, when the model
does not fit, ``choose_victims(need, now)`` and ``remove`` for each victim, then
``admit(model, size, penalty, now)``. Oracles get the trace's model ids as ``future``.

Without queueing, a request costs its model's load penalty on a miss and nothing on a
hit (``load_delay_seconds`` sums the penalties paid). With ``queueing=N`` the replay
follows the CremeBrulee testbed (paper Fig. 4) with N workers: requests wait in one FIFO
queue; at the head, a request takes the first free worker at ``start`` (cache decisions
happen then, with ``now = start``). A hit executes for ``exec_seconds``; a miss first
loads the model (its penalty), then executes. A model being loaded by an earlier
request is a hit that waits for that load (single flight), and a model with requests in
flight is never evicted. When in-flight models pin so much memory that the new one
cannot fit, the head of the queue waits until enough of them finish.

The policies' decisions are compiled kernels, and so is the replay (``replay``): the
loops below are what it does, spelled in Python; they drive a policy whose verbs were
overridden in Python (a subclass, a test's spy), so its overrides are honoured.
"""

from __future__ import annotations

import gc
import heapq
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from cachepolicies import replay
from cachepolicies.base import InsufficientSpace, Policy
from cachepolicies.registry import make_policy
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

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, object]:
        """The fields as a JSON-ready dict; queueing fields only in queueing mode."""
        return {k: v for k, v in asdict(self).items() if v is not None}


class PolicyContractError(RuntimeError):
    """A policy broke its contract (e.g. victims that free too little)."""


def simulate(
    trace: Trace,
    profiles: Profiles,
    capacity_bytes: int,
    policy_spec: str,
    *,
    seed: int = 0,
    queueing: int | None = None,
) -> SimulationResult:
    """Replay ``trace`` with the policy ``policy_spec`` names under ``capacity_bytes``.

    ``queueing`` is None (count load delay only) or the number of workers N >= 1 (also
    measure response times). Raises ``SimulationInputError`` before the run when a
    requested model is larger than the whole capacity.
    """
    capacity_bytes = int(capacity_bytes)
    check_capacity(trace, profiles, capacity_bytes)
    if queueing is not None and queueing < 1:
        raise ValueError(f"queueing needs at least 1 worker, got {queueing}")
    policy = make_policy(policy_spec, future=trace.model_ids, seed=seed)
    # The cycle collector would only cost time here; cycles, if any, go after the run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if _runs_compiled(policy):
            counts, response = _replay_compiled(trace, profiles, capacity_bytes, policy, queueing)
        elif queueing is None:
            counts = _replay(trace, profiles, capacity_bytes, policy)
            response = None
        else:
            counts, response = _replay_queued(trace, profiles, capacity_bytes, policy, queueing)
    finally:
        if collecting:
            gc.enable()
    misses, evictions, bytes_loaded, delay = counts
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
) -> list[SimulationResult]:
    """``simulate`` for every (policy, capacity), policy-major, one after the other.

    All specs and capacities are checked before the first run; ``progress`` shows a
    tqdm bar on stderr.
    """
    for spec in policy_specs:
        make_policy(spec, future=(), seed=seed)  # raises on a bad spec, before any run
    for capacity in capacities:
        check_capacity(trace, profiles, int(capacity))
    runs = [(spec, int(capacity)) for spec in policy_specs for capacity in capacities]
    results = []
    bar = tqdm(runs, desc="simulate", unit="run", file=sys.stderr, disable=not progress)
    for spec, capacity in bar:
        bar.set_postfix_str(f"{spec} @ {capacity} B", refresh=False)
        results.append(
            simulate(trace, profiles, capacity, spec, seed=seed, queueing=queueing)
        )
    return results


_VERBS = ("record_access", "admit", "choose_victims", "remove")


def _runs_compiled(policy: Policy) -> bool:
    """True when the policy's verbs are the kernel-backed ones, not Python overrides."""
    return all(name not in vars(policy) and getattr(type(policy), name) is getattr(Policy, name)
               for name in _VERBS)


def _replay_compiled(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy, workers: int | None
) -> tuple[tuple[int, int, int, float], np.ndarray | None]:
    """``_replay`` (``workers`` None) or ``_replay_queued`` by the compiled loops."""
    table = policy._intern_all(np.arange(len(profiles)))  # model id -> policy id
    ids = table[trace.model_ids]
    times = np.ascontiguousarray(trace.timestamps, dtype=np.float64)

    def by_id(column: np.ndarray) -> np.ndarray:
        out = np.zeros(policy._capacity, column.dtype)
        out[table] = column
        return out

    size, penalty = by_id(profiles.size_bytes), by_id(profiles.penalty_seconds)
    trims = policy.trims_eviction_set
    if workers is None:
        loads, status = replay.replay(policy._state, trims, ids, times, size, penalty,
                                      capacity)
        response = None
    else:
        loads, response, status = replay.replay_queued(
            policy._state, trims, ids, times, size, penalty, by_id(profiles.exec_seconds),
            capacity, workers)
    if status == replay.TOO_LITTLE:
        raise PolicyContractError(f"{policy.name}'s victims freed too little")
    if status != replay.DONE:
        raise policy._out_of_step(int(trace.model_ids[status]))
    return _totals(loads[table], profiles, resident_count=len(policy)), response


def _replay(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy
) -> tuple[int, int, int, float]:
    """The replay loop: (misses, evictions, bytes loaded, load delay) for one replay."""
    sizes = profiles.size_bytes.tolist()
    resident = [False] * len(sizes)
    loads = [0] * len(sizes)  # misses per model
    penalties = profiles.penalty_seconds.tolist()
    record = policy.record_access
    choose = policy.choose_victims
    remove = policy.remove
    admit = policy.admit
    used = 0
    for key, now in zip(trace.model_ids.tolist(), trace.timestamps.tolist()):
        record(key, now)
        if resident[key]:
            continue
        size = sizes[key]
        used += size
        if used > capacity:
            for victim in choose(used - capacity, now):
                remove(victim)
                resident[victim] = False
                used -= sizes[victim]
            if used > capacity:
                raise PolicyContractError(f"{policy.name}'s victims freed too little")
        admit(key, size, penalties[key], now)
        resident[key] = True
        loads[key] += 1
    return _totals(loads, profiles, resident_count=sum(resident))


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


def _replay_queued(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy, workers: int
) -> tuple[tuple[int, int, int, float], np.ndarray]:
    """The FIFO N-worker replay of the module docstring; also returns response times."""
    sizes = profiles.size_bytes.tolist()
    penalties = profiles.penalty_seconds.tolist()
    exec_seconds = profiles.exec_seconds.tolist()
    n_models = len(sizes)
    resident = [False] * n_models
    ready_at = [0.0] * n_models  # when the model's load completes
    busy_until = [-math.inf] * n_models  # when its last in-flight request finishes
    free_at = [0.0] * workers  # min-heap of worker free times
    response = np.empty(len(trace))
    loads = [0] * n_models
    used = 0
    start = -math.inf

    def evictable(key: int) -> bool:
        return busy_until[key] <= start

    for i, (key, arrival) in enumerate(zip(trace.model_ids.tolist(), trace.timestamps.tolist())):
        start = max(arrival, heapq.heappop(free_at), start)
        policy.record_access(key, start)
        if resident[key]:
            finish = max(start, ready_at[key]) + exec_seconds[key]
        else:
            size = sizes[key]
            while used + size > capacity:
                try:
                    victims = policy.choose_victims(used + size - capacity, start, evictable)
                except InsufficientSpace:
                    # Everything evictable is too little: wait for in-flight requests.
                    start = min(t for k in policy.resident() if (t := busy_until[k]) > start)
                    continue
                for victim in victims:
                    policy.remove(victim)
                    resident[victim] = False
                    used -= sizes[victim]
            penalty = penalties[key]
            policy.admit(key, size, penalty, start)
            resident[key] = True
            used += size
            loads[key] += 1
            ready_at[key] = start + penalty
            finish = ready_at[key] + exec_seconds[key]
        busy_until[key] = max(busy_until[key], finish)
        heapq.heappush(free_at, finish)
        response[i] = finish - arrival
    return _totals(loads, profiles, resident_count=sum(resident)), response

