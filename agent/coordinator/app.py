"""The coordinator's aiohttp application: ``create_app`` builds it, state lives on a
``Coordinator`` stored on the app (no globals), handlers are thin.

API (JSON; errors are ``{"error": "..."}`` with a 4xx naming the problem)::

    GET    /v1/health                     ok and whether this one plans; 503 while
                                          its store fails (no token)
    POST   /v1/nodes/{name}/report        a node's report (agent.wire) -> its directives
    POST   /v1/nodes/{name}/lease         its lease between full reports (api_lease)
    GET    /v1/nodes[/{name}], DELETE /v1/nodes/{name}   the nodes (api_nodes)
    GET    /v1/models[/{name}], PUT /v1/models/{name}, DELETE /v1/models/{name}
                                          the catalog (api_models)
    POST   /v1/rollouts, GET /v1/rollouts[/{id}], POST /v1/rollouts/{id}/pause|resume|abort,
    DELETE /v1/models/{name}/bad-versions/{version}   rollouts (api_rollouts)
    GET    /v1/plan                       current allocation and placement
    POST   /v1/plan                       re-plan now
    POST   /v1/sizing, GET /v1/provisioning   fleet sizing and provisioning (api_fleet)
    POST   /v1/join-tokens, /v1/join      a node's own credential (api_join)
    GET    /metrics                       failed authentications, CPU per report and
                                          per node-second, reports refused (Prometheus)
    GET    /                              the dashboard page (agent.http.dashboard)

With tokens (``admin_token_file``, ``auth.token_file``) every path but ``/v1/health`` and
the dashboard's files needs ``Authorization: Bearer <token>`` (``coordinator_need``): a
read token reads (GET), a node's report token (or its client certificate's name) posts
only that node's report, an admin token does everything. SIGHUP re-reads the token
files (``Coordinator.reload``), here and in every report worker.

Several coordinators may share one PostgreSQL store (``store: postgresql://...``): all
answer reports; the one holding the store's planning lock (``Store.leadership``) plans,
and every coordinator adopts the newest plan in the store within ``follow_interval_s``.
A coordinator that takes the lock over plans at once; ``POST /v1/plan`` on one that
does not hold it answers 409 naming that another coordinator plans.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import orjson
import psutil
from aiohttp import web

from agent.coordinator import (api_fleet, api_join, api_lease, api_models, api_nodes,
                               api_rollouts)
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.cost import SAMPLE_S, CostMeter
from agent.coordinator.lane import lane_metrics_lines, takes_lane
from agent.coordinator.ingest import (Fleet, ReportWriter, parse_report_body,
                                     refuse_new_node_past, refuse_while_store_fails, report_record,
                                     reported_models, reported_routing)
from agent.coordinator.planner import PlanError, PlannerLoops
from agent.coordinator.planworker import PlanWorker
from agent.coordinator.reportworkers import Answered, ReportWorkers
from agent.coordinator.rollouts import FleetRollouts
from agent.coordinator.shedding import Shedder
from agent.coordinator.store import StoredPlan
from agent.coordinator.stores import open_store
from agent.http.dashboard import add_dashboard, is_dashboard_path
from agent.errors import json_error, json_errors_middleware
from agent.http.eventloop import handler_args
from agent.http.body import BodyMemory, body_timeout_middleware, request_body
from agent.http.jsonnewline import json_newline
from agent.security.credentials import Credential, Credentials, load_credentials, node_credential
from agent.security.httpauth import (Guard, Need, carries_credential, host_check, is_forwarded,
                            own_names, scoped_auth)
from agent.security.tls import ServerTls
from agent.units import iso_time

log = logging.getLogger("edgeagent.coordinator")


class Coordinator:
    """Everything one coordinator process holds: config, store, planner, directives.
    Reports are answered from memory (``fleet``) and written in batches (``writer``);
    plans are made in a child process (``planner``, a ``PlanWorker``)."""

    def __init__(self, config: CoordinatorConfig, *, clock: Callable[[], float] = time.time,
                 start_loops: bool = True) -> None:
        self.config = config
        self.clock = clock
        self.tls = ServerTls(config.tls) if config.tls is not None else None
        self.names = own_names(config.host, config.allowed_hosts)  # host_check's
        self.store = open_store(config)
        #: The tokens accepted (the token files' and the nodes' own, from the store)
        #: and the failed-auth throttle and counts.
        self.file_creds = self.file_credentials()
        self._node_creds_seen: tuple | None = None
        #: The nodes' own credentials and their revoked certificates, from the store.
        self.node_creds, self.revoked = self._node_credentials_step() or ([], {})
        self.guard = Guard(Credentials([*self.file_creds, *self.node_creds], self.revoked),
                           throttle=config.auth.throttle())
        self.fleet = Fleet(config.directive_ttl_s)
        self.fleet.load(self.store.nodes(), self.store.current_plan())
        self.writer = ReportWriter(self.store, keep_s=config.history_s, clock=clock,
                                   lease_write_s=config.lease_lag_s)
        self.planner = PlanWorker(config, self.store, clock=clock)
        self.leadership = self.store.leadership()
        self.leader = self.leadership.check()
        self.follow_interval_s = 1.0
        self.loops = PlannerLoops(self.planner, prepare=self.writer.flush,
                                  adopt=self.adopt, leading=lambda: self.leader)
        self.workers = ReportWorkers(config, apply=self.take_answered,
                                     renew=lambda batch: api_lease.take_renewed(self, batch))
        self.rollouts = FleetRollouts(self)
        #: Refuses reports early while this process is overloaded (a herd).
        self.shedder = Shedder(config.report_shed_lag_ms / 1000.0, config.report_shed_queue,
                               config.report_retry_after_s)
        self.reports = 0  # answered by this process (its workers count theirs)
        self.leases = 0  # ... and leases renewed
        #: The raw lane of this process's listener (``agent.http.rawlane.RawLanes``),
        #: set by whoever listens; None: none (its counts are 0).
        self.raw_lanes: Any = None
        self.cost = CostMeter()
        self.start_loops = start_loops
        self.tasks: set[asyncio.Task] = set()
        #: Where the internal socket the report workers forward to lives (made at start).
        self.internal_dir: Path | None = None
        self._gone: frozenset[str] = frozenset()  # planned nodes silent, replanned for
        self._routed_from: tuple | None = None  # what the routing table was last made of

    def file_credentials(self) -> list[Credential]:
        return load_credentials(self.config.admin_token_file, self.config.auth.token_file)

    def reload(self) -> None:
        """SIGHUP: the token files and the TLS files read again, here and in every
        report worker. A token file that cannot be read keeps the tokens in use
        (logged); a bad TLS file raises ``ValueError`` and the running certificates
        stay."""
        try:
            self.file_creds = self.file_credentials()
            log.info("SIGHUP: %d tokens from files accepted", len(self.file_creds))
            self.spawn(self._accept())
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the tokens in use: %s", exc)
        if self.tls is not None:
            self.tls.reload()
            self.workers.reload()

    def _accept(self) -> Any:
        """Accept the file and node credentials held now (and refuse the revoked
        certificates), here at once; the awaitable returned tells every report worker."""
        self.guard.credentials.replace([*self.file_creds, *self.node_creds], self.revoked)
        return self.workers.push_credentials(self.guard.credentials)

    def _node_credentials_step(self) -> tuple[list[Credential], dict[str, float]] | None:
        """(In a worker thread) the nodes' credentials and revoked certificates in the
        store when they changed since last read (by this coordinator or another on the
        same database)."""
        seen = self.store.node_credentials_version()
        if seen == self._node_creds_seen:
            return None
        creds = [node_credential(node, digest) for node, digest in
                 self.store.node_credentials()]
        revoked = self.store.revoked_certificates()
        self._node_creds_seen = seen
        return creds, revoked

    async def refresh_node_credentials(self) -> None:
        """Accept the nodes' credentials (and refuse the revoked certificates) as the
        store holds them now, here and in every report worker before it returns."""
        found = await asyncio.get_running_loop().run_in_executor(
            None, self._node_credentials_step)
        if found is not None:
            self.node_creds, self.revoked = found
            await self._accept()

    def adopt(self, plan: StoredPlan | None) -> None:
        """Serve ``plan`` unless a newer one is served; the report workers too."""
        served = self.fleet.plan
        self.fleet.adopt(plan)
        if self.fleet.plan is not served:
            if self.workers.workers:
                self.spawn(self.workers.push_plan(self.fleet.plan))
            self.refresh_routing()

    def refresh_routing(self) -> None:
        """Rebuild the routing table when the plan, a live node's address or which
        planned nodes are alive changed (pushed to the report workers); plan again at
        once when a node the plan runs models on went silent here (its models then move
        within ``node_timeout_s``, not a whole ``plan_interval_s`` later)."""
        since = self.clock() - self.config.node_timeout_s
        fleet = self.fleet
        silent = frozenset(n for n, state in fleet.nodes.items() if state.last_seen < since)
        made_of = (fleet.plan.id if fleet.plan is not None else None, fleet.versions.id,
                   fleet.address_changes, silent)
        if made_of != self._routed_from:  # (else the table would come out the same)
            self._routed_from = made_of
            if fleet.routing.update(fleet.plan, fleet.addresses(since),
                                    self.config.directive_ttl_s, silent,
                                    fleet.versions.splits()) and self.workers.workers:
                self.spawn(self.workers.push_routing(fleet.routing.version,
                                                     fleet.routing.table))
        # (a node unknown here reports to another coordinator sharing the store)
        gone = silent & self.fleet.routing.planned_nodes()
        if gone and gone != self._gone and self.leader and self.start_loops:
            log.info("planned node(s) %s silent for %g s: planning again", sorted(gone),
                     self.config.node_timeout_s)
            self.spawn(self.replan_quietly("planned node gone", "long-term"))
        self._gone = gone

    async def keep_routing(self) -> None:
        """``refresh_routing`` every ``ROUTING_CHECK_S``."""
        while True:
            await asyncio.sleep(ROUTING_CHECK_S)
            try:
                self.refresh_routing()
            except Exception:  # noqa: BLE001 - the next check tries again
                log.exception("routing table refresh failed")

    def take_answered(self, batch: list[Answered]) -> None:
        """Reports a report worker answered: recorded and written as if answered here."""
        for record, models, body, routing in batch:
            self.writer.submit(record)
            if self.fleet.record(record.node, record.report, models, record.now, routing):
                self.fleet.answered(record.node, body)  # not an older report's answer

    def _follow_step(self) -> tuple[bool, StoredPlan | None]:
        """(In a worker thread) hold or seek the planning lock; the store's newest plan
        when it is newer than the one served."""
        leading = self.leadership.check()
        newest = self.store.current_plan_id()
        served = self.fleet.plan.id if self.fleet.plan is not None else None
        fresh = newest is not None and (served is None or newest > served)
        # a leader adopts the plans it makes as it makes them (loading a plan of 10,000
        # nodes here too would hold the GIL that reports need for nothing)
        plan = self.store.current_plan() if fresh and not leading else None
        if plan is not None:
            plan.rows  # noqa: B018 - made here, in this worker thread, not at a report
        return leading, plan

    async def follow(self) -> None:
        """Every ``follow_interval_s``: adopt a plan another coordinator made; on taking
        the planning lock over, plan at once (the loops run only while leading)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.follow_interval_s)
            try:
                leading, plan = await loop.run_in_executor(None, self._follow_step)
                await self.refresh_node_credentials()
                await self.rollouts.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the store is down: try again
                log.debug("following the store failed: %s", exc)
                continue
            self.adopt(plan)
            await self.workers.push_health(
                self.writer.healthy, len(self.fleet.nodes) >= self.config.max_nodes,
                self.writer.queued())
            if leading != self.leader:
                log.warning("this coordinator %s", "took the planning lock: it plans now"
                            if leading else "lost the planning lock: another one plans")
                self.leader = leading
                if leading and self.start_loops:
                    self.spawn(self.replan_quietly("takeover", "long-term"))

    def lane_counts(self) -> tuple[int, int]:
        """(requests answered on the raw lane, connections it handed to aiohttp) by this
        process and every report worker (a restarted one's last counts included)."""
        own = self.raw_lanes
        taken, handed = (own.taken, own.handed_over) if own is not None else (0, 0)
        for load in list(self.workers.load.values()):
            taken += load.lane_taken
            handed += load.lane_handed_over
        return taken, handed

    def measure(self, now: float) -> None:
        """Sample what this coordinator costs (``cost``): its own CPU, its planning
        process's, its workers' as they told, the reports answered and refused, the live
        nodes."""
        pid = os.getpid()
        self.cost.cpu("main", pid, time.process_time())
        self.cost.tally(pid, self.reports, self.shedder.refused, self.leases)
        for worker_pid, load in list(self.workers.load.items()):
            self.cost.cpu("report_workers", worker_pid, load.cpu_s)
            self.cost.tally(worker_pid, load.answered, load.refused, load.leases)
        planner = self.planner.pid
        if planner is not None:
            try:
                times = psutil.Process(planner).cpu_times()
                self.cost.cpu("planner", planner, times.user + times.system)
            except psutil.Error:  # gone: its last sample stays
                pass
        since = self.clock() - self.config.node_timeout_s
        self.cost.sample(now, sum(1 for s in list(self.fleet.nodes.values())
                                  if s.last_seen >= since))

    async def measuring(self) -> None:
        """``measure`` every ``SAMPLE_S`` (a task for as long as the app runs; each
        scrape of ``/metrics`` measures too)."""
        loop = asyncio.get_running_loop()
        while True:
            self.measure(loop.time())
            await asyncio.sleep(SAMPLE_S)

    def loop_states(self) -> dict[str, tuple[float, float]]:
        """Process -> its event loop's smoothed (lag, busy share), ``Shedder``'s: this
        one's and its live workers'."""
        loops = {"coordinator": (self.shedder.lag, self.shedder.busy)}
        for worker in self.workers.workers:
            load = self.workers.load.get(worker.proc.pid) if worker.proc is not None \
                else None
            if load is not None:
                loops[f"report_worker_{worker.index}"] = (load.lag_s, load.busy)
        return loops

    async def replan_quietly(self, why: str, kind: str = "manual") -> None:
        """Plan now in the background (a failure is logged: the loops try again)."""
        try:
            await self.loops.replan(kind)
        except PlanError as exc:
            log.info("%s: no plan: %s", why, exc)
        except Exception:  # noqa: BLE001 - the loops try again
            log.exception("%s: plan failed", why)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def node_summary(self, row: Any, now: float) -> dict[str, Any]:
        report = row.report
        models = {name: {k: v for k, v in m.items() if k != "arrivals"}
                  for name, m in (report.get("models") or {}).items()}
        directives, expires = self.fleet.issued(row.name, now)
        return {"name": row.name, "first_seen": iso_time(row.first_seen),
                "last_seen": iso_time(row.last_seen),  # a report or a lease
                "last_report": iso_time(row.reported or row.last_seen),
                "age_s": round(now - row.last_seen, 3),
                "alive": now - row.last_seen <= self.config.node_timeout_s,
                "capacity": report.get("capacity"), "models": models,
                "disk": report.get("disk") or [], "pulling": report.get("pulling") or [],
                "directives": directives.to_json() if directives else None,
                "directives_expire_in_s": None if directives is None or expires is None
                else round(expires - now, 3)}

    @staticmethod
    def plan_body(stored: StoredPlan) -> bytes:
        """``{"id": ..., **plan}`` as JSON, spliced into the plan's text (a 10,000-node
        plan is not parsed to be shown)."""
        text = stored.text.encode() if isinstance(stored.text, str) else stored.text
        if b"Infinity" in text or b"NaN" in text:  # json's words, not JSON: orjson's null
            return orjson.dumps({"id": stored.id, **stored.plan})
        return b'{"id":%d,%s' % (stored.id, text[1:])  # a plan has fields: never "{}"


