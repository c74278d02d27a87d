"""The agent's side of the coordinator: report capacity and per-model stats every
``report_interval_s`` and apply the directives that come back. Between full reports a
node renews a lease instead, where its coordinator takes them (``agent.node.lease``
decides which goes: a full report when something the planner uses changed, or every
``full_report_s``).

Reports and directives follow the wire schema in ``agent.wire``.
Nothing here can stop the node serving: every failure (coordinator down, bad answer,
a model that will not load) is logged and retried with exponential backoff and full
jitter (``agent.backoff``: a fleet that lost its coordinator does not come back in one
second); a refusal with ``Retry-After`` (429, or 503 from a coordinator shedding load)
is retried between that and twice that. Meanwhile the node serves on its last
directives, ``GET /v1/coordinator`` says how old they are (``directives_age_s``), and
directives that are not renewed within their ``ttl_s`` are reverted.

One connection to the coordinator, kept between reports; over TLS a new one resumes the
last session (``agent.security.tls.ResumingContext``: a ticket instead of a full handshake).

What applying means:
* ``pin``: pinned through ``ModelCache.set_pinned`` while the pinned models of a device
  still leave room to load the largest model it serves; the rest are prefetched and
  kept by use; only the coordinator's pins are ever unpinned, and they are kept across
  restarts (``agent.node.coordinatorpins``).
* ``prefetch``: ``ModelCache.ensure_loaded`` in the background, one load per model at
  a time; a load that does not fit is logged and retried on the next directives. A
  planned model that is not pinned is loaded once per plan (until the directives'
  ``pin`` changes): directives renewed, or with another ``prefetch`` (the coordinator
  lists there what the node's last report did not hold), do not load again what its
  use evicted, so a node whose planned models do not all fit lets its cache choose.
* ``workers``: set through the batching layer (``Serving.set_workers``, as
  ``POST /v1/cache/{name}/workers`` does); the count a model had before is restored
  when the directives drop it or lapse.
* ``drop_rate``: recorded and shown in ``GET /v1/coordinator`` (the batching layer's
  admission control has no knob for it yet).
* ``pull`` and ``drop``: the models the coordinator moves here (an assigned model
  directory, its files pulled into the disk tier, loaded where it says) and away
  (unloaded once idle, its directory removed): ``agent.node.assignments``. A pull that
  lapses is not undone, only not renewed; a drop of a busy model is tried again by the
  next directives.
* ``routing``: the routing table (or its version alone, confirming the one held) goes
  to the node's router (``agent.node.routing``); the report says where peers reach
  this node, the table it holds, and per model its routed traffic.
* ``model_versions`` (the coordinator's rollouts): the version each model serves, the
  ones kept at hand and the bad ones (``agent.node.coordinatorversions``: they do not
  lapse); for the models under a rollout the report carries ``version_stats``.

Stats come from the agent's Prometheus registry (``Metrics``), as deltas between
samples: arrivals (requests of any outcome that reached the fleet here: those a peer
forwarded here are the peer's), drops (503 answers), latency percentiles
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
import os
import random
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import aiohttp
from aiohttp import web

from agent.backoff import backoff_cap, retry_delay
from agent.config import CoordinatorLink
from agent.node.assignments import Assignments
from agent.node.cache import CacheError
from agent.node.cache.lifecycle import State
from agent.node.coordinatorcall import CoordinatorRefused, post
from agent.node.coordinatorpins import CoordinatorPins
from agent.node.coordinatorversions import CoordinatorVersions
from agent.node.join import report_token
from agent.node.lease import LeaseKeeper
from agent.percentiles import histogram_quantile, percentiles_ms
from agent.security.tls import ResumingContext, verify_failure
from agent.wire import DirectiveBook, Directives, parse_lease_answer

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.reporter")

MAX_PENDING_POINTS = 500  # arrival intervals kept per model while the coordinator is away


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


class Reporter:
    """Periodic reports to the coordinator and the directives they bring back."""

    def __init__(self, node: "Node", link: CoordinatorLink, *,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random) -> None:
        self.node, self.link, self.clock, self.rng = node, link, clock, rng
        self.name = node.config.node_name
        self.url = link.url.rstrip("/") + f"/v1/nodes/{self.name}/report"
        self.lease_url = link.url.rstrip("/") + f"/v1/nodes/{self.name}/lease"
        self.lease = LeaseKeeper(link.full_report_s, link.change_threshold,
                                 quantile=histogram_quantile, rng=rng)
        self.interval = float(link.report_interval_s)
        self.max_backoff = backoff_cap(self.interval)
        self.sampler = MetricsSampler(node.metrics.registry)
        self.book = DirectiveBook()
        self.pins = CoordinatorPins(node)
        self.workers: dict[str, int] = {}
        self._workers_before: dict[str, tuple[int, bool]] = {}  # name -> (count, was set)
        self.drop_rate: dict[str, float] = {}
        self.directives: Directives | None = None
        self.directives_at: float | None = None  # clock() when they came
        self.loading: dict[str, asyncio.Task] = {}
        #: the directives' plan (their ``pin``) and its models in memory since it came
        self._plan: tuple[str, ...] | None = None
        self.prefetched: set[str] = set()
        #: The models the coordinator moves here (pull) and away (drop).
        self.assignments = Assignments(node)
        #: The versions the coordinator's rollouts pin, and their figures.
        self.versions = CoordinatorVersions(node, self.assignments.assign_errors)
        self.failures = 0
        self.last_error: str | None = None
        self.last_ok: float | None = None  # clock() of the last successful report
        self.retry_after: float | None = None  # the last refusal's Retry-After
        self.next_at: float | None = None  # clock() of the next report
        self.reports = 0
        self._previous: dict[str, dict[str, Any]] = {}
        self._previous_at: float | None = None
        self._pending: dict[str, deque] = {}
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------
    @property
    def pinned_by_us(self) -> set[str]:
        """The models pinned for the coordinator."""
        return self.pins.pinned

    async def start(self) -> None:
        self.pins.revert_saved()
        self.versions.restore()
        self._previous, self._previous_at = self.sampler.sample(), self.clock()
        link = self.link
        ssl_context = ResumingContext.for_client(link.ca_file, link.cert_file,
                                                 link.key_file, prefix="coordinator.") \
            if link.url.startswith("https://") else None
        # one session on one connection, kept between reports: one TLS handshake, not
        # one per report (idle for two intervals at most before it is closed), and a
        # new connection resumes the last session
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval)),
            connector=aiohttp.TCPConnector(ssl=ssl_context or True, limit=1,
                                           keepalive_timeout=max(15.0, 2 * self.interval)))
        self._task = asyncio.get_running_loop().create_task(self._run())
        log.info("reporting to %s every %gs as node %r", self.link.url, self.interval,
                 self.name)

    async def stop(self) -> None:
        for task in [self._task, *self.loading.values(), *self.assignments.tasks(),
                     *self.versions.tasks()]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        delay = 0.0
        while True:
            self.next_at = self.clock() + delay
            await self._sleep(delay)
            try:
                self.expire_if_due()
                directives = await self.report_once()
                self.apply(directives)
                if self.failures:
                    log.info("coordinator %s reachable again", self.link.url)
                self.failures, self.last_error, self.retry_after = 0, None, None
                delay = self.interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - never let reporting hurt serving
                self.failures += 1
                self.retry_after = exc.retry_after if isinstance(exc, CoordinatorRefused) else None
                self.last_error = verify_failure(exc, self.link.ca_file) or (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                delay = retry_delay(self.failures, self.interval, self.max_backoff,
                                    self.retry_after, rng=self.rng)
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

    def _collect_arrivals(self, received: dict[str, float] | None = None
                          ) -> dict[str, dict[str, Any]]:
        """Sample the counters; queue this interval's arrivals (the requests that
        reached the fleet here: those a peer forwarded here, ``received``, are the
        peer's); the interval deltas."""
        received = received or {}
        router = self.node.router
        now, current = self.clock(), self.sampler.sample()
        seconds = now - (self._previous_at if self._previous_at is not None else now)
        deltas: dict[str, dict[str, Any]] = {}
        for model, cur in current.items():
            prev = self._previous.get(model, {})
            d = {k: cur[k] - prev.get(k, 0.0) for k in ("requests", "drops", "ok", "ok_seconds")}
            pb = prev.get("buckets", {})
            d["buckets"] = sorted((le, c - pb.get(le, 0.0)) for le, c in cur["buckets"].items())
            deltas[model] = d
            if seconds > 0 and (model in self.node.cache.specs or router.knows(model)):
                arrivals = max(d["requests"] - received.get(model, 0.0), 0.0)
                self._pending.setdefault(model, deque(maxlen=MAX_PENDING_POINTS)).append(
                    (now, seconds, arrivals))
                self.lease.observe(model, now, seconds, arrivals, d["drops"], d["buckets"])
        self._previous, self._previous_at = current, now
        return deltas

    def build_report(self) -> dict[str, Any]:
        """The report body for now (and queue the interval's arrivals)."""
        router = self.node.router
        routed = router.interval() if router.enabled else {}
        deltas = self._collect_arrivals({m: r["received"] for m, r in routed.items()})
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
            d = deltas.get(name)
            m: dict[str, Any] = {
                "device": entry.device, "state": info["state"], "resident": resident,
                "pinned": entry.account.pinned, "size_bytes": info["size_bytes"],
                "load_seconds": info["load_seconds"],
                "arrivals": [[round(now - t, 6), round(s, 6), c]
                             for t, s, c in self._pending.get(name, ())],
                "requests": d["requests"] if d else 0.0, "drops": d["drops"] if d else 0.0,
            }
            self._add_serving(m, entry, d, totals.get(name))
            models[name] = m
        report = {"capacity": self.capacity(), "interval_s": self.interval, "models": models}
        if router.enabled:
            if router.address is not None:
                report["peer"] = router.address.to_json()
            report["routing"] = {"version": router.table.version,
                                 "models": self._routed(routed, deltas, now)}
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
        report.update(self.versions.report_fields())  # while a rollout runs
        return report

    def _routed(self, routed: dict[str, dict[str, int]], deltas: dict[str, dict[str, Any]],
                now: float) -> dict[str, dict[str, Any]]:
        """The report's ``routing.models``: per model this interval's routed traffic
        (``served`` = requests answered here), and for a model the repository lacks,
        the arrivals and latency that ``models`` would carry."""
        out = {}
        for name in sorted(set(routed) | {m for m, d in deltas.items() if d["requests"]}):
            r, d = routed.get(name, {}), deltas.get(name)
            if name not in self.node.cache.specs and not self.node.router.knows(name):
                continue
            row: dict[str, Any] = {
                "served": max((d["requests"] if d else 0.0) - r.get("forwarded", 0), 0.0),
                **{k: r.get(k, 0) for k in ("forwarded", "received", "fallbacks", "errors")}}
            if name not in self.node.cache.specs:
                row["arrivals"] = [[round(now - t, 6), round(s, 6), c]
                                   for t, s, c in self._pending.get(name, ())]
                if d and d["ok"] > 0:
                    row["latency_ms"] = percentiles_ms(d["buckets"])
            out[name] = row
        return out

    def _add_serving(self, m: dict[str, Any], entry: Any, d: dict[str, Any] | None,
                     total: dict[str, Any] | None) -> None:
        """A model's workers, batch sizes and times, and latency percentiles (from the
        interval's histogram ``d``) in its report ``m``."""
        rt = self._runtime(entry)
        if rt is not None:
            m["workers"] = rt.workers
        batches = self._batches(rt)
        if batches:
            m["batches"] = batches
            m["batch_ms"] = {str(b): round(t * 1000.0, 3)
                             for b, t in rt.tuner.profile.means().items()}
        elif total and total["ok"] > 0 and not self.node.router.stats.forwarded_any(
                entry.name):  # (a model this node forwards: its answers' latency is not
            # processing)
            m["batches"] = {"1": {"count": total["ok"], "seconds": total["ok_seconds"]}}
        if d and d["ok"] > 0:
            m["latency_ms"] = percentiles_ms(d["buckets"])

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
        """Send one report, or renew the lease (``agent.node.lease``); the directives in
        force after the answer (raises on any failure)."""
        assert self._session is not None, "start() first"
        body = self.build_report()
        reason = self.lease.due(body, self.clock())
        directives = None if reason else await self._renew()
        if directives is None:  # a full report: due, or asked for
            try:
                directives = Directives.from_json(await self._post(
                    self.url, self.lease.prepare(body)))
            except CoordinatorRefused as exc:
                if exc.status == 400 and "report_id" in body:  # it took a lease, not this
                    self.lease.supported = None
                raise
            self.lease.reported(body, directives, self.clock(),
                                reason or "asked by the coordinator")
            for queue in self._pending.values():
                queue.clear()  # delivered
        self.reports += 1  # answered: a full report or a lease
        self.directives_at = self.clock()
        self.book.issue(directives, self.directives_at)
        self.node.router.take(directives)
        self.last_ok = self.clock()
        return directives

    async def _renew(self) -> Directives | None:
        """Renew the lease: the directives that stand, or new ones; None where the
        coordinator wants the full report (or takes no leases after all)."""
        router = self.node.router
        try:
            answer = parse_lease_answer(await self._post(self.lease_url, self.lease.lease(
                self.directives, router.table.version if router.enabled else None)))
        except CoordinatorRefused as exc:
            if exc.status == 429 or exc.status >= 500:
                raise
            self.lease.refused(self.clock())  # a coordinator without leases: 404 (or
            return None  # 403 for a path it does not know); a full report says more
        asked = not isinstance(answer, Directives) and (
            answer.report or self.directives is None or answer.answer != self.directives.answer)
        self.lease.answered(asked)
        if asked:
            return None
        return answer if isinstance(answer, Directives) else self.directives

    async def _post(self, url: str, body: dict[str, Any]) -> bytes:
        """POST ``body`` with this node's token (``coordinatorcall.post``)."""
        token = await report_token(self._session, self.link, self.name)
        return await post(self._session, url, body, token)

    # -- directives ------------------------------------------------------------------
    def apply(self, directives: Directives) -> None:
        """Make the node follow ``directives`` (pins, prefetches, recorded counts)."""
        cache = self.node.cache
        self.directives = directives
        # a model whose source is still being listed is pinned by the next directives
        planned = [m for m in directives.pin if m in cache.specs and not cache.specs[m].pending]
        plan = tuple(directives.pin)  # (its prefetch list follows what was resident)
        if plan != self._plan:  # a new plan: each of its models is loaded once again
            self._plan, self.prefetched = plan, set()
        self.pins.hold(planned, directives.workers)
        for name in [*planned, *directives.prefetch]:  # pinned ones: in memory even if
            self._prefetch(name)                       # not asked to fetch
        self.workers = {m: n for m, n in directives.workers.items() if m in cache.specs}
        self._apply_workers()
        self.drop_rate = {m: r for m, r in directives.drop_rate.items() if m in cache.specs}
        self.pins.save()
        self.versions.apply(directives.model_versions)
        for pull in directives.pull:
            self.assignments.assign(pull)
        for name in directives.drop:
            self.assignments.drop(name)

    def expire_if_due(self) -> None:
        """Revert what the last directives did once they are older than their ttl."""
        if self.directives is None or self.book.current(self.name, self.clock()) is not None:
            return
        log.warning("directives from %s expired (no renewal in %gs): reverting pins %s",
                    self.link.url, self.directives.ttl_s, sorted(self.pinned_by_us) or "none")
        self.book.expire(self.name)
        self.directives = self.directives_at = None
        self.pins.release()
        self.workers, self.drop_rate = {}, {}
        self._apply_workers()
        self.pins.save()

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

    def _prefetch(self, name: str) -> None:
        cache = self.node.cache
        try:
            entry = cache.entry(name)
        except CacheError:
            return
        if entry.state is State.READY:
            self.prefetched.add(name)  # in memory under this plan, whoever loaded it
            return
        if name in self.loading or (name in self.prefetched and name not in self.pins.pinned):
            return  # a model not pinned is loaded for a plan once, then kept by use

        async def load() -> None:
            try:
                await cache.ensure_loaded(name)
                self.prefetched.add(name)
                log.info("prefetched %s for the coordinator", name)
            except CacheError as exc:
                log.warning("prefetch %s: %s", name, exc)
            finally:
                self.loading.pop(name, None)

        self.loading[name] = asyncio.get_running_loop().create_task(load())

    # -- what the reporter shows ---------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock()
        expires = self.book.expires_at(self.name)
        return {"configured": True, "url": self.link.url, "node": self.name,
                "interval_s": self.interval, "reports": self.reports,
                "last_report_s_ago": None if self.last_ok is None
                else round(now - self.last_ok, 3),
                "failures": self.failures, "last_error": self.last_error,
                "retry_after_s": self.retry_after,
                "next_report_in_s": None if self.next_at is None
                else round(max(0.0, self.next_at - now), 3),
                "directives": _without_table(self.directives),
                "directives_age_s": None if self.directives is None
                or self.directives_at is None else round(now - self.directives_at, 3),
                "directives_expire_in_s": None if self.directives is None or expires is None
                else round(expires - now, 3),
                **self.lease.status(now),
                "pinned_by_coordinator": sorted(self.pinned_by_us),
                "prefetching": sorted(self.loading),
                **self.assignments.status(),
                "workers": dict(self.workers), "drop_rate": dict(self.drop_rate),
                "workers_applied": getattr(self.node, "serving", None) is not None}


def _without_table(directives: Directives | None) -> dict[str, Any] | None:
    """Directives as ``GET /v1/coordinator`` shows them: the routing table by its
    version (``GET /v1/routing`` shows the table)."""
    if directives is None:
        return None
    out = directives.to_json()
    out.pop("routing", None)
    return out


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
