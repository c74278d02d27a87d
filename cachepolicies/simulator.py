"""Trace-driven cache simulation: replay a trace against one policy under a byte budget.

The simulator owns the budget and drives the policy through its four verbs only, as the
node agent's cache does: ``record_access`` on every request; on a miss, when the model
does not fit, ``choose_victims(need, now)`` and ``remove`` for each victim, then
``admit(model, size, penalty, now)``. Oracles get the trace's model ids as ``future``.

Without queueing, a request costs its model's load penalty on a miss and nothing on a
hit (``load_delay_seconds`` sums the penalties paid). With ``queueing`` (a
``cachepolicies.twin.Queueing``) the replay is the agent's twin (``cachepolicies.twin``):
load slots, the room queue, loads holding their peak, single flight, per-model workers
and batching, as the node agent's cache and batcher do them; it adds response times.

With a disk capacity, a miss crosses three tiers (``cachepolicies.tiers``): the files
first (a download when they are not on disk), then the memory reservation and the load;
the replay is then the Python one (``_replay``), and in the twin a miss downloads its
files before it asks for a load slot, as the agent's load task does.

Both loops below drive ``cachepolicies.pool.MemoryPool``, the miss path the node agent's
cache drives too (reserve all or nothing → commit; one ``miss_penalty``). The policies'
decisions are compiled kernels, and so is the plain replay (``replay.replay``): a
compiled copy of ``_replay`` for speed, held equal to it decision by decision by a
property test (``test_the_compiled_loop_decides_as_the_python_verbs``). A process may
pass ``native`` instead (``cachepolicies.native``: the same loop and kernels compiled
ahead of time, loaded without numba): the plain replay then builds its own state there
from the policy's ``state_parameters``. The twin runs in Python only, on the pool itself.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType

import numpy as np

from cachepolicies import replay, twin
from cachepolicies.base import Policy
from cachepolicies.pool import MemoryPool, PolicyContractError
from cachepolicies.registry import make_policy, parse_policy_spec
from cachepolicies.tiers import DiskBooks, check_disk_capacity
from cachepolicies.traces import Profiles, Trace, check_capacity
from cachepolicies.twin import Queueing


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
    workers: int | None = None  # queueing mode (the twin) only, like those below
    load_concurrency: int | None = None
    load_wait_seconds: float | None = None  # loads' waits for a slot or room, in all
    failed: int | None = None  # requests answered 503 (a load gave up; cold rejects)
    mean_response_seconds: float | None = None  # of the requests served
    p95_response_seconds: float | None = None
    p99_response_seconds: float | None = None
    slo_violations: int | None = None  # served later than the SLO, or failed
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
    queueing: Queueing | None = None,
    disk_capacity: int | None = None,
    disk_policy: str | None = None,
    native: Mapping[str, ModuleType] | None = None,
    directives: Sequence[twin.Directive] = (),
) -> SimulationResult:
    """Replay ``trace`` with the policy ``policy_spec`` names under ``capacity_bytes``.

    ``queueing`` is None (count load delay only) or the agent settings the twin replays
    (also measure response times). ``disk_capacity`` (bytes) adds the disk tier, starting
    empty, under ``disk_policy`` (default: ``policy_spec``); None: every model's files
    are on disk throughout. ``native`` maps policy names to their ahead-of-time replays
    (``cachepolicies.native.ensure``), which a plain replay of those policies runs.
    ``directives``: a coordinator's pins and prefetches at their times (the twin only:
    ``queueing`` given; ValueError otherwise).
    Raises ``SimulationInputError`` before the run when a requested model is larger
    than the whole capacity (or disk).
    """
    capacity_bytes = int(capacity_bytes)
    check_capacity(trace, profiles, capacity_bytes)
    if directives and queueing is None:
        raise ValueError("directives (pins, prefetches) are replayed by the twin only: "
                         "give queueing settings")
    plain = queueing is None and disk_capacity is None
    ahead = (native or {}).get(parse_policy_spec(policy_spec)[0]) if plain else None
    # A native replay builds its own state: the policy object only gives its parameters.
    policy = make_policy(policy_spec, future=() if ahead else trace.model_ids, seed=seed)
    disk = None
    if disk_capacity is not None:
        disk_capacity = int(disk_capacity)
        check_disk_capacity(trace, profiles, disk_capacity)
        disk_policy = disk_policy or policy_spec
        disk = DiskBooks(disk_capacity, make_policy(disk_policy, future=trace.model_ids,
                                                   seed=seed), profiles,
                        bandwidth=None if queueing is None else queueing.pull_bandwidth)
    # The cycle collector would only cost time here; cycles, if any, go after the run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        outcome = None
        if queueing is not None:
            outcome = twin.replay(trace, profiles, capacity_bytes, policy, queueing,
                                  disk=disk, directives=directives)
            counts = _totals(outcome.loads, profiles, resident_count=len(policy))
        elif ahead is not None:
            counts = _replay_native(ahead, trace, profiles, capacity_bytes, policy)
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
    timing = {} if outcome is None else _timing(outcome, queueing)
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
        **timing,
        **tier,
    )


def _timing(outcome: twin.Outcome, queueing: Queueing) -> dict[str, object]:
    """The twin's fields of a result."""
    return dict(workers=queueing.workers, load_concurrency=queueing.load_concurrency,
                load_wait_seconds=outcome.load_wait_seconds,
                **outcome.stats(queueing.slo_seconds))


def sweep(
    trace: Trace,
    profiles: Profiles,
    capacities: Sequence[int],
    policy_specs: Sequence[str],
    *,
    seed: int = 0,
    queueing: Queueing | None = None,
    progress: bool = True,
    disk_capacity: int | None = None,
    disk_policy: str | None = None,
    native: Mapping[str, ModuleType] | None = None,
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
    bar = _progress_bar(runs) if progress else None
    for spec, capacity in bar if bar is not None else runs:
        if bar is not None:
            bar.set_postfix_str(f"{spec} @ {capacity} B", refresh=False)
        results.append(
            simulate(trace, profiles, capacity, spec, seed=seed, queueing=queueing,
                     disk_capacity=disk_capacity, disk_policy=disk_policy, native=native)
        )
    return results


def _progress_bar(runs: list[tuple[str, int]]):
    """A tqdm bar over ``runs`` on stderr (tqdm is imported only for one)."""
    from tqdm import tqdm

    return tqdm(runs, desc="simulate", unit="run", file=sys.stderr)


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


def _replay_native(
    module: ModuleType, trace: Trace, profiles: Profiles, capacity: int, policy: Policy
) -> tuple[int, int, int, float]:
    """``_replay_compiled`` by the policy's ahead-of-time replay, on model ids as ids."""
    loads, status, resident = module.replay(
        policy.state_parameters, np.ascontiguousarray(trace.model_ids, dtype=np.int64),
        np.ascontiguousarray(trace.timestamps, dtype=np.float64),
        np.ascontiguousarray(profiles.size_bytes, dtype=np.int64),
        np.ascontiguousarray(profiles.penalty_seconds, dtype=np.float64), capacity,
        policy.trims_eviction_set)
    if status == replay.TOO_LITTLE:
        raise PolicyContractError(f"{policy.name}'s victims freed too little")
    if status != replay.DONE:
        raise policy._out_of_step(int(trace.model_ids[status]))
    return _totals(loads, profiles, resident_count=int(resident))


def _replay(
    trace: Trace, profiles: Profiles, capacity: int, policy: Policy,
    disk: DiskBooks | None = None,
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
