"""The inference path of a request, between the HTTP handlers and the backends:

deadline → cache lease (a cold model: wait for its load, and for room for it) →
prediction cache → admission (tail drop, bouncer) → the model's batcher → answer.

Cold start (``cold_start``): ``serve`` (default) waits for the load even past the SLO
(a late answer counts as an SLO violation) and skips admission once loaded: a request
admitted to wait for a load was admitted; the queue that built up during the load
drains. ``reject`` answers 503 at once when the model's expected load outlasts the
deadline, and loads it in the background so that a retry finds it ready.

One ``ModelRuntime`` per model version holds what outlives a load (tuner and its
measurements, statistics, worker count, prediction cache); its ``ModelBatcher`` exists
while the version is loaded. The handler's cache lease covers the time a request waits
in the queue, so a model with queued or running requests is never unloaded; whatever is
still queued when a model is unloaded or the agent stops gets an explicit 503.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from agent import tracing
from agent.backends.base import InvalidInput
from agent.config import AgentConfig, ModelConfig
from agent.errors import http_status
from agent.node.admission import Deadline, QueueState, Shed, admit, deadline_for
from agent.node.batch_tuner import BatchTuner, TunerSettings
from agent.node.batching import (ModelBatcher, Pending, backend_parameters, batch_key,
                                 has_batch_dimension, rows_of)
from agent.node.cache import CacheError, ModelCache
from agent.node.cache.entry import Entry
from agent.node.latency_stats import LatencyWindow, RateMeter
from agent.node.cache.lifecycle import State
from agent.node.call import Call
from agent.node.prediction_cache import PredictionCache, input_digest
from agent.node.record import RequestRecord
from agent.node.stats import ModelStats
from agent.node.tensors import Limits

log = logging.getLogger("edgeagent.serving")

#: Share of the SLO a request's predicted finish must leave before its deadline
#: (predictions are at the SLO's percentile already: ``BatchProfile.predict_high``).
ADMISSION_MARGIN = 0.05


@dataclass(frozen=True)
class ServingSettings:
    """A model's SLO, batching, queue and prediction cache settings: its config.yaml
    where it says, the agent config's defaults elsewhere."""

    slo: float                 # seconds
    percentile: float
    max_batch_size: int        # < 2: never batched
    batching: bool
    tuner: TunerSettings
    max_queue: int
    workers: int
    prediction_cache: bool
    prediction_cache_bytes: int
    cold_start: str = "serve"
    max_request_rows: int = 2048


#: Rows one request may carry when neither the model nor the agent sets
#: ``max_request_rows``: this many times the model's ``max_batch_size``, at least
#: ``MIN_REQUEST_ROWS`` (a request is split into batches, but decoded whole).
REQUEST_ROWS_FACTOR = 64
MIN_REQUEST_ROWS = 1024


def resolve_settings(model: ModelConfig, agent: AgentConfig) -> ServingSettings:
    def pick(mine: Any, server: Any) -> Any:
        return server if mine is None else mine

    b, sb = model.batching, agent.batching
    pc, spc = model.prediction_cache, agent.prediction_cache
    model_slo = model.slo or agent.slo
    slo, percentile = model_slo.latency_ms / 1000, model_slo.percentile
    max_batch = pick(model.max_batch_size, sb.max_batch_size)
    enabled = bool(pick(b.enabled, sb.enabled)) and max_batch >= 2
    tuner = TunerSettings(
        max_batch_size=max(max_batch, 1), slo=slo,
        budget_fraction=pick(b.budget_fraction, sb.budget_fraction),
        aimd_step=pick(b.aimd_step, sb.aimd_step),
        window_max=pick(b.window_ms_max, sb.window_ms_max) / 1000,
        adaptive=bool(pick(b.adaptive, sb.adaptive)), percentile=percentile)
    return ServingSettings(
        slo=slo, percentile=percentile, max_batch_size=max_batch, batching=enabled,
        tuner=tuner, max_queue=pick(model.max_queue, agent.max_queue),
        workers=pick(b.workers, sb.workers),
        prediction_cache=bool(pick(pc.enabled, spc.enabled)),
        prediction_cache_bytes=pick(pc.max_bytes, spc.max_bytes),
        cold_start=pick(model.cold_start, agent.cold_start),
        max_request_rows=pick(model.max_request_rows, agent.max_request_rows)
        or max(REQUEST_ROWS_FACTOR * max_batch, MIN_REQUEST_ROWS))


