"""Report workers: processes beside the coordinator that answer node reports on its port.

One event loop is one core and one GIL, and every report costs it CPU (HTTP,
validation, the answer, the group commit): at thousands of reports a second it runs
out, and reports queue (docs/benchmarks.md, ``coordinator_scale.py``). With ``report_workers: N`` the
coordinator starts N worker processes that listen on its port too (``SO_REUSEPORT``:
the kernel spreads connections over the listeners; an agent's keep-alive connection
stays with one). A worker

* answers ``POST /v1/nodes/{name}/report`` itself: checks its credential (the node's
  own, or admin: the coordinator's rule, ``agent.security.httpauth``; the tokens the
  coordinator accepts and the node certificates it refuses come over the pipe, again on
  SIGHUP and when a node is deleted, which waits until every worker has them), throttles
  failures per peer, validates the report (the coordinator's 400s), answers the node's
  directives under the current plan, version table (``push_versions``) and routing
  table, which the coordinator pushes to every worker when it adopts one, and answers
  503 while the coordinator says its store is failing, or while it is itself
  overloaded (``agent.coordinator.shedding``: its loop saturated, or its reports not
  yet handed over plus those the coordinator says wait for its group commit past
  ``report_shed_queue``; with ``Retry-After``);
* answers ``POST /v1/nodes/{name}/lease`` itself, from the basis of the node's last full
  report it answered (``agent.coordinator.leases``; a lease naming a report it did not
  see gets ``{"report": true}``); reports and leases whose credential may post them
  skip the middleware chain (``agent.coordinator.lane``) and, whole in one read, plain
  HTTP/1.1, aiohttp's web layer too (``agent.http.rawlane``: a connection goes to
  aiohttp at its first request the lane does not take);
* hands what it answered to the coordinator every ``BATCH_S`` (over a pipe): the
  coordinator records the node, writes it with its own group commit and shows the
  directives issued (``GET /v1/nodes``) as for a report it answered itself; then the
  leases it renewed up to the same instant (node, when, and the new directives where
  they changed: a lease comes after the report it was renewed from); and every
  ``LOAD_S`` its CPU, reports answered and refused, leases renewed, its loop's lag and
  its raw lane's counts (``WorkerLoad``, for the coordinator's ``/metrics``);
* forwards every other request to the coordinator (``agent.coordinator.forwarding``),
  over a Unix socket of the coordinator's own that only this user's processes can open
  (the token is checked there; the socket refuses a request without the forward key);
* serves the coordinator's ``tls:`` with a context of its own, read again when the
  coordinator, on SIGHUP, says ``reload``.

A worker that dies is started again (its agents reconnect, to any listener). On stop,
workers close their listeners and hand over the rest of what they answered before the
coordinator writes its last batch: a report that got its directives is not lost.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import secrets
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

from aiohttp import ClientSession, ClientTimeout, UnixConnector, web

from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.forwarding import forward
from agent.coordinator.ingest import (Fleet, ReportedModels, Routed, parse_lease_body,
                                     parse_report_body, refuse_while_store_fails,
                                     report_record, reported_models, reported_routing)
from agent.coordinator.lane import raw_take, takes_lane
from agent.coordinator.leases import SEND_REPORT
from agent.coordinator.planworker import exit_with_parent
from agent.coordinator.shedding import Shedder
from agent.coordinator.store import ReportRecord, StoredPlan
from agent.errors import json_errors_middleware
from agent.http.connections import server_connections
from agent.http.eventloop import handler_args, listen, run_event_loop, settle_gc
from agent.security.credentials import Credentials
from agent.security.httpauth import (Guard, Need, carries_credential, host_check, own_names,
                                     scoped_auth)
from agent.http.body import BodyMemory, body_timeout_middleware, request_body
from agent.http.jsonnewline import json_newline
from agent.http.rawlane import RawLanes
from agent.security.tls import ServerTls

log = logging.getLogger("edgeagent.coordinator.reportworkers")

BATCH_S = 0.25  # a worker hands its answered reports over this often
LOAD_S = 1.0  # ... and tells its load this often
RESTART_S = 1.0  # a dead worker is started again after this long
REPORT_PATH = "/v1/nodes/{name}/report"
LEASE_PATH = "/v1/nodes/{name}/lease"
#: A worker's first message: it listens on the port.
LISTENING = "listening"
#: Seconds the coordinator waits for every worker to take new credentials.
APPLY_WAIT_S = 10.0

# one answered report as handed over: what to write, its models, the directives' JSON,
# its routing (address and routed traffic)
Answered = tuple[ReportRecord, ReportedModels, bytes, Routed | None]
# one lease renewed: the node, when, and the directives' JSON where they changed
Renewed = tuple[str, float, bytes | None]


class WorkerLoad(NamedTuple):
    """What a worker last told of its load: CPU seconds since it started, reports answered
    and refused, its loop's smoothed lag (s) and busy share (``Shedder``), leases renewed,
    and its raw lane's requests answered and connections handed over (``RawLanes``)."""

    index: int
    cpu_s: float
    answered: int
    refused: int
    lag_s: float
    busy: float
    leases: int = 0
    lane_taken: int = 0  # (RawLanes.taken)
    lane_handed_over: int = 0


