"""The ``Node``: everything one agent process serves (repository, model cache, batching
layer, selection apps, metrics, tokens, the TF Serving host, GPU accounting), with its warm start,
state file and reload. ``agent.node.app`` stores it on the aiohttp app under
``agent.node.routes.NODE``, where the route modules find it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from agent.backends import Backend, BackendError, make_backend
from agent.backends.tfserving import TfServingHost
from agent.config import AgentConfig
from agent.security.credentials import Credentials, load_credentials
from agent.security.httpauth import Guard
from agent.http.body import BodyMemory
from agent.memory import (FootprintModel, GpuAccounting, GpuMemoryReader, cpu_budget_default,
                          gpu_budgets)
from agent.node import state as statefile
from agent.node.cache import CacheError, Entry, ModelCache, ModelInvalid, State, UnknownModel
from agent.node.cache.disktier import DiskTier
from agent.node.frontdesk import FrontDesk
from agent.node.metrics import Metrics
from agent.node.offload import Decoder
from agent.node.repository import ModelSpec, apply_override, scan_model, scan_repository
from agent.node.routing import Router
from agent.node.selection.apps import SelectionApps, split_apps
from agent.node.serving import Serving
from agent.node.whatif import WhatIf
from agent.tracing import Tracing

log = logging.getLogger("edgeagent.node")


def default_budgets(config: AgentConfig, reader: GpuMemoryReader | None = None
                    ) -> dict[str, int]:
    """CPU budget (config, else available memory minus the margin) and one per GPU
    (``gpu_budget``: one size for all, or per device; else total minus the margin)."""
    budgets = {"cpu": config.cpu_budget or cpu_budget_default(config.memory_margin)}
    budgets.update(gpu_budgets(config.gpu_budget, (reader or GpuMemoryReader()).devices(),
                               config.memory_margin))
    return budgets


def _tracing(config: AgentConfig, exporter: Any) -> Tracing | None:
    """Spans of inference requests (``tracing:``; None: off), sent by OTLP, or to
    ``exporter`` (tests: the SDK's in-memory exporter)."""
    settings = config.tracing
    if settings is None:
        return None
    return Tracing(service_name=settings.service_name, node=config.node_name,
                   endpoint=settings.endpoint, protocol=settings.protocol,
                   sample_ratio=settings.sample_ratio, exporter=exporter)


def _tokens(config: AgentConfig) -> Any:
    """The tokens the agent accepts: ``admin_token_file`` and ``auth.token_file``'s."""
    return load_credentials(config.admin_token_file, config.auth.token_file)


class Node:
    """Everything one agent process serves: repository, cache, metrics, tokens."""

    def __init__(self, config: AgentConfig, *, budgets: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 backend_factory: Callable[..., Backend] = make_backend,
                 open_file: Callable[..., Any] = open,
                 open_source: Callable[[str, dict], Any] | None = None,
                 disk_free: Callable[[Any], int] | None = None,
                 span_exporter: Any = None) -> None:
        if config.repository is None:
            raise ValueError("the agent needs a model repository")
        self.config = config
        self.tracing = _tracing(config, span_exporter)  # None: off (agent.tracing)
        self.open_file = open_file  # writes the state file (tests inject a failing one)
        self.started = time.time()
        self.infer_executor = ThreadPoolExecutor(config.infer_threads, "edgeagent-infer")
        saved = statefile.read_state(config.resident_state_path) if config.restore else None
        # One TF Serving server for all TF models; it starts when the first one loads.
        self.tfserving = TfServingHost(config.tfserving, config.data_dir / "tfserving")
        self._listing_task: asyncio.Task | None = None
        self.cache = self._make_cache(config, budgets, clock, backend_factory, disk={
            **({"open_source": open_source} if open_source else {}),
            **({"free_bytes": disk_free} if disk_free else {})})
        #: The disk tier: sourced models' files under data_dir/models (the ``fleet``'s
        #: pull and drop directives use its ``ensure``/``drop``/``holdings``).
        self.disk: DiskTier = self.cache.disk
        #: The models the repository holds but that cannot be served, with why (logged
        #: once per change: ``_log_invalid``).
        self.invalid: dict[str, str] = {}
        models, apps = split_apps(self._log_invalid(self._scan(config)))
        self.cache.update_specs(models)
        self._saved = saved
        self._restore_pins(saved)
        # Queues, batchers, admission and prediction caches per model (agent.node.serving).
        self.serving = Serving(self.cache, config, self.infer_executor)
        #: Selection apps (``backend: selection``), served above the cache.
        self.selection = SelectionApps(self.serving, config.data_dir)
        self.selection.update(apps, models)
        #: The dashboard's what-if curve: the last hour through the twin.
        self.whatif = WhatIf(self.serving)
        #: The bytes of request bodies in flight, bounded (``max_request_bytes_in_flight``).
        self.body_memory = BodyMemory(config.max_request_bytes_in_flight)
        self.metrics = Metrics(self.cache, self.serving, self.body_memory, self.selection)
        self._make_front_desk(config)
        #: Config overrides of loads (``parameters.config``, parsed JSON) by model name:
        #: applied over the repository's config at every rescan until a plain load.
        self.overrides: dict[str, dict] = {}
        self.ready = False
        self._persist_task: asyncio.Task | None = None
        self._startup_task = self._idle_task = self._poll_task = self._persist_task

    def _make_front_desk(self, config: AgentConfig) -> None:
        """Who may call, where each request is served and where it comes in."""
        #: The tokens accepted (admin_token_file, auth.token_file) and failed-auth state.
        self.guard = Guard(Credentials(_tokens(config)), throttle=config.auth.throttle())
        #: Where each request is served: here, or the node the plan runs its model on.
        self.router = Router(config, self.cache, self.serving, self.guard)
        self.metrics.registry.register(self.router.stats.collector())
        #: Where every inference request comes in (``agent.node.frontdesk``).
        self.desk = FrontDesk(self.serving, self.selection, self.metrics, self.router)
        #: Decodes large request bodies off the event loop (thread or child process).
        self.decoder = Decoder()

    def _restore_pins(self, saved: dict[str, Any] | None) -> None:
        """Pin and unpin as the state file left them."""
        for name, pinned in ((saved or {}).get("pins") or {}).items():
            with contextlib.suppress(CacheError):
                self.cache.set_pinned(name, bool(pinned))

    def _make_cache(self, config: AgentConfig, budgets: dict[str, int] | None,
                    clock: Callable[[], float], backend_factory: Callable[..., Backend],
                    disk: dict[str, Any]) -> ModelCache:
        """The cache over ``budgets`` (default: the host's, ``default_budgets``), with
        this node as its listener and its disk tier under ``data_dir/models`` (``disk``:
        the tier's injected source opener and free-space reader, for tests); its models
        come with the first scan."""
        gpu_reader = GpuMemoryReader()
        budgets = budgets or default_budgets(config, gpu_reader)
        #: GPU budgets, per-process NVML meters and each GPU's context overhead.
        self.gpu = GpuAccounting(gpu_reader, {d: b for d, b in budgets.items() if d != "cpu"})
        if backend_factory is make_backend:
            backend_factory = functools.partial(make_backend, tfserving=self.tfserving,
                                                gpu=self.gpu)
        return ModelCache(
            {}, budgets,
            policy=config.policy, clock=clock, backend_factory=backend_factory,
            footprints=FootprintModel.load(config.footprints_path, self.open_file),
            load_concurrency=config.load_concurrency,
            load_wait_max_s=config.load_wait_max_s, idle_unload_s=config.idle_unload_s,
            load_retry_s=config.load_retry_s, listener=self,
            disk=functools.partial(
                DiskTier, config.models_dir, config.disk_budget,
                policy=config.disk_policy or config.policy,
                max_concurrent_pulls=config.max_concurrent_pulls,
                bandwidth=config.pull_bandwidth, clock=clock, **disk))

    # -- what the cache tells (``agent.node.cache.CacheListener``) -------------------
    def model_loaded(self, entry: Entry) -> None:
        """A model is READY: it gets its queue and batcher, its load time is counted,
        the state file is written soon."""
        self.serving.model_loaded(entry)
        self.metrics.model_loaded(entry)
        self.schedule_persist()

    def model_unloaded(self, entry: Entry, reason: str) -> None:
        """A model was unloaded: its batcher closes, the state file is written soon."""
        self.serving.model_unloaded(entry, reason)
        self.schedule_persist()

    # -- lifecycle -------------------------------------------------------------------
    #: Seconds between two checks for models idle past their ``idle_unload_s``.
    IDLE_CHECK_EVERY = 1.0

    async def start(self) -> None:
        """Load pinned models, then the saved resident set, most popular first; then
        unload models left unused past their ``idle_unload_s``, periodically."""
        loop = asyncio.get_running_loop()
        await self.router.start()
        self._startup_task = loop.create_task(self._warm_up())
        self._idle_task = loop.create_task(self._unload_idle_forever())
        self.selection.start()
        if self.config.source_poll_s:
            self._poll_task = loop.create_task(self._poll_sources_forever())

    async def _unload_idle_forever(self) -> None:
        while True:
            await asyncio.sleep(self.IDLE_CHECK_EVERY)
            self.cache.unload_idle()

    async def _poll_sources_forever(self) -> None:
        """List the sources every ``source_poll_s``: a new version is rolled out."""
        while True:
            await asyncio.sleep(self.config.source_poll_s)
            try:
                await self.refresh_sources()
            except Exception:  # noqa: BLE001 - a failed poll must not stop polling
                log.exception("polling the model sources failed")

    def _scan(self, config: AgentConfig) -> dict[str, ModelSpec]:
        """The repository and, as a second root, the models the coordinator assigned."""
        return scan_repository(config.repository, self.disk.listing,
                               also=(config.assigned_dir,))

    async def refresh_sources(self) -> None:
        """List the sourced models' versions (off the loop) and rescan as listings
        change (a slow source does not hold back the others' models)."""
        await self.disk.refresh(on_change=lambda names: self.rescan(relist=False))

    #: Seconds the start waits for the sources' listings before it goes on (they go on
    #: in the background; a model not listed yet answers 503 + Retry-After meanwhile).
    LISTING_WAIT_S = 10.0

    async def _warm_up(self) -> None:
        try:
            from agent.backends.onnx import prime_runtime

            if self.disk.sources:
                self._listing_task = asyncio.get_running_loop().create_task(
                    self.refresh_sources())
                await asyncio.wait({self._listing_task}, timeout=self.LISTING_WAIT_S)

            await asyncio.get_running_loop().run_in_executor(self.cache.load_executor,
                                                             prime_runtime)
            if any(s.backend == "tfserving" for s in self.cache.specs.values()):
                try:  # start TF Serving now, not within (and billed to) the first TF load
                    await asyncio.get_running_loop().run_in_executor(
                        self.cache.load_executor, self.tfserving.ensure_up)
                except BackendError as exc:
                    log.warning("TF Serving did not start (TF models retry on load): %s", exc)
            wanted = [(e.name, e.version) for e in self.cache.entries.values()
                      if e.account.pinned]
            if self._saved:
                wanted += [k for k in statefile.restore_order(self._saved) if k not in wanted]
            for name, version in wanted:
                try:
                    await self.cache.ensure_loaded(name, version)
                    log.info("warm start: loaded %s:%s", name, version)
                except CacheError as exc:
                    log.warning("warm start: skipped %s:%s: %s", name, version, exc)
        finally:
            self.ready = True

    async def wait_ready(self) -> None:
        if self._startup_task is not None:
            await asyncio.shield(self._startup_task)

    def schedule_persist(self, delay: float = 0.2) -> None:
        """Write the state file soon (coalescing bursts of loads and evictions)."""
        if self._persist_task is None or self._persist_task.done():
            self._persist_task = asyncio.get_running_loop().create_task(
                self._persist_later(delay))

    async def _persist_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await asyncio.get_running_loop().run_in_executor(None, self.persist_now)

    def persist_now(self) -> None:
        try:
            statefile.write_state(self.config.resident_state_path,
                                  statefile.snapshot(self.cache), open_file=self.open_file)
        except OSError as exc:
            log.warning("cannot write state file %s: %s", self.config.resident_state_path, exc)

    def rescan(self, relist: bool = True) -> None:
        """Re-read the repository (index API, SIGHUP); loads' overrides stay applied.
        ``relist``: list the sources again too (in the background)."""
        specs, apps = split_apps(self._log_invalid(self._scan(self.config)))
        for name, data in list(self.overrides.items()):
            if name in specs and specs[name].error is None:
                try:
                    specs[name] = apply_override(specs[name], data)
                    continue
                except ValueError as exc:
                    log.warning("%s: its load's config override no longer applies, "
                                "dropped: %s", name, exc)
            self.overrides.pop(name)
        self.cache.update_specs(specs)
        self.selection.update(apps, specs)
        self.serving.refresh(self.config)
        log.info("repository %s rescanned: %d model(s)%s", self.config.repository,
                 len(self.cache.specs),
                 f", {len(self.invalid)} invalid" if self.invalid else "")
        if relist and self.disk.sources and self._startup_task is not None and (
                self._listing_task is None or self._listing_task.done()):
            self._listing_task = asyncio.get_running_loop().create_task(
                self.refresh_sources())

    def _log_invalid(self, specs: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        """Log each model of a scan that cannot be served, with why (again only when its
        reason changes; one whose problem is gone is logged as served again)."""
        invalid = {name: spec.error for name, spec in specs.items() if spec.error}
        for name, why in invalid.items():
            if self.invalid.get(name) != why:
                log.warning("model %s is invalid: %s", name, why)
        for name in self.invalid.keys() - invalid.keys():
            if name in specs:
                log.info("model %s is valid again", name)
        self.invalid = invalid
        return specs

    async def load_model(self, name: str, override: str | None = None) -> None:
        """The repository extension's load: (re)load ``name``, with ``override`` (a JSON
        string in Triton's model config fields, ``parameters.config``) applied over its
        repository config, or without (back to the repository's). A model whose config
        changes is unloaded first. A malformed override, or one the model refuses at
        load, is ``ModelInvalid`` (400) saying the model failed to load and why, with
        the model's config and state as they were."""
        from agent.validation import load_json

        app = self.desk.app(name)
        if app is not None:  # an app's load: its members agree (loaded if new)
            if override is not None:
                raise ModelInvalid(f"failed to load {name!r}: a selection app takes no "
                                   "parameters.config (edit its config.yaml)")
            await app.signature()
            return
        if name not in self.cache.specs:
            raise UnknownModel(f"failed to load {name!r}: no such model in the repository")
        data = None
        if override is not None:
            if not isinstance(override, str):
                raise ModelInvalid(f"failed to load {name!r}: parameters.config must be a "
                                   f"JSON string, got {type(override).__name__}")
            try:
                data = load_json(override)
                apply_override(scan_model(self.cache.specs[name].path, self.disk.listing),
                               data)
            except ValueError as exc:
                raise ModelInvalid(f"failed to load {name!r}: parameters.config: "
                                   f"{str(exc).removeprefix('parameters.config: ')}") from None
        if self.overrides.get(name) == data:
            await self.cache.ensure_loaded(name)
            return
        entry = self.cache.entry(name)
        was_ready = entry.state is State.READY
        old = self.overrides.get(name)
        await self.cache.evict(name)  # ModelInUse (409) while in use: nothing changed
        self._set_override(name, data)
        try:
            await self.cache.ensure_loaded(name)
        except CacheError as exc:
            if data is None:
                raise
            self._set_override(name, old)
            self.cache.forget_failure(self.cache.entry(name))
            if was_ready:
                with contextlib.suppress(CacheError):
                    await self.cache.ensure_loaded(name)
            raise ModelInvalid(f"failed to load {name!r} with parameters.config: "
                               f"{exc}") from None

    def _set_override(self, name: str, data: dict | None) -> None:
        if data is None:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = data
        self.rescan()

    def reload(self, config: AgentConfig) -> None:
        """Apply a re-read config (SIGHUP): budget, tokens, then rescan."""
        if config.repository != self.config.repository:
            log.warning("SIGHUP: changing the repository needs a restart; keeping %s",
                        self.config.repository)
            config = config.with_overrides(repository=self.config.repository)
        if config.cpu_budget and config.cpu_budget != self.cache.pools["cpu"].budget:
            self.cache.set_budget("cpu", config.cpu_budget)
            log.info("SIGHUP: cpu budget is now %d bytes", config.cpu_budget)
        if config.disk_budget and config.disk_budget != self.disk.pool.budget:
            self.disk.pool.budget = config.disk_budget  # the next pull evicts down to it
            log.info("SIGHUP: disk budget is now %d bytes", config.disk_budget)
        bounds = self.cache.settings  # the cache's parts read these at each use
        bounds.load_wait_max_s, bounds.load_retry_s, bounds.idle_unload_s = (
            config.load_wait_max_s, config.load_retry_s, config.idle_unload_s)
        try:
            self.guard.credentials.replace(_tokens(config))
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the old tokens: %s", exc)
        self.config = config
        self.rescan()

    async def close(self) -> None:
        for task in (self._idle_task, self._poll_task):
            if task is not None:
                task.cancel()
        if self._listing_task is not None:
            self._listing_task.cancel()
        if self._startup_task is not None and not self._startup_task.done():
            self._startup_task.cancel()
            with contextlib.suppress(BaseException):
                await self._startup_task
        if self._persist_task is not None and not self._persist_task.done():
            self._persist_task.cancel()
        self.persist_now()
        await self.selection.close()
        await self.router.close()
        await self.serving.close()  # queued requests get 503s before the cache stops
        await self.disk.close()
        await self.cache.close()
        await asyncio.get_running_loop().run_in_executor(None, self.tfserving.close)
        self.infer_executor.shutdown(wait=False, cancel_futures=True)
        self.decoder.close()
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.close)