COORDINATOR: web.AppKey[Coordinator] = web.AppKey("coordinator", Coordinator)

#: Seconds between two checks of the routing table's inputs (nodes alive, addresses).
ROUTING_CHECK_S = 1.0


_READ = Need("read")
_ADMIN = Need("admin")


def coordinator_need(request: web.Request) -> Need | None:
    """What a request to the coordinator needs once it has tokens: a node's report its
    node's credential (or admin), GETs read, the rest admin; health, the dashboard's
    files and the join (its join token is checked there) nothing."""
    path = request.path
    if path == "/v1/health" or is_dashboard_path(path) or path == "/v1/join":
        return None
    if request.match_info.handler in _NODE_POSTS:
        return Need("report", request.match_info["name"])
    return _READ if request.method in ("GET", "HEAD") else _ADMIN


def _forward_key(request: web.Request) -> str:
    return request.app[COORDINATOR].workers.forward_key


def _report_lane(request: web.Request) -> Any:
    """A report's or lease's handler where it may skip the rest of the middlewares
    (``lane.takes_lane``; not on the internal socket, whose guard is in the chain)."""
    handler = request.match_info.handler
    if handler not in _NODE_POSTS or _unforwarded_internal(request):
        return None
    co = request.app[COORDINATOR]
    return handler if takes_lane(request, co.guard, co.names, coordinator_need(request),
                                 _forward_key(request)) else None


