"""Report workers: processes beside the coordinator that answer node reports on its port.

One event loop is one core and one GIL, and every report costs it CPU (HTTP,
validation, the answer, the group commit): at thousands of reports a second it runs
out, and reports queue (docs/benchmarks.md, ``coordinator_scale.py``). With ``report_workers: N`` the
coordinator starts N worker processes that listen on its port too (``SO_REUSEPORT``:
the kernel spreads connections over the listeners; an agent's keep-alive connection
stays with one). A worker

* answers ``POST /v1/nodes/{name}/report`` itself: checks its credential (the node's
  own, or admin: the coordinator's rule, ``agent.httpauth``; the tokens the coordinator
  accepts come over the pipe, again on SIGHUP), throttles failures per peer, validates
  the report (the coordinator's 400s), answers the node's directives under the current
  plan and version table, which the coordinator pushes to every worker when it adopts
  one (``push_plan``, ``push_versions``), and answers
  503 while the coordinator says its store is failing;
* hands what it answered to the coordinator every ``BATCH_S`` (over a pipe): the
  coordinator records the node, writes it with its own group commit and shows the
  directives issued (``GET /v1/nodes``) as for a report it answered itself;
* forwards every other request to the coordinator, as it came, over a loopback
  listener of the coordinator's own (the token is checked there), with the real peer
  address and certificate name in headers the coordinator trusts only with the forward
  key it gave the worker (``agent.httpauth.FORWARD_KEY``);
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.ingest import (Fleet, ReportedModels, parse_report_body,
                                     refuse_while_store_fails, report_record, reported_models)
from agent.coordinator.planworker import exit_with_parent
from agent.coordinator.store import ReportRecord, StoredPlan
from agent.errors import json_error, json_errors_middleware
from agent.eventloop import header_timeout_args, listen, run_event_loop, settle_gc
from agent.credentials import Credential, Credentials
from agent.httpauth import (FORWARD_KEY, FORWARDED_NAME, FORWARDED_PEER, Guard, Need,
                            certificate_name, host_check, own_names, scoped_auth)
from agent.httpbody import body_timeout_middleware, request_body
from agent.tls import ServerTls

log = logging.getLogger("edgeagent.coordinator.reportworkers")

BATCH_S = 0.25  # a worker hands its answered reports over this often
RESTART_S = 1.0  # a dead worker is started again after this long
REPORT_PATH = "/v1/nodes/{name}/report"
#: A worker's first message: it listens on the port.
LISTENING = "listening"
# hop-by-hop and framing headers, which a forwarder sets itself (RFC 9110 §7.6.1)
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                  "upgrade", "proxy-authorization", "proxy-authenticate", "host",
                  "content-length", "content-encoding", "date", "server",
                  FORWARD_KEY.lower(), FORWARDED_PEER.lower(), FORWARDED_NAME.lower()})

# one answered report as handed over: what to write, its models, the directives' JSON
Answered = tuple[ReportRecord, ReportedModels, bytes]


class _Worker:
    """The coordinator's side of one worker process: its pipes and reader thread."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.down: Any = None  # coordinator -> worker: plans, store health, reload, stop
        self.send_lock = threading.Lock()
        self.closed = threading.Event()  # the worker handed over its last batch
        self.listening = threading.Event()  # the worker listens on the port

    def send(self, message: Any) -> None:
        with self.send_lock:
            try:
                self.down.send(message)
            except (OSError, ValueError):  # it died: its reader restarts it
                pass


