"""The node agent's aiohttp application: ``create_app`` builds it, state lives on a
``Node`` stored on the app (no globals), handlers live in the ``api_*`` modules.

Errors: every failure is JSON ``{"error": "..."}`` with a fitting status (the
``errors`` middleware maps cache, input and HTTP errors); 503s carry ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from aiohttp import web

from agent.backends import Backend, BackendError, InvalidInput, make_backend
from agent.backends.tfserving import TfServingHost
from agent.config import AgentConfig
from agent.httpauth import bearer_auth, read_token
from agent.node import state as statefile
from agent.node.cache import CacheBusy, CacheError, ModelCache
from agent.memory import (FootprintModel, GpuAccounting, GpuMemoryReader, cpu_budget_default,
                          gpu_budgets, tune_malloc)
from agent.node.metrics import Metrics
from agent.node.repository import scan_repository
from agent.node.routes import NODE, json_error
from agent.node.serving import Serving, retry_after_header

log = logging.getLogger("edgeagent.node")

def default_budgets(config: AgentConfig, reader: GpuMemoryReader | None = None
                    ) -> dict[str, int]:
    """CPU budget (config, else available memory minus the margin) and one per GPU
    (``gpu_budget``: one size for all, or per device; else total minus the margin)."""
    budgets = {"cpu": config.cpu_budget or cpu_budget_default(config.memory_margin)}
    budgets.update(gpu_budgets(config.gpu_budget, (reader or GpuMemoryReader()).devices(),
                               config.memory_margin))
    return budgets


class Node:
    """Everything one agent process serves: repository, cache, metrics, admin token."""

    def __init__(self, config: AgentConfig, *, budgets: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 backend_factory: Callable[..., Backend] = make_backend) -> None:
        if config.repository is None:
            raise ValueError("the agent needs a model repository")
        self.config = config
        self.started = time.time()
        self.infer_executor = ThreadPoolExecutor(config.infer_threads, "edgeagent-infer")
        saved = statefile.read_state(config.resident_state_path) if config.restore else None
        # One TF Serving server for all TF models; it starts when the first one loads.
        self.tfserving = TfServingHost(config.tfserving, config.data_dir / "tfserving")
        gpu_reader = GpuMemoryReader()
        budgets = budgets or default_budgets(config, gpu_reader)
        #: GPU budgets, per-process NVML meters and each GPU's context overhead.
        self.gpu = GpuAccounting(gpu_reader, {d: b for d, b in budgets.items() if d != "cpu"})
        if backend_factory is make_backend:
            backend_factory = functools.partial(make_backend, tfserving=self.tfserving,
                                                gpu=self.gpu)
        self.cache = ModelCache(
            scan_repository(config.repository), budgets,
            policy=config.policy, clock=clock, backend_factory=backend_factory,
            footprints=FootprintModel.load(config.footprints_path),
            load_concurrency=config.load_concurrency, infer_executor=self.infer_executor)
        self._saved = saved
        for name, pinned in ((saved or {}).get("pins") or {}).items():
            with contextlib.suppress(CacheError):
                self.cache.set_pinned(name, bool(pinned))
        # Queues, batchers, admission and prediction caches per model (agent.node.serving).
        self.serving = Serving(self.cache, config, self.infer_executor)
        self.metrics = Metrics(self.cache, self.serving)
        self.admin_token = read_token(config.admin_token_file)
        self.ready = False
        self._persist_task: asyncio.Task | None = None
        self._startup_task: asyncio.Task | None = None
        self.cache.on_load.append(lambda e: self.schedule_persist())
        self.cache.on_unload.append(lambda e, why: self.schedule_persist())

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Load pinned models, then the saved resident set, most popular first."""
        self._startup_task = asyncio.get_running_loop().create_task(self._warm_up())

    async def _warm_up(self) -> None:
        try:
            from agent.backends.onnx import prime_runtime

            await asyncio.get_running_loop().run_in_executor(self.cache.load_executor,
                                                             prime_runtime)
            if any(s.backend == "tfserving" for s in self.cache.specs.values()):
                try:  # start TF Serving now, not within (and billed to) the first TF load
                    await asyncio.get_running_loop().run_in_executor(
                        self.cache.load_executor, self.tfserving.ensure_up)
                except BackendError as exc:
                    log.warning("TF Serving did not start (TF models retry on load): %s", exc)
            wanted = [(e.name, e.version) for e in self.cache.entries.values() if e.pinned]
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
                                  statefile.snapshot(self.cache))
        except OSError as exc:
            log.warning("cannot write state file %s: %s", self.config.resident_state_path, exc)

    def rescan(self) -> None:
        """Re-read the repository (index API, SIGHUP)."""
        self.cache.update_specs(scan_repository(self.config.repository))
        self.serving.refresh(self.config)
        log.info("repository %s rescanned: %d model(s)", self.config.repository,
                 len(self.cache.specs))

    def reload(self, config: AgentConfig) -> None:
        """Apply a re-read config (SIGHUP): budget, admin token, then rescan."""
        if config.repository != self.config.repository:
            log.warning("SIGHUP: changing the repository needs a restart; keeping %s",
                        self.config.repository)
            config = config.with_overrides(repository=self.config.repository)
        if config.cpu_budget and config.cpu_budget != self.cache.pools["cpu"].budget:
            self.cache.pools["cpu"].budget = config.cpu_budget
            log.info("SIGHUP: cpu budget is now %d bytes", config.cpu_budget)
        try:
            self.admin_token = read_token(config.admin_token_file)
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the old admin token: %s", exc)
        self.config = config
        self.rescan()

    async def close(self) -> None:
        if self._startup_task is not None and not self._startup_task.done():
            self._startup_task.cancel()
            with contextlib.suppress(BaseException):
                await self._startup_task
        if self._persist_task is not None and not self._persist_task.done():
            self._persist_task.cancel()
        self.persist_now()
        await self.serving.close()  # queued requests get 503s before the cache stops
        await self.cache.close()
        await asyncio.get_running_loop().run_in_executor(None, self.tfserving.close)
        self.infer_executor.shutdown(wait=False, cancel_futures=True)