class ModelRuntime:
    """What the agent knows about serving one model version, across its loads."""

    def __init__(self, key: str, settings: ServingSettings) -> None:
        self.key = key
        self.settings = settings
        #: Told the runs it measures (``ModelCache.measured_runs`` of its loaded entry).
        self.measured: Callable[..., None] = lambda **runs: None
        self.tuner = BatchTuner(settings.tuner)
        self.latencies = LatencyWindow()
        self.offered = RateMeter()
        self.served = self.slo_violations = self.batches = self.batch_rows = 0
        self.drops: Counter[str] = Counter()
        self.batch_seconds: dict[int, float] = {}
        self.workers = settings.workers
        self.workers_set = False  # changed through the admin API: config no longer rules
        self.batcher: ModelBatcher | None = None
        self.prediction_cache: PredictionCache | None = None
        self.stats = ModelStats()  # Triton's statistics extension (agent.node.stats)
        #: This load's first batch is its cold first run (its warm-up failed).
        self.cold_run_pending = False
        #: A warm run is to be told once measured (its entry has none yet).
        self.warm_run_pending = False

    def configure(self, settings: ServingSettings) -> None:
        self.settings = settings
        self.tuner.configure(settings.tuner)
        if not self.workers_set:
            self.workers = settings.workers
        if settings.prediction_cache:
            if self.prediction_cache is None:
                self.prediction_cache = PredictionCache(settings.prediction_cache_bytes)
            self.prediction_cache.max_bytes = settings.prediction_cache_bytes
        elif self.prediction_cache is not None:
            self.prediction_cache.clear()
            self.prediction_cache = None

    def on_batch(self, rows: int, seconds: float) -> None:
        self.batches += 1
        self.batch_rows += rows
        if self.cold_run_pending:  # its reload penalty's first run, from now on
            self.cold_run_pending = False
            self.measured(first=seconds)
        elif self.warm_run_pending:
            warm = self.warm_run_seconds()
            if warm is not None:
                self.warm_run_pending = False
                self.measured(warm=warm)

    def loaded(self, measured: Callable[..., None], *, cold_run: bool,
               warm_known: bool) -> None:
        """A load of the model, whose runs ``measured`` is told: ``cold_run``, its
        warm-up failed (the first batch is the cold run); ``warm_known``, its entry knows
        a warm run already."""
        self.measured = measured
        self.cold_run_pending, self.warm_run_pending = cold_run, not warm_known

    def warm_run_seconds(self) -> float | None:
        """A warm run of one row, as measured (None: not yet): the twin's
        ``exec_seconds`` and the warm run of the cache's penalty."""
        profile = self.tuner.profile
        one, line = profile.typical(1), profile.line()
        if one is None and line is not None:
            one = line[0] + line[1]
        return one

    def record(self, seconds: float) -> None:
        self.served += 1
        self.latencies.add(seconds)
        if seconds > self.settings.slo:
            self.slo_violations += 1

    def describe(self, now: float) -> dict[str, Any]:
        """Batching, latency and SLO figures for ``/v1/cache/{name}`` (times in ms)."""
        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1000, 3)

        s, b, tuner = self.settings, self.batcher, self.tuner
        batched = b.batchable if b is not None else s.batching
        pct = self.latencies.percentiles((50, 95, 99, s.percentile))
        pc = self.prediction_cache
        return {
            "slo_latency_ms": ms(s.slo), "slo_percentile": s.percentile,
            "batching": batched, "adaptive": s.tuner.adaptive,
            "max_batch_size": s.max_batch_size,
            "batch_limit": (b.limit if b is not None else tuner.limit) if batched else 1,
            "batch_target": min(tuner.target, tuner.limit) if batched else 1,
            "batch_window_ms": ms(tuner.window) if batched else 0.0,
            "workers": b.workers if b is not None else self.workers,
            "queue_length": len(b.queue) if b is not None else 0,
            "max_queue": s.max_queue,
            "arrival_rate": round(self.offered.rate(now), 3),
            "batches": self.batches,
            "mean_batch_size": round(self.batch_rows / self.batches, 3) if self.batches else None,
            "batch_ms_by_size": {str(k): ms(v) for k, v in tuner.profile.means().items()},
            "latency_ms": {"p50": ms(pct[50]), "p95": ms(pct[95]), "p99": ms(pct[99])},
            "latency_at_slo_percentile_ms": ms(pct[s.percentile]),
            "requests_served": self.served, "slo_violations": self.slo_violations,
            "drops": dict(sorted(self.drops.items())), "drops_total": sum(self.drops.values()),
            "prediction_cache": pc.describe() if pc is not None else None,
        }