def _unforwarded_internal(request: web.Request) -> bool:
    """A request on the coordinator's internal socket (``start_report_workers``) that
    no report worker forwarded: the socket takes only theirs."""
    return isinstance(request.transport.get_extra_info("sockname") if request.transport
                      else None, str) and not is_forwarded(request, _forward_key(request))


@web.middleware
async def internal_socket_guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """403 for a request on the internal socket without the workers' forward key."""
    if _unforwarded_internal(request):
        return json_error(403, "this socket takes only what the coordinator's report "
                               "workers forward")
    return await handler(request)


# CatalogError, ReportError: 400; PlanError: 409; StoreUnavailable: 503
errors_middleware = json_errors_middleware(log, lane=_report_lane)


def _json_answer(body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    """A 200 whose JSON is already encoded (by orjson, or a stored plan's text)."""
    return web.Response(body=body, content_type="application/json", headers=headers)


# -- handlers ---------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """200 while this coordinator can take reports; 503 while its store is failing (the
    reports it would refuse). The store's error text stays in the log: this is public."""
    co = request.app[COORDINATOR]
    if co.writer.healthy:
        return web.json_response({"ok": True, "planner": co.leader})
    return web.json_response({"ok": False, "planner": co.leader, "store": "failing"},
                             status=503, headers={"Retry-After": "1"})