class ReportWorkers:
    """Starts, feeds and stops the report workers of one coordinator."""

    def __init__(self, config: CoordinatorConfig, *,
                 apply: Callable[[list[Answered]], None]) -> None:
        """``apply`` gets each batch of answered reports on the event loop."""
        self.config, self.apply = config, apply
        self.workers = [_Worker(i) for i in range(config.report_workers)]
        self._port = 0
        self._internal = ""
        self._plan: tuple | None = None  # the message of the current plan
        self._health: tuple = ("store", True, False)
        self._credentials: tuple = ("credentials", ())
        self._versions: tuple | None = None  # the message of the current version table
        #: Vouches for the peer a worker forwards (never leaves this machine's processes).
        self.forward_key = secrets.token_urlsafe(32)
        #: Each worker's failed-auth counts, as it last told.
        self.auth_failures: dict[int, dict[str, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    async def start(self, port: int, internal_url: str, *, wait_s: float = 60.0) -> bool:
        """Start the workers on ``port`` (bound by the coordinator with
        ``reuse_port``); they forward what is not a report to ``internal_url``. Whether
        every one listens within ``wait_s``."""
        self._loop = asyncio.get_running_loop()
        self._port, self._internal = port, internal_url
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
        worker.proc = ctx.Process(
            target=_serve, name=f"edgeagent-report-worker-{worker.index}", daemon=True,
            args=(self.config, self._port, self._internal, up_child, down_child,
                  (self._plan, self._health, self._credentials, self._versions),
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

    async def push_health(self, healthy: bool, full: bool = False) -> None:
        """Tell every worker whether the store takes writes (503s while it does not;
        the store's error stays in the coordinator's log) and whether the coordinator
        keeps ``max_nodes`` (then a worker passes reports from nodes outside its plan
        on to the coordinator, which knows whether they are new)."""
        if self.workers and (healthy, full) != self._health[1:]:
            self._health = ("store", healthy, full)
            await self._broadcast(self._health)

    async def push_credentials(self, creds: tuple[Credential, ...]) -> None:
        """Tell every worker the credentials the coordinator accepts now (hashes)."""
        self._credentials = ("credentials", tuple(creds))
        await self._broadcast(self._credentials)

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

    def __init__(self, config: CoordinatorConfig, internal_url: str, forward_key: str
                 ) -> None:
        self.fleet = Fleet(config.directive_ttl_s)
        self.tls = ServerTls(config.tls) if config.tls is not None else None
        self.guard = Guard(Credentials(), throttle=config.auth.throttle())
        self.internal_url, self.forward_key = internal_url, forward_key
        self.healthy, self.full = True, False
        self.answered: list[Answered] = []
        self.session: ClientSession | None = None

    def take(self, message: tuple) -> None:
        """A message from the coordinator (on the event loop)."""
        if message[0] == "plan":
            _, plan_id, created, kind, rows = message
            self.fleet.adopt(StoredPlan(plan_id, created, kind, rows=rows))
        elif message[0] == "store":
            _, self.healthy, self.full = message
        elif message[0] == "credentials":
            self.guard.credentials.replace(message[1])
        elif message[0] == "versions":
            self.fleet.set_versions(message[1])
        elif message[0] == "reload" and self.tls is not None:
            try:
                self.tls.reload()
            except ValueError as exc:
                log.error("reload: keeping the running certificates: %s", exc)


WORKER: web.AppKey[_WorkerState] = web.AppKey("report_worker", _WorkerState)


async def _report(request: web.Request) -> web.Response:
    state = request.app[WORKER]
    name = request.match_info["name"]
    plan = state.fleet.plan
    if state.full and (plan is None or name not in plan.rows):  # maybe a new node
        return await _forward(request)
    raw = bytes(await request_body(request))
    report = parse_report_body(name, raw)
    refuse_while_store_fails(state.healthy)
    _, body = state.fleet.answer(name, report)
    state.answered.append((report_record(name, raw, report, time.time()),
                           reported_models(report), body))
    return web.Response(body=body, content_type="application/json")


async def _forward(request: web.Request) -> web.StreamResponse:
    """Anything but a report: to the coordinator, and its answer back, as they are."""
    state = request.app[WORKER]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    headers[FORWARD_KEY] = state.forward_key
    headers[FORWARDED_PEER] = request.remote or "unknown"
    name = certificate_name(request.transport)
    if name:
        headers[FORWARDED_NAME] = name
    try:
        async with state.session.request(
                request.method, request.rel_url, headers=headers,
                data=bytes(await request_body(request)) if request.body_exists else None,
                allow_redirects=False) as answer:
            body = await answer.read()
            return web.Response(status=answer.status, body=body, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in _HOP})
    except (ClientError, asyncio.TimeoutError) as exc:
        return json_error(503, f"the coordinator behind this report worker does not "
                          f"answer ({type(exc).__name__}); try again", {"Retry-After": "1"})


def _report_need(request: web.Request) -> Need | None:
    """A report needs its node's credential; the rest is checked by the coordinator."""
    if request.match_info.handler is _report:
        return Need("report", request.match_info["name"])
    return None


def _worker_app(config: CoordinatorConfig, state: _WorkerState) -> web.Application:
    names = own_names(config.host, config.allowed_hosts)  # what it forwards has its Host
    app = web.Application(client_max_size=8 * 2**20,
                          handler_args=header_timeout_args(config.read_timeout_s),
                          middlewares=[
        json_errors_middleware(log),  # the coordinator's answers: 400s, 503s, 413, 500
        host_check(lambda r: bool(r.app[WORKER].guard.credentials), lambda r: names),
        scoped_auth(lambda r: r.app[WORKER].guard, _report_need, certificates=True),
        body_timeout_middleware(config.read_timeout_s),
    ])
    app[WORKER] = state
    app.router.add_post(REPORT_PATH, _report)
    app.router.add_route("*", "/{tail:.*}", _forward)
    return app


def _serve(config: CoordinatorConfig, port: int, internal_url: str, up: Any, down: Any,
           told: tuple, forward_key: str, parent: int) -> None:
    """The worker process."""
    exit_with_parent(parent)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_event_loop(_worker_main(config, port, internal_url, up, down, told, forward_key))


async def _worker_main(config: CoordinatorConfig, port: int, internal_url: str, up: Any,
                       down: Any, told: tuple, forward_key: str) -> None:
    """``told``: the plan, store health, credentials and version table messages to
    start with."""
    loop = asyncio.get_running_loop()
    state = _WorkerState(config, internal_url, forward_key)
    for message in told:
        if message is not None:
            state.take(message)
    stop = asyncio.Event()

    def read_down() -> None:  # plans and health from the coordinator; None: stop
        while True:
            try:
                message = down.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                loop.call_soon_threadsafe(stop.set)
                return
            loop.call_soon_threadsafe(state.take, message)

    threading.Thread(target=read_down, name="from-coordinator", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the coordinator stops it
        loop.add_signal_handler(sig, lambda: None)
    state.session = ClientSession(internal_url, timeout=ClientTimeout(total=None))
    runner, _ = await listen(_worker_app(config, state), config.host, port, backlog=4096,
                             reuse_port=True,
                             ssl_context=state.tls.context if state.tls else None)
    settle_gc()

    up.send(LISTENING)
    # One thread sends on the pipe, in the order messages are given: a batch whose
    # hand-over was under way at the stop reaches the coordinator before the last batch
    # and the closing None (after which the coordinator reads no more).
    sender = ThreadPoolExecutor(1, thread_name_prefix="to-coordinator")
    told_failures: dict[str, int] = {}

    async def hand_over() -> None:
        while True:
            await asyncio.sleep(BATCH_S)
            batch, state.answered = state.answered, []
            if batch:
                await loop.run_in_executor(sender, up.send, batch)
            if state.guard.failures != told_failures:
                told_failures.update(state.guard.failures)
                await loop.run_in_executor(sender, up.send, ("auth", dict(told_failures)))

    handing = loop.create_task(hand_over())
    try:
        await stop.wait()
    finally:
        handing.cancel()
        await runner.cleanup()  # no more reports; then the rest is handed over
        batch, state.answered = state.answered, []
        last = [sender.submit(up.send, batch)] if batch else []
        last.append(sender.submit(up.send, None))
        for sent in last:
            try:
                await asyncio.wrap_future(sent)
            except OSError:
                pass
        sender.shutdown()
        await state.session.close()