@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        if exc.status == 413:
            limit = request.app[NODE].config.max_request_size
            return json_error(413, f"request body over the limit of {limit} bytes")
        message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") \
            else f"{exc.reason}: {request.method} {request.path}"
        return json_error(exc.status, message, {k: v for k, v in exc.headers.items()
                                                if k in ("Allow",)})
    except CacheBusy as exc:
        return json_error(exc.status, str(exc), {"Retry-After": str(int(exc.retry_after or 1))})
    except CacheError as exc:
        return json_error(exc.status, str(exc), retry_after_header(exc))
    except InvalidInput as exc:
        return json_error(400, str(exc))
    except BackendError as exc:  # 500, or 503 + Retry-After while a runtime restarts
        return json_error(exc.status, str(exc), {"Retry-After": str(int(exc.retry_after))}
                          if exc.retry_after else None)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a bug must answer 500, not kill the connection
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal error (logged)")


_PROTECTED = ("/v1/cache", "/v2/repository")


auth_middleware = bearer_auth(lambda request: request.app[NODE].admin_token,
                              lambda path: path.startswith(_PROTECTED))


def prepare_process() -> None:
    """Set the agent's process up, once, before a model loads: glibc serves large
    allocations from mmap (``tune_malloc``), so an unload gives its memory back and a
    load's footprint is what the model holds. ``serve`` calls it, as do tests that
    measure footprints; ``Node`` does not."""
    tune_malloc()


def create_app(config: AgentConfig, *, node: Node | None = None, **node_kwargs: Any
               ) -> web.Application:
    """The agent's app for ``config``. ``node_kwargs`` (budgets, clock, backend_factory)
    are passed to ``Node`` for tests and benchmarks."""
    from agent.node import api_admin, api_tfserving, api_v2, reporter

    app = web.Application(client_max_size=config.max_request_size,
                          middlewares=[errors_middleware, auth_middleware])
    app[NODE] = node or Node(config, **node_kwargs)
    api_v2.add_routes(app)
    api_tfserving.add_routes(app)
    api_admin.add_routes(app)
    # Before the node's hooks: the reporter stops before the cache closes.
    reporter.setup(app, app[NODE])

    async def on_startup(app: web.Application) -> None:
        await app[NODE].start()

    async def on_cleanup(app: web.Application) -> None:
        await app[NODE].close()

    app.on_startup.append(on_startup)
    async def on_shutdown(app: web.Application) -> None:
        node = app[NODE]
        node.serving.begin_shutdown(node.config.drain_seconds)

    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app