async def node_report(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    co.shedder.check(co.writer.queued())  # before any work: 503 + Retry-After
    raw = bytes(await request_body(request))  # the lane's: request.read()
    return _json_answer(_answer_report(co, request.match_info["name"], raw))


def _answer_report(co: Coordinator, name: str, raw: bytes) -> bytes:
    report = parse_report_body(name, raw)
    refuse_while_store_fails(co.writer.healthy)
    refuse_new_node_past(name in co.fleet.nodes, len(co.fleet.nodes), co.config.max_nodes, name)
    now = co.clock()
    co.writer.submit(report_record(name, raw, report, now))  # as sent
    co.fleet.record(name, raw, reported_models(report), now, reported_routing(report))
    _, body = co.fleet.answer(name, report)  # issued now: Fleet.issued
    co.reports += 1
    return body


def raw_answer(co: Coordinator) -> Callable[[str, str, bytes], bytes]:
    """The coordinator's answers on its raw lane (``lane.raw_take``, for its TCP
    listener): reports and leases, as ``node_report`` and ``node_lease`` answer them."""

    def answer(kind: str, name: str, raw: bytes) -> bytes:
        co.shedder.check(co.writer.queued())
        if kind == "report":
            return _answer_report(co, name, raw)
        return api_lease.renew_lease(co, name, raw)

    return answer


#: The handlers of what nodes post: a node's own credential (or admin) posts them.
_NODE_POSTS = (node_report, api_lease.node_lease)


async def metrics(request: web.Request) -> web.Response:
    """Failed authentications, this process's and its workers', and what the coordinator
    costs (``cost.CostMeter``: CPU per report and per node-second, reports refused, each
    process's loop lag), as Prometheus text."""
    co = request.app[COORDINATOR]
    failures = dict(co.guard.failures)
    for counts in co.workers.auth_failures.values():
        for reason, count in counts.items():
            failures[reason] = failures.get(reason, 0) + count
    lines = co.guard.metrics_lines("edgeagent_coordinator", failures)
    co.measure(asyncio.get_running_loop().time())  # as of now
    lines += co.cost.metrics_lines("edgeagent_coordinator", co.loop_states())
    lines += lane_metrics_lines("edgeagent_coordinator", *co.lane_counts())
    return web.Response(text="\n".join(lines) + "\n",
                        content_type="text/plain", charset="utf-8")


async def plan_get(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    current = co.fleet.plan
    if current is None:
        hint = f" ({co.planner.last_error})" if co.planner.last_error else ""
        return json_error(404, f"no plan yet{hint}; POST /v1/plan to plan now")
    return _json_answer(co.plan_body(current))


async def plan_post(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    if not co.leader:
        raise PlanError("another coordinator sharing this store plans (it holds the "
                        "planning lock); this one serves its plans within "
                        f"{co.follow_interval_s:g} s: POST /v1/plan to that one, or wait")
    plan = await co.loops.replan("manual")
    return _json_answer(co.plan_body(plan))


async def start_report_workers(app: web.Application, runner: web.AppRunner,
                               port: int) -> None:
    """With ``report_workers`` (the app listens on ``port`` with ``reuse_port``): a Unix
    socket for the requests they forward, in a directory of mode 0700 and itself of
    mode 0600 (only this user's processes reach it; each request must carry the
    workers' forward key, else 403), then the workers; once they all listen, the
    coordinator stops listening on ``port``: the workers own it, and whatever holds the
    coordinator's event loop (a plan adopted, the dashboard's reads of the whole
    fleet) no longer delays the reports the kernel would have handed it. (If they do
    not all listen within a minute, it keeps listening too.)"""
    co = app[COORDINATOR]
    if not co.workers.workers:
        return
    public = list(runner.sites)
    co.internal_dir = Path(tempfile.mkdtemp(prefix="edgeagent-coordinator-"))  # 0700
    internal = co.internal_dir / "forwarded.sock"
    site = web.UnixSite(runner, str(internal))
    await site.start()
    os.chmod(internal, 0o600)
    if co.fleet.plan is not None:  # the plan loaded from the store, for them to start with
        await co.workers.push_plan(co.fleet.plan)
    await co.workers.push_versions(co.rollouts.table)
    await co.workers.push_credentials(co.guard.credentials)
    if await co.workers.start(port, str(internal)):
        for listener in public:
            await listener.stop()
    else:
        log.warning("report workers: not all listen on port %d after a minute; the "
                    "coordinator answers reports on it too", port)


def create_app(config: CoordinatorConfig, *, clock: Callable[[], float] = time.time,
               start_loops: bool = True) -> web.Application:
    """The coordinator's app; ``start_loops=False`` leaves planning to ``POST /v1/plan``
    and direct calls (tests)."""
    app = web.Application(client_max_size=config.max_request_size,
                          handler_args=handler_args(config.read_timeout_s),
                          middlewares=[
        json_newline,
        errors_middleware,
        internal_socket_guard,
        host_check(lambda r: carries_credential(r, r.app[COORDINATOR].guard, True),
                   lambda r: r.app[COORDINATOR].names),
        # its open paths (health, the dashboard's files, the join: its handler judges the
        # join token) hold nothing for a rebinding page that sends a made-up token
        scoped_auth(lambda r: r.app[COORDINATOR].guard, coordinator_need, _forward_key,
                    certificates=True, open_tokens=False),
        body_timeout_middleware(config.read_timeout_s, config.max_request_size,
                                BodyMemory(config.max_request_bytes_in_flight)),
    ])
    app[COORDINATOR] = Coordinator(config, clock=clock, start_loops=start_loops)
    r = app.router
    r.add_get("/v1/health", health)
    r.add_post("/v1/nodes/{name}/report", node_report)
    r.add_get("/v1/plan", plan_get)
    r.add_get("/metrics", metrics)
    r.add_post("/v1/plan", plan_post)
    api_fleet.add_routes(app, COORDINATOR)  # POST /v1/sizing, GET /v1/provisioning
    api_join.add_routes(app, COORDINATOR)  # POST /v1/join-tokens, /v1/join
    api_nodes.add_routes(app, COORDINATOR)  # GET /v1/nodes[/{name}], DELETE
    api_models.add_routes(app, COORDINATOR)  # /v1/models: the catalog
    api_rollouts.add_routes(app, COORDINATOR)  # /v1/rollouts, bad versions
    api_lease.add_routes(app, COORDINATOR)  # POST /v1/nodes/{name}/lease
    add_dashboard(app, "coordinator.html")

    async def on_startup(app: web.Application) -> None:
        app[COORDINATOR].writer.start()
        app[COORDINATOR].spawn(app[COORDINATOR].follow())
        app[COORDINATOR].spawn(app[COORDINATOR].keep_routing())
        app[COORDINATOR].spawn(app[COORDINATOR].shedder.watch())
        app[COORDINATOR].spawn(app[COORDINATOR].measuring())
        app[COORDINATOR].spawn(app[COORDINATOR].rollouts.run())
        if app[COORDINATOR].start_loops:
            app[COORDINATOR].planner.start()
            app[COORDINATOR].loops.start()

    async def on_cleanup(app: web.Application) -> None:
        await app[COORDINATOR].workers.stop()  # what they answered is handed over first
        await app[COORDINATOR].loops.stop()
        for task in list(app[COORDINATOR].tasks):
            task.cancel()
        await asyncio.gather(*app[COORDINATOR].tasks, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, app[COORDINATOR].planner.close)
        app[COORDINATOR].writer.close()  # an answered report is written before the end
        app[COORDINATOR].leadership.close()  # another coordinator may plan at once
        app[COORDINATOR].store.close()
        if app[COORDINATOR].internal_dir is not None:
            shutil.rmtree(app[COORDINATOR].internal_dir, ignore_errors=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
