"""The agent's side of the coordinator: report capacity and per-model stats every
``report_interval_s`` and apply the directives that come back.

Reports and directives follow the wire schema in ``agent.wire``.
Nothing here can stop the node serving: every failure (coordinator down, bad answer,
a model that will not load) is logged and retried with exponential backoff, and
directives that are not renewed within their ``ttl_s`` are reverted.

What applying means:
* ``pin``: pinned through ``ModelCache.set_pinned``; only models this reporter pinned are
  ever unpinned by it (an operator's pin stays). The names are kept in
  ``<data_dir>/coordinator-pins.json``, so that after a restart (which restores pins from
  the state file, with no directives yet) they are unpinned again.
* ``prefetch``: ``ModelCache.ensure_loaded`` in the background, one load per model at
  a time; a load that does not fit is logged and retried on the next directives.
* ``workers``: set through the batching layer (``Serving.set_workers``, as
  ``POST /v1/cache/{name}/workers`` does); the count a model had before is restored
  when the directives drop it or lapse.
* ``drop_rate``: recorded and shown in ``GET /v1/coordinator`` (the batching layer's
  admission control has no knob for it yet).
* ``pull``: a model the node's repository does not have is written as an assigned model
  directory, ``<data_dir>/assigned/<model>/config.yaml`` (its config with the source;
  the repository scan's second root, where the operator's own entry of the same name
  wins, logged), its source listed, its files pulled by the disk tier
  (``DiskTier.ensure``) and, with ``load``, loaded. A pull with a ``digest`` pins it in
  the config (with its ``version``, the one version served): the disk tier refuses a
  version of another digest. A pull naming a version (or digest)
  the node has not seen lists the source again: a newer version found is rolled out
  (``agent.node.rollout``). A pull that lapses is not undone, only not renewed.
* ``drop``: an assigned model the plan moved away is unloaded once idle (no request in
  flight, not pinned: the cache's own evict), its directory removed and its files left
  to the disk tier (``DiskTier.drop``); while it is busy, the next directives try again.
* ``model_versions`` (the coordinator's rollouts): the version each model serves, the
  ones kept at hand and the bad ones, set on the cache (``ModelCache.set_version_pins``:
  a changed version rolls out as a new one does, ``agent.node.rollout``) and kept in
  ``<data_dir>/coordinator-versions.json``: unlike the rest, pins do not lapse, and a
  restart starts from them. For the models under a rollout, the report carries
  ``version_stats`` (``wire.VersionStat``: cumulative counters per version).

Stats come from the agent's Prometheus registry (``Metrics``), as deltas between
samples: arrivals (requests of any outcome), drops (503 answers), latency percentiles
(interpolated within the histogram buckets, as Prometheus' ``histogram_quantile``).
Processing time comes from the batching layer's profile: all batches run, reported at
the mean batch size b with the profile's time for b (MArk's black box: b / T_b requests
per second). Before any batch ran (or without a batching layer) it falls back to batches
of one whose seconds are the successful requests' latency: an upper bound, as it
includes queueing (and a cold load on a miss).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Collection

import aiohttp
from aiohttp import web

from agent.config import CoordinatorLink, parse_model_config
from agent.node.cache import CacheError
from agent.node.join import report_token
from agent.node.lifecycle import State
from agent.node.state import read_state, write_state
from agent.node.versionpins import VersionPin
from agent.sources import redact_url
from agent.tls import client_context, verify_failure
from agent.validation import load_json
from agent.wire import (DirectiveBook, Directives, Pull, histogram_quantile,
                        refuse_credentials)

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.reporter")

PERCENTILES = (50.0, 90.0, 95.0, 99.0)
MAX_PENDING_POINTS = 500  # arrival intervals kept per model while the coordinator is away
PINS_FORMAT = 1
VERSIONS_FILE = "coordinator-versions.json"


class MetricsSampler:
    """Cumulative per-model counters read from the agent's Prometheus registry."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def sample(self) -> dict[str, dict[str, Any]]:
        """model -> {requests, drops, ok, ok_seconds, buckets: {le: cumulative}}."""
        out: dict[str, dict[str, Any]] = {}

        def row(model: str) -> dict[str, Any]:
            return out.setdefault(model, {"requests": 0.0, "drops": 0.0, "ok": 0.0,
                                          "ok_seconds": 0.0, "buckets": {}})

        for family in self.registry.collect():
            if family.name == "edgeagent_requests":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        r = row(s.labels["model"])
                        r["requests"] += s.value
                        if s.labels.get("code") == "503":
                            r["drops"] += s.value
            elif family.name == "edgeagent_request_duration_seconds":
                for s in family.samples:
                    r = row(s.labels["model"])
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        r["buckets"][le] = r["buckets"].get(le, 0.0) + s.value
                    elif s.name.endswith("_count"):
                        r["ok"] += s.value
                    elif s.name.endswith("_sum"):
                        r["ok_seconds"] += s.value
        return out

    def sample_versions(self, models: Collection[str]
                        ) -> dict[tuple[str, str], dict[str, Any]]:
        """(model, version label) -> {requests, errors (5xx), ok, buckets: {le seconds:
        cumulative}} for ``models`` (the rollouts' figures, ``version_stats``)."""
        out: dict[tuple[str, str], dict[str, Any]] = {}

        def row(labels: dict[str, str]) -> dict[str, Any] | None:
            if labels["model"] not in models or not labels.get("version"):
                return None
            return out.setdefault((labels["model"], labels["version"]), {
                "requests": 0.0, "errors": 0.0, "ok": 0.0, "buckets": {}})

        for family in self.registry.collect():
            if family.name == "edgeagent_requests":
                for s in family.samples:
                    r = row(s.labels) if s.name.endswith("_total") else None
                    if r is not None:
                        r["requests"] += s.value
                        if s.labels.get("code", "").startswith("5"):
                            r["errors"] += s.value
            elif family.name == "edgeagent_request_duration_seconds":
                for s in family.samples:
                    r = row(s.labels)
                    if r is None:
                        continue
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        r["buckets"][le] = r["buckets"].get(le, 0.0) + s.value
                    elif s.name.endswith("_count"):
                        r["ok"] += s.value
        return out