class Serving:
    """Runs requests through admission, prediction caches and per-model batchers."""

    def __init__(self, cache: ModelCache, config: AgentConfig, executor: Executor | None,
                 *, clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.cache, self.config, self.executor, self.clock = cache, config, executor, clock
        #: The last requests answered, for the twin (``GET /v1/trace``).
        self.record = RequestRecord(config.record_requests, wall_clock=wall_clock)
        self.runtimes: dict[tuple[str, int], ModelRuntime] = {}
        self.accepting = True
        self._background: set[asyncio.Task] = set()
        self._deadline_timer: asyncio.TimerHandle | None = None

    # -- runtimes --------------------------------------------------------------------
    def runtime(self, entry: Entry) -> ModelRuntime:
        rt = self.runtimes.get((entry.name, entry.version))
        if rt is None:
            rt = ModelRuntime(entry.key, resolve_settings(entry.spec.config, self.config))
            self.runtimes[(entry.name, entry.version)] = rt
        return rt

    def request_limits(self, name: str, version: int | None) -> Limits:
        """What one request for ``name`` may decode to: the model's ``max_request_rows``
        and the agent's ``max_tensor_bytes`` (the agent's defaults for a model it does
        not know: that request answers 404 once decoded)."""
        try:
            rows = self.runtime(self.cache.entry(name, version)).settings.max_request_rows
        except CacheError:
            rows = resolve_settings(ModelConfig(), self.config).max_request_rows
        return Limits(max_rows=rows, max_bytes=self.config.max_tensor_bytes)

    def refresh(self, config: AgentConfig | None = None) -> None:
        """Re-resolve every runtime's settings (SIGHUP, rescan)."""
        if config is not None:
            self.config = config
        for (name, version), rt in self.runtimes.items():
            spec = self.cache.specs.get(name)
            if spec is not None:
                rt.configure(resolve_settings(spec.config, self.config))
                if rt.batcher is not None:
                    rt.batcher.batchable = rt.batcher.batchable and rt.settings.batching

    def model_loaded(self, entry: Entry) -> None:
        """``entry`` is READY: its batcher starts (the node hears it from the cache)."""
        rt = self.runtime(entry)
        rt.configure(resolve_settings(entry.spec.config, self.config))
        backend = entry.backend
        batchable = rt.settings.batching and has_batch_dimension(backend.inputs,
                                                                 backend.outputs)
        rt.batcher = ModelBatcher(entry.key, backend, self.executor, rt.tuner,
                                  batchable=batchable, workers=rt.workers, clock=self.clock,
                                  on_batch=rt.on_batch, stats=rt.stats)
        rt.loaded(functools.partial(self.cache.measured_runs, entry),
                  cold_run=backend.warm_up_failed,
                  warm_known=entry.account.warm_run_seconds is not None)
        log.info("serving %s: %s, SLO %.0f ms (p%g), %d worker(s), queue bound %d%s",
                 entry.key, f"batched up to {rt.settings.max_batch_size}" if batchable
                 else "not batched", rt.settings.slo * 1000, rt.settings.percentile,
                 rt.workers, rt.settings.max_queue,
                 ", prediction cache" if rt.prediction_cache is not None else "")

    def model_unloaded(self, entry: Entry, reason: str) -> None:
        """``entry`` was unloaded: its batcher closes; its warm runs, measured while it
        was loaded, price its next miss (``ModelCache.measured_runs``)."""
        rt = self.runtimes.get((entry.name, entry.version))
        if rt is None:
            return
        rt.measured(warm=rt.warm_run_seconds())
        if rt.prediction_cache is not None:
            rt.prediction_cache.clear()
        batcher, rt.batcher = rt.batcher, None
        if batcher is not None:
            self._spawn(batcher.close(Shed(f"model {entry.key} was unloaded ({reason})",
                                           "unloaded")))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- requests --------------------------------------------------------------------
    async def infer(self, call: Call, *, expires: float = math.inf
                    ) -> tuple[Entry, dict[str, np.ndarray]]:
        """Serve one request for a model: (the entry that served it, its outputs).
        Its inputs are checked against the model's known signature before anything else
        (a bad request never causes a load), then against the loaded model's; every
        outcome is counted here (the model's statistics, the twin's record). ``expires``:
        after it the answer is useless (a selection app's cut), so a request still
        queued then is dropped rather than run."""
        entry = self.cache.entry(call.model, call.version)
        rt = self.runtime(entry)
        arrived, rows = call.arrived, call.inputs.rows
        known = entry.signature
        try:  # a request that cannot fit never causes a load
            inputs = call.inputs.against(known) if known is not None else None
        except InvalidInput:
            rt.stats.failed(self.clock() - arrived)
            raise
        try:
            rt.offered.add(self.clock())
            deadline = deadline_for(arrived, rt.settings.slo, call.timeout)
            if not self.accepting:
                raise Shed("the agent is shutting down", "shutdown")
            cold = entry.state is not State.READY
            if cold and rt.settings.cold_start == "reject":
                self._check_cold(entry, rt, deadline, rows)
            wait = max(deadline.left(self.clock()), 0.0) if deadline.hard else None
            async with self.cache.lease(call.model, call.version, timeout=wait) as entry:
                if inputs is None or entry.signature is not known:  # (re)loaded since
                    inputs = call.inputs.against(entry.backend.inputs)
                rows = rows_of(inputs)
                outputs, hit = await self._run(rt, inputs, call.parameters, deadline, cold,
                                               expires, arrived)
        except Exception as exc:
            if isinstance(exc, Shed):
                rt.drops[exc.reason] += 1
            rt.stats.failed(self.clock() - arrived)
            self.record.add(entry.key, rows, http_status(exc), self.clock() - arrived)
            raise
        seconds = self.clock() - arrived
        rt.record(seconds)
        rt.stats.succeeded(rows, seconds, cache_hit=hit)
        self.record.add(entry.key, rows, 200, seconds)
        return entry, outputs

    async def _run(self, rt: ModelRuntime, inputs: dict[str, np.ndarray],
                   parameters: dict[str, Any], deadline: Deadline, cold: bool,
                   expires: float, arrived: float) -> tuple[dict[str, np.ndarray], bool]:
        """The outputs (from the prediction cache where it has them) and whether they
        came from there."""
        params = backend_parameters(parameters)
        pc = rt.prediction_cache
        if pc is None:
            return await self._queue(rt, inputs, params, deadline, cold, expires), False
        outputs, hit = await pc.get_or_compute(
            input_digest(inputs, params),
            lambda: self._queue(rt, inputs, params, deadline, cold, expires))
        if not hit:
            rt.stats.cache_miss(self.clock() - arrived)
        return outputs, hit

    def statistics(self, entry: Entry) -> dict[str, Any]:
        """The model version's ``model_stats`` element (Triton's statistics extension)."""
        return self.runtime(entry).stats.as_json(entry.name, entry.version)
    def _check_cold(self, entry: Entry, rt: ModelRuntime, deadline: Deadline,
                    rows: int) -> None:
        """Reject at once a request that the model's expected load time makes late, and
        start that load so that a retry finds the model ready."""
        expected = entry.account.load_seconds + entry.account.first_run_seconds
        if expected > 0:  # and the pull first, where its files are not on disk
            expected += self.cache.download_seconds(entry)
        if expected <= 0 or entry.state is State.FAILED:
            return  # never loaded: unknown; it is checked again once loaded
        left = expected
        started = entry.life.load_started
        if entry.state is State.LOADING and started is not None:
            left = max(expected - (self.cache.clock() - started), 0.0)
        nothing_queued = QueueState(queued_rows=0, queued_requests=0, limit=1, workers=1,
                                    running_left=())
        try:
            admit(self.clock(), deadline, max(rows, 1), nothing_queued, rt.settings.max_queue,
                  rt.tuner.profile.predict_high, load_left=left,
                  margin=ADMISSION_MARGIN * rt.settings.slo)
        except Shed as exc:
            if entry.state is State.UNLOADED:
                self._spawn(self._load_quietly(entry))
            raise Shed(f"model {entry.key} is not loaded: its load takes about "
                       f"{expected:.3f}s, more than the request's deadline allows; retry "
                       "shortly", "cold", exc.retry_after) from None

    async def _load_quietly(self, entry: Entry) -> None:
        try:
            acquired = await self.cache.acquire(entry.name, entry.version)
        except CacheError as exc:
            log.info("background load of %s failed: %s", entry.key, exc)
            return
        self.cache.release(acquired)

    async def _queue(self, rt: ModelRuntime, inputs: dict[str, np.ndarray],
                     params: dict[str, Any], deadline: Deadline, cold: bool = False,
                     expires: float = math.inf) -> dict[str, np.ndarray]:
        """Admit (unless ``cold``: admitted when it arrived to wait for the load, only a
        hard deadline still applies) and run through the model's batcher."""
        batcher = rt.batcher
        if batcher is None:  # cannot happen under a lease; never hang if it does
            raise Shed(f"model {rt.key} is not loaded", "unloaded")
        if not self.accepting:
            raise Shed("the agent is shutting down", "shutdown")
        now = self.clock()
        rows = rows_of(inputs)
        idle = batcher.can_run_now()
        margin = ADMISSION_MARGIN * rt.settings.slo
        with tracing.span("edgeagent.admission", rt.key):  # tracing
            if deadline.hard or (not idle and not cold):  # an idle model admits all but
                admit(now, deadline, max(rows, 1), batcher.state(now),  # hopeless timeouts
                      rt.settings.max_queue if not cold else math.inf, batcher.predict,
                      margin=margin)
        future = asyncio.get_running_loop().create_future()
        if idle:  # run at once, alone: no batch to key it for, no dispatch to bound
            pending = Pending(inputs, params, rows, None, now, deadline, future,
                              expires=expires, trace=tracing.queued())  # tracing
            rt.tuner.observe_arrival(now, pending.weight)
            return await batcher.run_now(pending)
        full_batch = batcher.predict(max(batcher.limit, rows)) or 0.0
        pending = Pending(inputs, params, rows, batch_key(inputs, params), now, deadline,
                          future, dispatch_by=deadline.at - margin - full_batch,
                          expires=expires, trace=tracing.queued())  # tracing
        rt.tuner.observe_arrival(now, pending.weight)
        batcher.submit(pending)
        return await future

    # -- the twin's record --------------------------------------------------------------
    def profiles(self) -> list[dict[str, Any]]:
        """Each model version loaded at least once, as measured: its size, load and
        first-run seconds, warm batch seconds (one row, and each further row where two
        batch sizes were seen), its loads' mean time holding a load slot, its load peak,
        its serving settings and its last pull into the disk tier (download seconds and
        bytes; 0 for a model without a source) (``agent.node.record.PROFILE_HEADER``)."""
        from agent.backends import backend_class

        out, disk = [], self.cache.disk
        for entry in self.cache.entries.values():
            if not entry.stats.loads:
                continue
            # a model without a source loads from the repository: no pull, no disk bytes
            sourced = disk is not None and entry.name in disk.sources
            download, disk_bytes = disk.pulled_profile(entry.id) if sourced else (0.0, 0)
            rt, account = self.runtime(entry), entry.account
            line = rt.tuner.profile.line()
            one = rt.warm_run_seconds()
            kind = entry.spec.backend or "onnx"
            peak = self.cache.footprints.load_peak(
                kind, entry.device, backend_class(kind).prior_for(entry.device))
            size = account.size_bytes or account.measured_bytes or 0
            out.append({
                "model": entry.key, "size_bytes": size,
                "load_seconds": round(account.load_seconds, 6),
                "exec_seconds": round(one if one is not None else account.first_run_seconds,
                                      6),
                "first_exec_seconds": round(account.first_run_seconds, 6)
                if account.first_run_seconds else None,
                "exec_seconds_per_row": None if line is None else round(line[1], 6),
                "load_slot_seconds": round(entry.stats.slot_seconds / entry.stats.loads, 6),
                "load_peak": round(peak, 4), "workers": rt.workers,
                "max_batch_size": rt.settings.max_batch_size if rt.settings.batching else 1,
                "slo_seconds": rt.settings.slo,
                "load_concurrency": self.config.load_concurrency,
                "max_concurrent_pulls": self.config.max_concurrent_pulls,
                "pull_bandwidth": self.config.pull_bandwidth,
                "download_seconds": round(download, 6), "disk_bytes": disk_bytes})
        return out

    # -- admin -----------------------------------------------------------------------
    def set_workers(self, entry: Entry, workers: int) -> None:
        """Run the model's batches on ``workers`` workers, now and after reloads."""
        rt = self.runtime(entry)
        rt.workers, rt.workers_set = workers, True
        if rt.batcher is not None:
            rt.batcher.set_workers(workers)
        log.info("%s now runs on %d worker(s)", entry.key, workers)

    def describe(self, entry: Entry) -> dict[str, Any]:
        return self.runtime(entry).describe(self.clock())

    # -- shutdown --------------------------------------------------------------------
    def begin_shutdown(self, drain_seconds: float) -> None:
        """The server stopped listening: requests already in (queued or loading) keep
        being served, and whatever is still queued shortly before the drain time ends
        gets a 503 (never a dropped socket)."""
        loop = asyncio.get_running_loop()
        self._deadline_timer = loop.call_later(max(drain_seconds * 0.9 - 0.5, 0.0),
                                               self._fail_all_queued)

    def _fail_all_queued(self) -> None:
        for rt in self.runtimes.values():
            if rt.batcher is not None:  # each request counts its own drop
                rt.batcher.fail_queued(Shed("the agent is shutting down", "shutdown"))

    async def close(self, timeout: float = 10.0) -> None:
        """Answer everything queued with 503, let running batches finish (``timeout``)."""
        self.accepting = False
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        closing = []
        for rt in self.runtimes.values():
            batcher, rt.batcher = rt.batcher, None
            if batcher is not None:
                closing.append(batcher.close(Shed("the agent is shutting down", "shutdown"),
                                             timeout))
        if closing:
            await asyncio.gather(*closing)
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)
