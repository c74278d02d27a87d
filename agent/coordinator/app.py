"""The coordinator's aiohttp application: ``create_app`` builds it, state lives on a
``Coordinator`` stored on the app (no globals), handlers are thin.

API (JSON; errors are ``{"error": "..."}`` with a 4xx naming the problem)::

    GET    /v1/health                     ok and whether this one plans; 503 while
                                          its store fails (no token)
    POST   /v1/nodes/{name}/report        a node's report (agent.wire) -> its directives
    GET    /v1/nodes[/{name}]             nodes, capacity, last report, directives
                                          (?limit=N&after=NAME: a page)
    DELETE /v1/nodes/{name}               forget a node (and revoke its credential)
    GET    /v1/models[/{name}]            catalog with planned replicas, live nodes
                                          and the latency they measured
    PUT    /v1/models/{name}              set a model's SLO (catalog.py); a new version
                                          rolls out in waves (rollouts.py)
    DELETE /v1/models/{name}              remove it from the catalog
    POST   /v1/rollouts, GET /v1/rollouts[/{id}], POST /v1/rollouts/{id}/pause|resume|abort,
    DELETE /v1/models/{name}/bad-versions/{version}   rollouts (api_rollouts)
    GET    /v1/plan                       current allocation and placement
    POST   /v1/plan                       re-plan now
    POST   /v1/sizing, GET /v1/provisioning   fleet sizing and provisioning (api_fleet)
    POST   /v1/join-tokens, /v1/join      a node's own credential (api_join)
    GET    /metrics                       failed authentications (Prometheus text)
    GET    /                              the dashboard page (agent.dashboard)

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
import time
from typing import Any, Callable
from urllib.parse import urlencode

import orjson
from aiohttp import web

from agent.coordinator import api_fleet, api_join, api_rollouts
from agent.coordinator.catalog import CatalogError, check_name, parse_slo
from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.ingest import (Fleet, ReportWriter, parse_report_body,
                                     refuse_new_node_past, refuse_while_store_fails, report_record,
                                     reported_models)
from agent.coordinator.planner import PlanError, PlannerLoops
from agent.coordinator.planworker import PlanWorker
from agent.coordinator.reportworkers import Answered, ReportWorkers
from agent.coordinator.rollouts import Rollouts, check_not_bad
from agent.coordinator.store import StoredPlan, open_store
from agent.dashboard import add_dashboard, is_dashboard_path
from agent.errors import json_error, json_errors_middleware
from agent.eventloop import header_timeout_args
from agent.httpbody import body_timeout_middleware
from agent.credentials import Credential, Credentials, load_credentials, node_credential
from agent.httpauth import (Guard, Need, host_check, names_this_server, own_names, request_peer,
                            scoped_auth)
from agent.tls import ServerTls
from agent.validation import ascii_int, load_json, only

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
        self.node_creds: list[Credential] = self._node_credentials_step() or []
        self.guard = Guard(Credentials([*self.file_creds, *self.node_creds]),
                           throttle=config.auth.throttle())
        self.fleet = Fleet(config.directive_ttl_s)
        self.fleet.load(self.store.nodes(), self.store.current_plan())
        self.writer = ReportWriter(self.store, keep_s=config.history_s, clock=clock)
        self.planner = PlanWorker(config, self.store, clock=clock)
        self.leadership = self.store.leadership()
        self.leader = self.leadership.check()
        self.follow_interval_s = 1.0
        self.loops = PlannerLoops(self.planner, prepare=self.writer.flush,
                                  adopt=self.adopt, leading=lambda: self.leader)
        self.workers = ReportWorkers(config, apply=self.take_answered)
        self.rollouts = Rollouts(self)
        self.start_loops = start_loops
        self.tasks: set[asyncio.Task] = set()

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
            self._accept()
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the tokens in use: %s", exc)
        if self.tls is not None:
            self.tls.reload()
            self.workers.reload()

    def _accept(self) -> None:
        """Accept the file and node credentials held now, here and in the workers."""
        self.guard.credentials.replace([*self.file_creds, *self.node_creds])
        if self.workers.workers:
            self.spawn(self.workers.push_credentials(self.guard.credentials.creds))

    def _node_credentials_step(self) -> list[Credential] | None:
        """(In a worker thread) the nodes' credentials in the store when they changed
        since last read (by this coordinator or another on the same database)."""
        seen = self.store.node_credentials_version()
        if seen == self._node_creds_seen:
            return None
        creds = [node_credential(node, digest) for node, digest in
                 self.store.node_credentials()]
        self._node_creds_seen = seen
        return creds

    async def refresh_node_credentials(self) -> None:
        """Accept the nodes' credentials as the store holds them now."""
        creds = await asyncio.get_running_loop().run_in_executor(
            None, self._node_credentials_step)
        if creds is not None:
            self.node_creds = creds
            self._accept()

    def adopt(self, plan: StoredPlan | None) -> None:
        """Serve ``plan`` unless a newer one is served; the report workers too."""
        served = self.fleet.plan
        self.fleet.adopt(plan)
        if self.fleet.plan is not served and self.workers.workers:
            self.spawn(self.workers.push_plan(self.fleet.plan))

    def take_answered(self, batch: list[Answered]) -> None:
        """Reports a report worker answered: recorded and written as if answered here."""
        for record, models, body in batch:
            self.writer.submit(record)
            if self.fleet.record(record.node, record.report, models, record.now):
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
                self.writer.healthy, len(self.fleet.nodes) >= self.config.max_nodes)
            if leading != self.leader:
                log.warning("this coordinator %s", "took the planning lock: it plans now"
                            if leading else "lost the planning lock: another one plans")
                self.leader = leading
                if leading and self.start_loops:
                    self.spawn(self.replan_quietly("takeover", "long-term"))

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
        return {"name": row.name, "first_seen": row.first_seen, "last_seen": row.last_seen,
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


_READ = Need("read")
_ADMIN = Need("admin")


def coordinator_need(request: web.Request) -> Need | None:
    """What a request to the coordinator needs once it has tokens: a node's report its
    node's credential (or admin), GETs read, the rest admin; health, the dashboard's
    files and the join (its join token is checked there) nothing."""
    path = request.path
    if path == "/v1/health" or is_dashboard_path(path) or path == "/v1/join":
        return None
    if request.match_info.handler is node_report:
        return Need("report", request.match_info["name"])
    return _READ if request.method in ("GET", "HEAD") else _ADMIN


def _forward_key(request: web.Request) -> str:
    return request.app[COORDINATOR].workers.forward_key


def _report_lane(request: web.Request) -> bool:
    """Whether ``request`` is a report that may skip the rest of the middlewares
    (thousands a second, each paying for the whole chain otherwise): its whole body has
    arrived (no read timeout to watch) and its credential may post it, or none is
    needed and it names this coordinator (no Origin, a Host of its own). Any other
    request takes the chain, which answers 401, 403 and 408 as for every path (a refusal
    is counted there, once)."""
    if request.match_info.handler is not node_report or not request.content.is_eof():
        return False
    co = request.app[COORDINATOR]
    _, name = request_peer(request, _forward_key(request), certificates=True)
    if not co.guard.checks(name):
        return "Origin" not in request.headers and names_this_server(
            request.headers.get("Host"), co.names)
    return co.guard.judge(request.headers.get("Authorization", ""), coordinator_need(request),
                          name).status == 200


# CatalogError, ReportError: 400; PlanError: 409; StoreUnavailable: 503
errors_middleware = json_errors_middleware(
    log, lane=lambda request: node_report if _report_lane(request) else None)


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return load_json(raw)
    except ValueError as exc:  # not JSON, nested too deep, an integer past the limit
        raise CatalogError(f"body is not valid JSON: {exc}") from None


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
    name = request.match_info["name"]
    raw = await request.read()
    report = parse_report_body(name, raw)
    refuse_while_store_fails(co.writer.healthy)
    refuse_new_node_past(name in co.fleet.nodes, len(co.fleet.nodes), co.config.max_nodes, name)
    now = co.clock()
    co.writer.submit(report_record(name, raw, report, now))  # as sent
    co.fleet.record(name, raw, reported_models(report), now)
    _, body = co.fleet.answer(name, report)  # issued now: Fleet.issued
    return _json_answer(body)


#: The most nodes one page of ``GET /v1/nodes`` holds.
MAX_NODES_PAGE = 10_000


def _nodes_page(query: Any) -> tuple[str, int | None]:
    """``GET /v1/nodes``'s ``after`` (a node name: the page starts after it) and
    ``limit`` (1..MAX_NODES_PAGE; None: every node); CatalogError (400) naming a bad one."""
    try:
        only(query, ("after", "limit"), noun="query parameter")
        limit = ascii_int(query["limit"], "limit", 6) if "limit" in query else None
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    if limit is not None and not 1 <= limit <= MAX_NODES_PAGE:
        raise CatalogError(f"limit must be 1 to {MAX_NODES_PAGE}, got {limit}")
    return query.get("after", ""), limit


async def nodes_list(request: web.Request) -> web.Response:
    """The nodes by name, a page at a time with ``?limit=N`` (``&after=NAME`` for the
    next): ``X-Total-Count`` says how many there are, and ``Link: <...>; rel="next"``
    where more follow."""
    co = request.app[COORDINATOR]
    after, limit = _nodes_page(request.query)
    now = co.clock()
    rows = co.fleet.rows(after, None if limit is None else limit + 1)
    headers = {"X-Total-Count": str(len(co.fleet.nodes))}
    if limit is not None and len(rows) > limit:
        rows = rows[:limit]
        query = urlencode({"after": rows[-1].name, "limit": limit})
        headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
    return _json_answer(orjson.dumps([co.node_summary(row, now) for row in rows]), headers)


async def node_get(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    state = co.fleet.nodes.get(request.match_info["name"])
    row = state.row if state is not None else None
    if row is None:
        return json_error(404, f"unknown node {request.match_info['name']!r}")
    return web.json_response(co.node_summary(row, co.clock()))


async def node_delete(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    name = request.match_info["name"]
    co.writer.forget(name)
    stored = co.store.delete_node(name)
    revoked = co.store.revoke_node_credential(name)  # a deleted node must join again
    if revoked:
        await co.refresh_node_credentials()
    if not co.fleet.forget(name) and not stored and not revoked:
        return json_error(404, f"unknown node {name!r}")
    return web.json_response({"deleted": name})


def _models_json(co: Coordinator, slos: list[Any]) -> list[dict[str, Any]]:
    """Each of ``slos`` with its replicas and predicted latency under the current plan
    (its JSON form: a typed ``Plan`` of 10,000 nodes would take the loop seconds to
    build), the live nodes it is on, the worst latency they measured for it at its
    SLO's percentile (``measured_latency_ms``) and its versions marked bad."""
    on, measured = co.fleet.by_model(co.clock() - co.config.node_timeout_s,
                                     {slo.name: slo.percentile for slo in slos})
    planned_models = (co.fleet.plan.plan.get("models") or {}) if co.fleet.plan else {}
    bad: dict[str, list[dict[str, Any]]] = {}
    for row in co.store.bad_versions(slos[0].name if len(slos) == 1 else None):
        bad.setdefault(row["model"], []).append(row)
    out = []
    for slo in slos:
        planned = planned_models.get(slo.name) or {}
        out.append({**slo.to_json(), "bad_versions": bad.get(slo.name, []),
                    "nodes": on.get(slo.name, []),
                    "replicas": planned.get("replicas"),
                    "predicted_latency_ms": planned.get("predicted_latency_ms"),
                    "measured_latency_ms": measured.get(slo.name)})
    return out


async def models_list(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    return _json_answer(orjson.dumps(_models_json(co, co.store.models())))


async def model_get(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    name = check_name(request.match_info["name"])
    slo = co.store.model(name)
    if slo is None:
        return json_error(404, f"model {name!r} is not in the catalog")
    return _json_answer(orjson.dumps(_models_json(co, [slo])[0]))


async def model_put(request: web.Request) -> web.Response:
    """Add or update an entry; a new version of a model that serves one rolls out in
    waves (``rollout_id`` in the answer), a version marked bad is refused (409)."""
    co = request.app[COORDINATOR]
    slo = parse_slo(request.match_info["name"], await _json_body(request))
    check_not_bad(co.store, slo.name, slo.version)
    before = co.store.model(slo.name)
    if co.rollouts.catalog_change(before, slo):
        rollout = await co.rollouts.start(slo.name, (slo.version, slo.digest), entry=slo)
        log.info("catalog: updated %s: rollout %d", slo, rollout.id)
        return web.json_response({**slo.to_json(), "rollout_id": rollout.id})
    created = co.store.put_model(slo, co.clock())
    log.info("catalog: %s %s", "added" if created else "updated", slo)
    await co.rollouts.refresh()
    return web.json_response(slo.to_json(), status=201 if created else 200)


async def model_delete(request: web.Request) -> web.Response:
    co = request.app[COORDINATOR]
    name = check_name(request.match_info["name"])
    slo = co.store.model(name)
    if slo is None or not co.store.delete_model(name):
        return json_error(404, f"model {name!r} is not in the catalog")
    log.info("catalog: deleted %s", name)
    for rollout in co.store.rollouts(active=True, model=name):
        await co.rollouts.move(rollout.id, "abort")
    await co.rollouts.refresh()
    if slo.source is not None and co.leader and co.start_loops:
        # plan now: the plan's directives stop its pulls and drop the nodes' copies
        co.spawn(co.replan_quietly(f"catalog delete of {name}"))
    return web.json_response({"deleted": name})


async def metrics(request: web.Request) -> web.Response:
    """Failed authentications (Prometheus text), this process's and its workers'."""
    co = request.app[COORDINATOR]
    failures = dict(co.guard.failures)
    for counts in co.workers.auth_failures.values():
        for reason, count in counts.items():
            failures[reason] = failures.get(reason, 0) + count
    lines = co.guard.metrics_lines("edgeagent_coordinator", failures)
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
    """With ``report_workers`` (the app listens on ``port`` with ``reuse_port``): a
    loopback listener for the requests they forward, then the workers; once they all
    listen, the coordinator stops listening on ``port``: the workers own it, and
    whatever holds the coordinator's event loop (a plan adopted, the dashboard's
    reads of the whole fleet) no longer delays the reports the kernel would have
    handed it. (If they do not all listen within a minute, it keeps listening too.)"""
    co = app[COORDINATOR]
    if not co.workers.workers:
        return
    public = list(runner.sites)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    internal = site._server.sockets[0].getsockname()[1]
    if co.fleet.plan is not None:  # the plan loaded from the store, for them to start with
        await co.workers.push_plan(co.fleet.plan)
    await co.workers.push_versions(co.rollouts.table)
    await co.workers.push_credentials(co.guard.credentials.creds)
    if await co.workers.start(port, f"http://127.0.0.1:{internal}"):
        for listener in public:
            await listener.stop()
    else:
        log.warning("report workers: not all listen on port %d after a minute; the "
                    "coordinator answers reports on it too", port)


def create_app(config: CoordinatorConfig, *, clock: Callable[[], float] = time.time,
               start_loops: bool = True) -> web.Application:
    """The coordinator's app; ``start_loops=False`` leaves planning to ``POST /v1/plan``
    and direct calls (tests)."""
    app = web.Application(client_max_size=8 * 2**20,
                          handler_args=header_timeout_args(config.read_timeout_s),
                          middlewares=[
        errors_middleware,
        host_check(lambda r: bool(r.app[COORDINATOR].guard.credentials),
                   lambda r: r.app[COORDINATOR].names),
        scoped_auth(lambda r: r.app[COORDINATOR].guard, coordinator_need, _forward_key,
                    certificates=True),
        body_timeout_middleware(config.read_timeout_s),
    ])
    app[COORDINATOR] = Coordinator(config, clock=clock, start_loops=start_loops)
    r = app.router
    r.add_get("/v1/health", health)
    r.add_post("/v1/nodes/{name}/report", node_report)
    r.add_get("/v1/nodes", nodes_list)
    r.add_get("/v1/nodes/{name}", node_get)
    r.add_delete("/v1/nodes/{name}", node_delete)
    r.add_get("/v1/models", models_list)
    r.add_get("/v1/models/{name}", model_get)
    r.add_put("/v1/models/{name}", model_put)
    r.add_delete("/v1/models/{name}", model_delete)
    r.add_get("/v1/plan", plan_get)
    r.add_get("/metrics", metrics)
    r.add_post("/v1/plan", plan_post)
    api_fleet.add_routes(app, COORDINATOR)  # POST /v1/sizing, GET /v1/provisioning
    api_join.add_routes(app, COORDINATOR)  # POST /v1/join-tokens, /v1/join
    api_rollouts.add_routes(app, COORDINATOR)  # /v1/rollouts, bad versions
    add_dashboard(app, "coordinator.html")

    async def on_startup(app: web.Application) -> None:
        app[COORDINATOR].writer.start()
        app[COORDINATOR].spawn(app[COORDINATOR].follow())
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

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