#: The node's name where the config gives none (Kubernetes: the downward API's
#: spec.nodeName; a pod's host name is the pod's, new at every restart).
NODE_NAME_VARIABLE = "EDGEAGENT_NODE_NAME"


class Reporter:
    """Periodic reports to the coordinator and the directives they bring back."""

    def __init__(self, node: "Node", link: CoordinatorLink, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.link, self.clock = node, link, clock
        self.name = (link.node_name or os.environ.get(NODE_NAME_VARIABLE)
                     or os.uname().nodename)
        self.url = link.url.rstrip("/") + f"/v1/nodes/{self.name}/report"
        self.interval = float(link.report_interval_s)
        self.max_backoff = max(self.interval, min(60.0, self.interval * 16))
        self.sampler = MetricsSampler(node.metrics.registry)
        self.book = DirectiveBook()
        self.pins_path = node.config.data_dir / "coordinator-pins.json"
        self.versions_path = node.config.data_dir / VERSIONS_FILE
        #: (model, version label) -> the cumulative buckets at the last report
        self._version_buckets: dict[tuple[str, str], dict[float, float]] = {}
        self._relisting: asyncio.Task | None = None
        #: model -> why the version pinned cannot be served (its listing lacks it)
        self.version_errors: dict[str, str] = {}
        self.pinned_by_us: set[str] = set()
        self.workers: dict[str, int] = {}
        self._workers_before: dict[str, tuple[int, bool]] = {}  # name -> (count, was set)
        self.drop_rate: dict[str, float] = {}
        self.directives: Directives | None = None
        self.loading: dict[str, asyncio.Task] = {}
        #: model -> its pull directive being carried out (one at a time per model)
        self.assigning: dict[str, asyncio.Task] = {}
        self.dropping: dict[str, asyncio.Task] = {}  # unloads before a drop
        #: model -> (version, digest) of the last pull carried out: a pull naming
        #: another lists the source again
        self._pulled: dict[str, tuple[int | None, str | None]] = {}
        self._shadowed: set[str] = set()  # pulls the operator's own entry outranks
        self.assign_errors: dict[str, str] = {}
        self.failures = 0
        self.last_error: str | None = None
        self.last_ok: float | None = None  # clock() of the last successful report
        self.reports = 0
        self._previous: dict[str, dict[str, Any]] = {}
        self._previous_at: float | None = None
        self._pending: dict[str, deque] = {}
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._revert_saved_pins()
        self._restore_versions()
        self._previous, self._previous_at = self.sampler.sample(), self.clock()
        link = self.link
        ssl_context = client_context(link.ca_file, link.cert_file, link.key_file,
                                     prefix="coordinator.") \
            if link.url.startswith("https://") else None
        # one session, its connection kept between reports: one TLS handshake, not one
        # per report (idle for two intervals at most before it is closed)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval)),
            connector=aiohttp.TCPConnector(ssl=ssl_context or True, limit=4,
                                           keepalive_timeout=max(15.0, 2 * self.interval)))
        self._task = asyncio.get_running_loop().create_task(self._run())
        log.info("reporting to %s every %gs as node %r", self.link.url, self.interval,
                 self.name)

    async def stop(self) -> None:
        for task in [self._task, self._relisting, *self.loading.values(),
                     *self.assigning.values(), *self.dropping.values()]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        delay = 0.0
        while True:
            await self._sleep(delay)
            try:
                self.expire_if_due()
                directives = await self.report_once()
                self.apply(directives)
                if self.failures:
                    log.info("coordinator %s reachable again", self.link.url)
                self.failures, self.last_error = 0, None
                delay = self.interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - never let reporting hurt serving
                self.failures += 1
                self.last_error = verify_failure(exc, self.link.ca_file) or (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                delay = min(self.max_backoff, self.interval * 2 ** min(self.failures, 10))
                (log.warning if self.failures == 1 else log.debug)(
                    "report to %s failed (%d in a row, next try in %.1fs): %s",
                    self.link.url, self.failures, delay, self.last_error)

    async def _sleep(self, delay: float) -> None:
        """Sleep ``delay`` seconds, waking early to revert directives that lapse."""
        end = self.clock() + delay
        while True:
            now = self.clock()
            expires = self.book.expires_at(self.name)
            wake = end if expires is None or self.directives is None else min(end, expires)
            await asyncio.sleep(max(0.0, wake - now))
            with contextlib.suppress(Exception):
                self.expire_if_due()
            if self.clock() >= end:
                return

    # -- reporting -------------------------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        cores = self.link.cores
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else os.cpu_count() or 1
        pools = self.node.cache.pools
        return {"cores": cores,
                "cpu_memory_bytes": pools["cpu"].budget if "cpu" in pools else 0,
                "gpus": [{"device": name, "memory_bytes": p.budget}
                         for name, p in sorted(pools.items()) if name != "cpu"]}

    def _collect_arrivals(self) -> dict[str, dict[str, Any]]:
        """Sample the counters; queue this interval's arrivals; the interval deltas."""
        now, current = self.clock(), self.sampler.sample()
        seconds = now - (self._previous_at if self._previous_at is not None else now)
        deltas: dict[str, dict[str, Any]] = {}
        for model, cur in current.items():
            prev = self._previous.get(model, {})
            d = {k: cur[k] - prev.get(k, 0.0) for k in ("requests", "drops", "ok", "ok_seconds")}
            pb = prev.get("buckets", {})
            d["buckets"] = sorted((le, c - pb.get(le, 0.0)) for le, c in cur["buckets"].items())
            deltas[model] = d
            if seconds > 0 and model in self.node.cache.specs:
                self._pending.setdefault(model, deque(maxlen=MAX_PENDING_POINTS)).append(
                    (now, seconds, d["requests"]))
        self._previous, self._previous_at = current, now
        return deltas

    def build_report(self) -> dict[str, Any]:
        """The report body for now (and queue the interval's arrivals)."""
        deltas = self._collect_arrivals()
        totals = self._previous
        now = self.clock()
        cache = self.node.cache
        models: dict[str, Any] = {}
        for name in sorted(cache.specs):
            try:
                entry = cache.entry(name)
            except CacheError:
                continue
            info = cache.describe(entry)
            resident = any(e.state is State.READY for (n, _), e in cache.entries.items()
                           if n == name)
            d, total = deltas.get(name), totals.get(name)
            m: dict[str, Any] = {
                "device": entry.device, "state": info["state"], "resident": resident,
                "pinned": entry.account.pinned, "size_bytes": info["size_bytes"],
                "load_seconds": info["load_seconds"],
                "arrivals": [[round(now - t, 6), round(s, 6), c]
                             for t, s, c in self._pending.get(name, ())],
                "requests": d["requests"] if d else 0.0, "drops": d["drops"] if d else 0.0,
            }
            rt = self._runtime(entry)
            if rt is not None:
                m["workers"] = rt.workers
            batches = self._batches(rt)
            if batches:
                m["batches"] = batches
                m["batch_ms"] = {str(b): round(t * 1000.0, 3)
                                 for b, t in rt.tuner.profile.means().items()}
            elif total and total["ok"] > 0:
                m["batches"] = {"1": {"count": total["ok"], "seconds": total["ok_seconds"]}}
            if d and d["ok"] > 0:
                m["latency_ms"] = {f"p{p:g}": round(v * 1000.0, 3) for p in PERCENTILES
                                   for v in [histogram_quantile(p / 100.0, d["buckets"])]
                                   if v is not None}
            models[name] = m
        report = {"capacity": self.capacity(), "interval_s": self.interval, "models": models}
        disk = getattr(self.node, "disk", None)
        # only when there is something to say: a coordinator older than these fields
        # still takes the reports of nodes without sourced models
        held = disk.holdings() if disk is not None else []
        pulling = disk.pulling() if disk is not None else []
        if held:
            report["disk"] = [{"model": h["model"], "version": h["version"],
                               "bytes": h["bytes"]} for h in held]
        if pulling:
            report["pulling"] = [{"model": p["model"], "version": p["version"],
                                  "bytes": p["bytes"], "total": p["total_bytes"] or None}
                                 for p in pulling]
        if self.link.node_type:
            report["node_type"] = self.link.node_type
        version_stats = self._version_stats()
        if version_stats:
            report["version_stats"] = version_stats
        return report

    def _runtime(self, entry: Any) -> Any:
        """The batching layer's runtime for ``entry`` (None without a batching layer)."""
        serving = getattr(self.node, "serving", None)
        return serving.runtime(entry) if serving is not None else None

    @staticmethod
    def _batches(rt: Any) -> dict[str, dict[str, float]] | None:
        """All batches run, as ``{b: {count, seconds}}`` at the mean batch size b."""
        if rt is None or not rt.batches:
            return None
        size = max(1, round(rt.batch_rows / rt.batches))
        seconds = rt.tuner.profile.predict(size)
        if seconds is None:
            return None
        return {str(size): {"count": rt.batches, "seconds": rt.batches * seconds}}

    async def report_once(self) -> Directives:
        """Send one report; the directives in the answer (raises on any failure)."""
        assert self._session is not None, "start() first"
        body = self.build_report()
        token = await report_token(self._session, self.link, self.name)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self._session.post(self.url, json=body, headers=headers) as resp:
            try:
                answer = await resp.json(content_type=None, loads=load_json)
            except ValueError:
                answer = None
            if resp.status != 200:
                message = answer.get("error") if isinstance(answer, dict) else resp.reason
                raise RuntimeError(f"coordinator answered {resp.status}: {message}")
        directives = Directives.from_json(answer)
        self.book.issue(directives, self.clock())
        for queue in self._pending.values():
            queue.clear()  # delivered
        self.last_ok = self.clock()
        self.reports += 1
        return directives

    # -- directives ------------------------------------------------------------------
    def apply(self, directives: Directives) -> None:
        """Make the node follow ``directives`` (pins, prefetches, recorded counts)."""
        cache = self.node.cache
        self.directives = directives
        # a model whose source is still being listed is pinned by the next directives
        wanted = {m for m in directives.pin if m in cache.specs and not cache.specs[m].pending}
        for name in sorted(wanted):
            try:
                entry = cache.entry(name)
            except CacheError as exc:
                log.warning("coordinator asks to pin %s: %s", name, exc)
                continue
            if not entry.account.pinned:
                cache.set_pinned(name, True)
                self.pinned_by_us.add(name)
        for name in sorted(self.pinned_by_us - wanted):
            self._unpin(name)
        for name in directives.prefetch:
            self._prefetch(name)
        for name in wanted:  # pinned models belong in memory even if not asked to fetch
            self._prefetch(name)
        self.workers = {m: n for m, n in directives.workers.items() if m in cache.specs}
        self._apply_workers()
        self.drop_rate = {m: r for m, r in directives.drop_rate.items() if m in cache.specs}
        self._save_pins()
        self._apply_versions(directives.model_versions)
        for pull in directives.pull:
            self._assign(pull)
        for name in directives.drop:
            self._drop(name)

    def expire_if_due(self) -> None:
        """Revert what the last directives did once they are older than their ttl."""
        if self.directives is None or self.book.current(self.name, self.clock()) is not None:
            return
        log.warning("directives from %s expired (no renewal in %gs): reverting pins %s",
                    self.link.url, self.directives.ttl_s, sorted(self.pinned_by_us) or "none")
        self.book.expire(self.name)
        self.directives = None
        for name in sorted(self.pinned_by_us):
            self._unpin(name)
        self.workers, self.drop_rate = {}, {}
        self._apply_workers()
        self._save_pins()

    def _apply_workers(self) -> None:
        """Worker counts of ``self.workers`` on the batching layer; models no longer in it
        get back the count they had before the coordinator changed it."""
        serving = getattr(self.node, "serving", None)
        if serving is None:
            return
        cache = self.node.cache
        for name in sorted(set(self._workers_before) - set(self.workers)):
            count, was_set = self._workers_before.pop(name)
            with contextlib.suppress(CacheError):
                entry = cache.entry(name)
                serving.set_workers(entry, count)
                serving.runtime(entry).workers_set = was_set
        for name, count in sorted(self.workers.items()):
            try:
                entry = cache.entry(name)
            except CacheError:
                continue
            rt = serving.runtime(entry)
            self._workers_before.setdefault(name, (rt.workers, rt.workers_set))
            if count >= 1 and rt.workers != count:
                serving.set_workers(entry, count)

    def _unpin(self, name: str) -> None:
        self.pinned_by_us.discard(name)
        with contextlib.suppress(CacheError):
            if self.node.cache.entry(name).account.pinned:
                self.node.cache.set_pinned(name, False)

    def _prefetch(self, name: str) -> None:
        cache = self.node.cache
        try:
            entry = cache.entry(name)
        except CacheError:
            return
        if entry.state is State.READY or name in self.loading:
            return

        async def load() -> None:
            try:
                await cache.ensure_loaded(name)
                log.info("prefetched %s for the coordinator", name)
            except CacheError as exc:
                log.warning("prefetch %s: %s", name, exc)
            finally:
                self.loading.pop(name, None)

        self.loading[name] = asyncio.get_running_loop().create_task(load())

    # -- models that travel: pull and drop ----------------------------------------------
    def _assigned(self, name: str) -> bool:
        """``name`` is served from an assigned model directory (the coordinator's)."""
        spec = self.node.cache.specs.get(name)
        return spec is not None and spec.path == self.node.config.assigned_dir / name

    def _assign(self, pull: Pull) -> None:
        task = self.assigning.get(pull.model)
        if task is not None and not task.done():
            return
        self.assigning[pull.model] = asyncio.get_running_loop().create_task(
            self._carry_out(pull))

    async def _carry_out(self, pull: Pull) -> None:
        name = pull.model
        try:
            await self._pull(pull)
            self.assign_errors.pop(name, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the next directives try again
            self.assign_errors[name] = f"{type(exc).__name__}: {exc}" \
                if not isinstance(exc, (ValueError, CacheError)) else str(exc)
            log.warning("coordinator's pull of %s: %s", name, self.assign_errors[name])

    async def _pull(self, pull: Pull) -> None:
        """Write ``pull``'s model directory, list its source, pull its files, load it."""
        node, name = self.node, pull.model
        spec = node.cache.specs.get(name)
        if spec is not None and not self._assigned(name):
            if name not in self._shadowed:
                self._shadowed.add(name)
                log.info("coordinator's pull of %s: the repository's own entry %s serves "
                         "it", name, spec.path)
            return
        refuse_credentials(pull.source, pull.source_options)
        doc = {**pull.config, "source": pull.source,
               "source_options": dict(pull.source_options)}
        if pull.digest is not None:  # a digest pins one version: the catalog's, or
            doc["digest"] = pull.digest  # the newest listed
            if pull.version is not None:
                doc["version"] = pull.version
        where = node.config.assigned_dir / name / "config.yaml"
        parse_model_config(doc, where)  # ConfigError (a ValueError) names the key
        text = yaml_text(doc)
        relist = spec is None or self._pulled.get(name) != (pull.version, pull.digest)
        if spec is None or _read(where) != text:
            await asyncio.get_running_loop().run_in_executor(None, _write_atomically,
                                                             where, text)
            log.info("coordinator assigns %s from %s", name, redact_url(pull.source))
            node.rescan(relist=False)
        if relist or pull.version not in (None, *node.cache.specs[name].versions):
            if await node.disk.refresh([name]):
                node.rescan(relist=False)
        spec = node.cache.specs[name]
        if spec.error or spec.pending:
            raise ValueError(spec.error or spec.pending)
        pin = node.cache.version_pins.get(name)
        version = node.cache.default_version(spec)
        if pin is None and pull.version is not None:
            version = max(pull.version, version or 0)
        elif pin is not None and pin.serve is not None:
            version = pin.serve  # exactly the version pinned (the one below serves meanwhile)
        if version not in spec.versions:
            raise ValueError(f"model {name!r}: its source lists no version {version} "
                             f"(versions: {', '.join(map(str, spec.versions)) or 'none'})")
        self._pulled[name] = (pull.version, pull.digest)
        await node.disk.ensure(name, version)
        if pull.load:
            await node.cache.ensure_loaded(name)

    def _drop(self, name: str) -> None:
        """Unload assigned ``name`` once idle, remove its directory, free its files."""
        if not self._assigned(name):
            return
        if any(t is not None and not t.done()
               for t in (self.assigning.get(name), self.dropping.get(name))):
            return
        cache = self.node.cache
        entries = [e for (n, _), e in cache.entries.items() if n == name]
        if any(e.account.in_flight or e.account.pinned
               or e.state in (State.LOADING, State.UNLOADING) for e in entries):
            return  # busy: the next directives try again
        for entry in entries:
            if entry.state is State.READY:
                self.dropping[name] = asyncio.get_running_loop().create_task(
                    self._evict(entry))
                return  # removed once unloaded (the next directives)
        shutil.rmtree(self.node.config.assigned_dir / name, ignore_errors=True)
        self._pulled.pop(name, None)
        self.node.rescan(relist=False)
        self.node.disk.drop(name)
        log.info("coordinator moved %s away: dropped", name)

    async def _evict(self, entry: Any) -> None:
        try:
            await self.node.cache.evict(entry.name, entry.version)
        except CacheError as exc:
            log.info("drop %s: not yet: %s", entry.key, exc)

    # -- versions the coordinator pins: rollouts ------------------------------------------
    def _apply_versions(self, model_versions: dict[str, Any]) -> None:
        """Pin each model to the version the coordinator names (``model_versions``);
        versions no longer kept are unloaded once idle; saved for a restart."""
        cache = self.node.cache
        pins = {m: VersionPin.of(v) for m, v in model_versions.items()}
        before = cache.version_pins.pins
        if pins == before:
            return
        cache.set_version_pins(pins)
        unlisted = sorted(m for m, p in pins.items() if p.serve is not None
                          and m in cache.specs and cache.specs[m].sourced
                          and p.serve not in cache.specs[m].versions)
        if unlisted and (self._relisting is None or self._relisting.done()):
            self._relisting = asyncio.get_running_loop().create_task(self._relist(unlisted))
        rollouts = getattr(self.node, "rollouts", None)
        for name, pin in before.items():
            released = set(pin.keep) - set(pins[name].keep if name in pins else ())
            if released and rollouts is not None:
                rollouts.release(name, released)
        changed = sorted(m for m in set(pins) | set(before) if pins.get(m) != before.get(m))
        for name in changed:
            self.version_errors.pop(name, None)
        log.info("coordinator pins versions of %s: %s", ", ".join(changed),
                 {m: pins[m].to_json() if m in pins else None for m in changed})
        try:
            write_state(self.versions_path, {"format": PINS_FORMAT, "versions": {
                m: p.to_json() for m, p in sorted(pins.items())}})
        except OSError as exc:
            log.warning("cannot write %s: %s", self.versions_path, exc)

    async def _relist(self, names: list[str]) -> None:
        """List the sources of ``names``, pinned to a version their listing lacks; a
        version still missing after it is the pin's error (``version_stats``)."""
        node = self.node
        try:
            if await node.disk.refresh(names):
                node.rescan(relist=False)
        except Exception as exc:  # noqa: BLE001 - the listing's own error is kept
            log.warning("listing %s again for the pinned versions: %s", names, exc)
        for name in names:
            spec, pin = node.cache.specs.get(name), node.cache.version_pins.get(name)
            if spec is not None and pin is not None and pin.serve is not None \
                    and pin.serve not in spec.versions:
                self.version_errors[name] = (
                    f"model {name!r}: its source lists no version {pin.serve} (versions: "
                    f"{', '.join(map(str, spec.versions)) or 'none'})")

    def _restore_versions(self) -> None:
        """Start from the version pins saved before a restart (they do not lapse)."""
        saved = read_state(self.versions_path) if self.versions_path.exists() else None
        pins = {}
        for name, doc in ((saved or {}).get("versions") or {}).items():
            try:
                pins[name] = VersionPin.from_json(doc)
            except (AttributeError, TypeError):
                log.warning("%s: ignored a malformed pin of %r", self.versions_path, name)
        if pins:
            self.node.cache.set_version_pins(pins)

    def _version_stats(self) -> dict[str, list[dict[str, Any]]]:
        """``version_stats`` for the models under a rollout (``wire.VersionStat``)."""
        cache = self.node.cache
        watched = {m for m, p in cache.version_pins.pins.items()
                   if p.rollout is not None and m in cache.specs}
        if not watched:
            self._version_buckets = {}
            return {}
        sampled = self.sampler.sample_versions(watched)
        out: dict[str, list[dict[str, Any]]] = {}
        buckets_now: dict[tuple[str, str], dict[float, float]] = {}
        for name in sorted(watched):
            spec, pin = cache.specs[name], cache.version_pins.pins[name]
            serving = cache.serving_version.get(name, cache.default_version(spec))
            versions = {v for (n, v), e in cache.entries.items() if n == name
                        and (e.state is not State.UNLOADED or e.life.load_attempts)}
            versions |= {int(v) for (n, v) in sampled if n == name and v.isdigit()}
            versions |= set(pin.keep) | ({pin.serve} if pin.serve is not None else set())
            rows = []
            for version in sorted(versions):
                entry = cache.entries.get((name, version))
                figures = sampled.get((name, str(version)), {})
                buckets = figures.get("buckets", {})
                buckets_now[(name, str(version))] = buckets
                row: dict[str, Any] = {
                    "version": version, "serving": version == serving,
                    "state": entry.state.value if entry is not None else "unknown",
                    "size_bytes": entry.account.size_bytes
                    if entry is not None and entry.state is State.READY else 0,
                    "requests": figures.get("requests", 0.0),
                    "errors": figures.get("errors", 0.0), "ok": figures.get("ok", 0.0),
                    "load_failures": entry.life.failed_loads if entry is not None else 0,
                    "latency_buckets": [[round(le * 1000.0, 6), c] for le, c
                                        in sorted(buckets.items()) if le != math.inf],
                }
                before = self._version_buckets.get((name, str(version)), {})
                delta = sorted((le, c - before.get(le, 0.0)) for le, c in buckets.items())
                row["latency_ms"] = {f"p{p:g}": round(v * 1000.0, 3) for p in PERCENTILES
                                     for v in [histogram_quantile(p / 100.0, delta)]
                                     if v is not None}
                error = entry.life.error if entry is not None \
                    and entry.state is State.FAILED else None
                if error is None and version == pin.serve and version != serving:
                    error = self.version_errors.get(name) or self.assign_errors.get(name)
                if error:
                    row["error"] = error[:1024]
                rows.append(row)
            out[name] = rows
        self._version_buckets = buckets_now
        return out

    def _save_pins(self) -> None:
        try:
            saved = read_state(self.pins_path) if self.pins_path.exists() else None
            if saved is None and not self.pinned_by_us:
                return
            if saved and sorted(saved.get("pins", [])) == sorted(self.pinned_by_us):
                return
            write_state(self.pins_path, {"format": PINS_FORMAT,
                                         "pins": sorted(self.pinned_by_us)})
        except OSError as exc:
            log.warning("cannot write %s: %s", self.pins_path, exc)

    def _revert_saved_pins(self) -> None:
        """Unpin what this reporter pinned before a restart (no directives cover it now)."""
        saved = read_state(self.pins_path) if self.pins_path.exists() else None
        for name in (saved or {}).get("pins", []):
            if isinstance(name, str):
                self._unpin(name)
        if saved:
            self._save_pins()
            self.node.schedule_persist()

    def status(self) -> dict[str, Any]:
        now = self.clock()
        expires = self.book.expires_at(self.name)
        return {"configured": True, "url": self.link.url, "node": self.name,
                "interval_s": self.interval, "reports": self.reports,
                "last_report_s_ago": None if self.last_ok is None
                else round(now - self.last_ok, 3),
                "failures": self.failures, "last_error": self.last_error,
                "directives": self.directives.to_json() if self.directives else None,
                "directives_expire_in_s": None if self.directives is None or expires is None
                else round(expires - now, 3),
                "pinned_by_coordinator": sorted(self.pinned_by_us),
                "prefetching": sorted(self.loading),
                "assigning": sorted(n for n, t in self.assigning.items() if not t.done()),
                "assign_errors": dict(self.assign_errors),
                "workers": dict(self.workers), "drop_rate": dict(self.drop_rate),
                "workers_applied": getattr(self.node, "serving", None) is not None}


def yaml_text(doc: dict[str, Any]) -> str:
    import yaml

    return "# written by edgeagent for the coordinator's pull directive\n" + \
        yaml.safe_dump(doc, sort_keys=True)


def _read(path: Any) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write_atomically(path: Any, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


REPORTER: web.AppKey[Reporter] = web.AppKey("reporter", Reporter)


async def coordinator_status(request: web.Request) -> web.Response:
    reporter = request.app.get(REPORTER)
    if reporter is None:
        return web.json_response({"configured": False})
    return web.json_response(reporter.status())


def setup(app: web.Application, node: "Node") -> None:
    """Add ``GET /v1/coordinator`` and, when the config has a ``coordinator:`` section,
    a reporter started and stopped with the app."""
    app.router.add_get("/v1/coordinator", coordinator_status)
    link = node.config.coordinator
    if link is None:
        return
    app[REPORTER] = Reporter(node, link)

    async def on_startup(app: web.Application) -> None:
        await app[REPORTER].start()

    async def on_cleanup(app: web.Application) -> None:
        await app[REPORTER].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