class _Worker:
    """The coordinator's side of one worker process: its pipes and reader thread."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.down: Any = None  # coordinator -> worker: plans, store health, reload, stop
        self.send_lock = threading.Lock()
        self.closed = threading.Event()  # the worker handed over its last batch
        self.listening = threading.Event()  # the worker listens on the port
        self.applied = 0  # the last credentials message it took (its number)

    def send(self, message: Any) -> None:
        with self.send_lock:
            try:
                self.down.send(message)
            except (OSError, ValueError):  # it died: its reader restarts it
                pass


class ReportWorkers:
    """Starts, feeds and stops the report workers of one coordinator."""

    def __init__(self, config: CoordinatorConfig, *,
                 apply: Callable[[list[Answered]], None],
                 renew: Callable[[list[Renewed]], None] = lambda batch: None) -> None:
        """``apply`` gets each batch of answered reports on the event loop, ``renew``
        each batch of leases renewed."""
        self.config, self.apply, self.renew = config, apply, renew
        self.workers = [_Worker(i) for i in range(config.report_workers)]
        self._port = 0
        self._internal = ""
        self._plan: tuple | None = None  # the message of the current plan
        self._health: tuple = ("store", True, False, 0)
        self._credentials: tuple = ("credentials", (), {}, 0)
        self._applied_waiters: list[tuple[int, asyncio.Future]] = []
        self._routing: tuple = ("routing", None, None)
        self._versions: tuple | None = None  # the message of the current version table
        #: Vouches for the peer a worker forwards (never leaves this machine's processes).
        self.forward_key = secrets.token_urlsafe(32)
        #: Each worker's failed-auth counts, as it last told.
        self.auth_failures: dict[int, dict[str, int]] = {}
        #: pid -> that worker's load as it last told (a worker started again is a new
        #: pid; a dead one's last word stays: its CPU was spent)
        self.load: dict[int, WorkerLoad] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    async def start(self, port: int, internal_socket: str, *, wait_s: float = 60.0) -> bool:
        """Start the workers on ``port`` (bound by the coordinator with
        ``reuse_port``); they forward what is not a report to the Unix socket
        ``internal_socket``. Whether every one listens within ``wait_s``."""
        self._loop = asyncio.get_running_loop()
        self._port, self._internal = port, internal_socket
        for worker in self.workers:
            self._spawn(worker)
        deadline = self._loop.time() + wait_s
        for worker in self.workers:
            if not await self._loop.run_in_executor(
                    None, worker.listening.wait, max(0.0, deadline - self._loop.time())):
                return False
        return True

    def _spawn(self, worker: _Worker) -> None:
        ctx = mp.get_context("spawn")  # the coordinator has threads: no fork
        up_parent, up_child = ctx.Pipe(duplex=False)
        down_child, down_parent = ctx.Pipe(duplex=False)
        worker.down, worker.closed = down_parent, threading.Event()
        worker.listening = threading.Event()
        worker.applied = self._credentials[3]  # it starts with the newest
        worker.proc = ctx.Process(
            target=_serve, name=f"edgeagent-report-worker-{worker.index}", daemon=True,
            args=(self.config, self._port, self._internal, up_child, down_child,
                  (self._plan, self._health, self._credentials, self._routing,
                   self._versions),
                  self.forward_key,
                  os.getpid()))
        worker.proc.start()
        up_child.close()
        down_child.close()
        threading.Thread(target=self._read, args=(worker, up_parent, worker.proc),
                         name=f"report-worker-{worker.index}", daemon=True).start()

    def _read(self, worker: _Worker, up: Any, proc: Any) -> None:
        """(A thread per worker) hand its batches to the event loop until it closes."""
        while True:
            try:
                message = up.recv()
            except (EOFError, OSError):
                break
            if message is None:  # its last batch came before this
                worker.closed.set()
                return
            if message == LISTENING:
                worker.listening.set()
                continue
            if isinstance(message, tuple) and message[0] == "auth":
                self.auth_failures[worker.index] = message[1]
                continue
            if isinstance(message, tuple) and message[0] == "applied":
                self._loop.call_soon_threadsafe(self._applied, worker, message[1])
                continue
            if isinstance(message, tuple) and message[0] == "load":
                self.load[message[1]] = WorkerLoad(worker.index, *message[2:])
                continue
            if isinstance(message, tuple) and message[0] == "renewed":
                self._loop.call_soon_threadsafe(self.renew, message[1])
                continue
            self._loop.call_soon_threadsafe(self.apply, message)
        worker.closed.set()
        if not self._stopping:
            log.error("report worker %d (pid %s) died (exit code %s); starting another "
                      "in %g s", worker.index, proc.pid, proc.exitcode, RESTART_S)
            self._loop.call_soon_threadsafe(self._loop.call_later, RESTART_S,
                                            self._respawn, worker)

    def _respawn(self, worker: _Worker) -> None:
        if not self._stopping:
            self._spawn(worker)

    async def push_plan(self, plan: StoredPlan) -> None:
        """Tell every worker the coordinator now serves ``plan`` (its rows: all a
        worker needs of it)."""
        if not self.workers:
            return
        rows = await asyncio.get_running_loop().run_in_executor(None, lambda: plan.rows)
        message = ("plan", plan.id, plan.created, plan.kind, rows)
        if self._plan is None or plan.id > self._plan[1]:  # what a new worker starts with
            self._plan = message
        await self._broadcast(message)  # a worker keeps the newest it was told

    async def push_versions(self, table: Any) -> None:
        """Tell every worker the version table (``versions.VersionTable``) answers use
        now."""
        self._versions = ("versions", table)
        await self._broadcast(self._versions)

    async def push_health(self, healthy: bool, full: bool = False, queued: int = 0) -> None:
        """Tell every worker whether the store takes writes (503s while it does not;
        the store's error stays in the coordinator's log), whether the coordinator
        keeps ``max_nodes`` (then a worker passes reports from nodes outside its plan
        on to the coordinator, which knows whether they are new) and how many reports
        wait for its group commit (a worker counts them in its queue: a store slower
        than the reports makes every worker refuse)."""
        if self.workers and (healthy, full, queued) != self._health[1:]:
            self._health = ("store", healthy, full, queued)
            await self._broadcast(self._health)

    async def push_routing(self, version: int | None, table: bytes | None) -> None:
        """Tell every worker the routing table the coordinator serves now."""
        self._routing = ("routing", version, table)
        await self._broadcast(self._routing)

    async def push_credentials(self, credentials: Credentials) -> None:
        """Tell every worker the credentials the coordinator accepts now (hashes) and
        the certificates it refuses; return once each running worker took them (or
        after ``APPLY_WAIT_S``, logged): a revoked certificate is refused on every
        listener from the next request."""
        number = self._credentials[3] + 1
        self._credentials = ("credentials", tuple(credentials.creds),
                             dict(credentials.revoked), number)
        running = [w for w in self.workers if w.proc is not None]
        if not running:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((number, waiter))
        await self._broadcast(self._credentials)
        self._check_applied()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), APPLY_WAIT_S)
        except asyncio.TimeoutError:
            log.error("report workers: not all took the new credentials within %g s",
                      APPLY_WAIT_S)
        finally:
            self._applied_waiters = [(n, f) for n, f in self._applied_waiters
                                     if f is not waiter]

    def _applied(self, worker: _Worker, number: int) -> None:
        worker.applied = max(worker.applied, number)
        self._check_applied()

    def _check_applied(self) -> None:
        """Resolve the waits for credentials every live worker has taken."""
        live = [w for w in self.workers if w.proc is not None and w.proc.is_alive()]
        for number, waiter in self._applied_waiters:
            if not waiter.done() and all(w.applied >= number for w in live):
                waiter.set_result(None)

    async def _broadcast(self, message: tuple) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.send, message)
                               for w in self.workers if w.proc is not None))

    def reload(self) -> None:
        """Tell every worker to read its TLS files again (the coordinator's SIGHUP)."""
        for worker in self.workers:
            if worker.proc is not None:
                worker.send(("reload",))

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every worker; return once each handed over its last batch (or
        ``timeout_s`` passed: then it is killed)."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        running = [w for w in self.workers if w.proc is not None]
        for w in running:
            await loop.run_in_executor(None, w.send, None)
        deadline = loop.time() + timeout_s
        for w in running:
            await loop.run_in_executor(None, w.closed.wait, max(0.0, deadline - loop.time()))
            await loop.run_in_executor(None, w.proc.join, max(0.1, deadline - loop.time()))
            if w.proc.is_alive():
                log.error("report worker %d did not stop; killed", w.index)
                w.proc.kill()
                w.proc.join()
        await asyncio.sleep(0)  # the batches the readers handed over are applied first


# -- the worker process ----------------------------------------------------------------


class _WorkerState:
    """What one worker holds: the plan (a ``Fleet`` that answers from it), the store's
    health as last told, and the answered reports not yet handed over."""

    def __init__(self, config: CoordinatorConfig, internal_socket: str, forward_key: str
                 ) -> None:
        self.fleet = Fleet(config.directive_ttl_s)
        self.tls = ServerTls(config.tls) if config.tls is not None else None
        self.guard = Guard(Credentials(), throttle=config.auth.throttle())
        self.internal_socket, self.forward_key = internal_socket, forward_key
        self.names: frozenset[str] = frozenset()  # this server's (``own_names``)
        self.healthy, self.full = True, False
        self.writing = 0  # reports waiting for the coordinator's group commit, as told
        self.answered: list[Answered] = []
        self.renewed: list[Renewed] = []
        self.shedder = Shedder(config.report_shed_lag_ms / 1000.0, config.report_shed_queue,
                               config.report_retry_after_s)
        self.reports = 0  # answered since the worker started
        self.leases = 0  # renewed since the worker started
        self.session: ClientSession | None = None

    def take(self, message: tuple) -> tuple | None:
        """A message from the coordinator (on the event loop); the answer it wants, if
        any (``("applied", number)`` for credentials)."""
        if message[0] == "plan":
            _, plan_id, created, kind, rows = message
            self.fleet.adopt(StoredPlan(plan_id, created, kind, rows=rows))
        elif message[0] == "store":
            _, self.healthy, self.full, self.writing = message
        elif message[0] == "credentials":
            _, creds, revoked, number = message
            self.guard.credentials.replace(creds, revoked)
            return ("applied", number)
        elif message[0] == "routing":
            self.fleet.routing.adopt(message[1], message[2])
        elif message[0] == "versions":
            self.fleet.set_versions(message[1])
        elif message[0] == "reload" and self.tls is not None:
            try:
                self.tls.reload()
            except ValueError as exc:
                log.error("reload: keeping the running certificates: %s", exc)
        return None


WORKER: web.AppKey[_WorkerState] = web.AppKey("report_worker", _WorkerState)


def _forwards(state: _WorkerState, name: str) -> bool:
    """Whether ``name``'s report goes to the coordinator (it keeps ``max_nodes``, and the
    node is not in the plan: maybe new)."""
    plan = state.fleet.plan
    return state.full and (plan is None or name not in plan.rows)


def _shed(state: _WorkerState) -> None:
    state.shedder.check(len(state.answered) + state.writing)


def _answer_report(state: _WorkerState, name: str, raw: bytes) -> bytes:
    report = parse_report_body(name, raw)
    refuse_while_store_fails(state.healthy)
    _, body = state.fleet.answer(name, report)
    state.answered.append((report_record(name, raw, report, time.time()),
                           reported_models(report), body, reported_routing(report)))
    state.reports += 1
    return body


def _answer_lease(state: _WorkerState, name: str, raw: bytes) -> bytes:
    lease = parse_lease_body(name, raw)
    refuse_while_store_fails(state.healthy)
    body, changed = state.fleet.answer_lease(name, lease)
    if body is not SEND_REPORT:
        state.renewed.append((name, time.time(), body if changed else None))
        state.leases += 1
    return body


def _raw_answer(state: _WorkerState) -> Callable[[str, str, bytes], bytes | None]:
    """The answers of the raw lane (``lane.raw_take``): as ``_report``'s and
    ``_lease``'s."""

    def answer(kind: str, name: str, raw: bytes) -> bytes | None:
        if kind == "report" and _forwards(state, name):
            return None
        _shed(state)
        return (_answer_report if kind == "report" else _answer_lease)(state, name, raw)

    return answer


def _raw_lanes(config: CoordinatorConfig, state: _WorkerState) -> RawLanes:
    """The raw lane of a worker's listener (``_worker_app`` made first: it sets the
    names)."""
    return RawLanes(raw_take(state.guard, lambda: state.names, _raw_answer(state), log),
                    timeout_s=config.read_timeout_s, max_body=config.max_request_size)


async def _report(request: web.Request) -> web.Response:
    state = request.app[WORKER]
    name = request.match_info["name"]
    if _forwards(state, name):
        return await _forward(request)
    _shed(state)
    body = _answer_report(state, name, bytes(await request_body(request)))
    return web.Response(body=body, content_type="application/json")


async def _lease(request: web.Request) -> web.Response:
    state = request.app[WORKER]
    _shed(state)
    body = _answer_lease(state, request.match_info["name"],
                         bytes(await request_body(request)))
    return web.Response(body=body, content_type="application/json")


async def _forward(request: web.Request) -> web.StreamResponse:
    """Anything but a report: to the coordinator, and its answer back, as they are."""
    state = request.app[WORKER]
    return await forward(request, state.session, state.forward_key)


def _report_need(request: web.Request) -> Need | None:
    """A report or lease needs its node's credential; the rest is checked by the
    coordinator."""
    if request.match_info.handler in (_report, _lease):
        return Need("report", request.match_info["name"])
    return None


def _report_lane(request: web.Request) -> Any:
    """A report's or lease's handler where it may skip the rest of the middlewares."""
    need = _report_need(request)
    if need is None:
        return None
    state = request.app[WORKER]
    return request.match_info.handler if takes_lane(request, state.guard, state.names,
                                                    need) else None


def _worker_app(config: CoordinatorConfig, state: _WorkerState) -> web.Application:
    state.names = own_names(config.host, config.allowed_hosts)  # what it forwards has
    # its Host
    app = web.Application(client_max_size=config.max_request_size,
                          handler_args=handler_args(config.read_timeout_s),
                          middlewares=[
        json_newline,
        # the coordinator's answers: 400s, 503s, 413, 500
        json_errors_middleware(log, lane=_report_lane),
        host_check(lambda r: carries_credential(r, r.app[WORKER].guard, True),
                   lambda r: r.app[WORKER].names),
        scoped_auth(lambda r: r.app[WORKER].guard, _report_need, certificates=True,
                    open_tokens=False),  # what it forwards, the coordinator judges
        body_timeout_middleware(config.read_timeout_s, config.max_request_size,
                                BodyMemory(config.max_request_bytes_in_flight)),
    ])
    app[WORKER] = state
    app.router.add_post(REPORT_PATH, _report)
    app.router.add_post(LEASE_PATH, _lease)
    app.router.add_route("*", "/{tail:.*}", _forward)
    return app


def _serve(config: CoordinatorConfig, port: int, internal_socket: str, up: Any, down: Any,
           told: tuple, forward_key: str, parent: int) -> None:
    """The worker process."""
    exit_with_parent(parent)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_event_loop(_worker_main(config, port, internal_socket, up, down, told, forward_key),
                   poll_interval_s=config.report_worker_poll_ms / 1000.0)


async def _worker_main(config: CoordinatorConfig, port: int, internal_socket: str, up: Any,
                       down: Any, told: tuple, forward_key: str) -> None:
    """``told``: the plan, store health, credentials, routing table and version table
    messages to start with."""
    loop = asyncio.get_running_loop()
    state = _WorkerState(config, internal_socket, forward_key)
    for message in told:
        if message is not None:
            state.take(message)
    stop = asyncio.Event()
    # One thread sends on the pipe, in the order messages are given: a batch whose
    # hand-over was under way at the stop reaches the coordinator before the last batch
    # and the closing None (after which the coordinator reads no more).
    sender = ThreadPoolExecutor(1, thread_name_prefix="to-coordinator")

    def take(message: tuple) -> None:  # on the loop: then its answer, if any, goes up
        answer = state.take(message)
        if answer is not None:
            sender.submit(up.send, answer)

    def read_down() -> None:  # plans and health from the coordinator; None: stop
        while True:
            try:
                message = down.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                loop.call_soon_threadsafe(stop.set)
                return
            loop.call_soon_threadsafe(take, message)

    threading.Thread(target=read_down, name="from-coordinator", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the coordinator stops it
        loop.add_signal_handler(sig, lambda: None)
    state.session = ClientSession("http://localhost", timeout=ClientTimeout(total=None),
                                  connector=UnixConnector(internal_socket))
    app = _worker_app(config, state)
    lanes = _raw_lanes(config, state)
    runner, _ = await listen(app, config.host, port, server_connections(config),
                             backlog=4096, reuse_port=True, front=lanes.front,
                             ssl_context=state.tls.context if state.tls else None)
    settle_gc()

    sender.submit(up.send, LISTENING)
    told_failures: dict[str, int] = {}

    def hand_over_answered() -> list[Future]:
        """Give the sender what was answered since the last hand-over: the reports, then
        the leases, both taken now (a lease renewed from a report answered meanwhile
        goes after that report: the coordinator knows the node when the lease comes)."""
        batch, state.answered = state.answered, []
        renewed, state.renewed = state.renewed, []
        sent = [sender.submit(up.send, batch)] if batch else []
        if renewed:
            sent.append(sender.submit(up.send, ("renewed", renewed)))
        return sent

    async def hand_over() -> None:
        told_load = loop.time()
        while True:
            await asyncio.sleep(BATCH_S)
            for sent in hand_over_answered():  # (the stop cancels the wait, not the send)
                await asyncio.shield(asyncio.wrap_future(sent))
            if state.guard.failures != told_failures:
                told_failures.update(state.guard.failures)
                await loop.run_in_executor(sender, up.send, ("auth", dict(told_failures)))
            if loop.time() - told_load >= LOAD_S:
                told_load = loop.time()
                await loop.run_in_executor(sender, up.send, (
                    "load", os.getpid(), time.process_time(), state.reports,
                    state.shedder.refused, state.shedder.lag, state.shedder.busy,
                    state.leases, lanes.taken, lanes.handed_over))

    handing = loop.create_task(hand_over())
    watching = loop.create_task(state.shedder.watch())
    try:
        await stop.wait()
    finally:
        handing.cancel()
        watching.cancel()
        lanes.close()
        await runner.cleanup()  # no more reports; then the rest is handed over
        last = hand_over_answered() + [sender.submit(up.send, None)]
        for sent in last:
            try:
                await asyncio.wrap_future(sent)
            except OSError:
                pass
        sender.shutdown()
        await state.session.close()
