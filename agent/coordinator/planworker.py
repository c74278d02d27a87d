"""Planning in a child process: a plan of a large fleet (reading every live node's
report, forecasting every model, solving, placing) takes seconds of CPU, and in the
coordinator's process it would hold the GIL that ingestion needs. The child has its
own store connection and ``Planner`` (so the reactive counters live there) and reads
what it plans from the store; the parent flushes queued reports before each call.
The child runs at ``PLANNER_NICENESS`` (ingestion wins the cores) with the garbage
collector off during a call (a plan reads every live node's summary, and a reactive
check every renewed node's).

``PlanWorker`` has the ``Planner`` methods the loops call (``plan_now``,
``reactive_tick``), blocking: call them from a worker thread (``PlannerLoops`` does).
The parent's clock is read for each call and is the child's clock during it. A child
that died is started again on the next call; a coordinator that dies takes the child
with it (``exit_with_parent``).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import threading
import time
import traceback
from typing import Any, Callable

from agent.coordinator.config import CoordinatorConfig
from agent.coordinator.planner import PlanError, Planner
from agent.coordinator.store import StoredPlan
from agent.coordinator.stores import open_store

log = logging.getLogger("edgeagent.coordinator.planworker")

PLANNER_NICENESS = 10  # added to the planning process's nice value


class PlanWorker:
    """The parent's side of the planning process."""

    def __init__(self, config: CoordinatorConfig, store: Any, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.store, self.clock = config, store, clock
        self.last_error: str | None = None
        self._lock = threading.Lock()  # one call at a time
        self._proc: Any = None
        self._conn: Any = None

    def start(self) -> None:
        """Start the child now (it imports the solver: seconds), not on the first plan."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")  # the parent has threads: no fork
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.config, os.getpid()),
                                 name="edgeagent-planner", daemon=True)
        self._proc.start()
        child.close()

    def _call(self, method: str, *args: Any) -> StoredPlan | None:
        with self._lock:
            self._ensure()
            try:
                self._conn.send((method, self.clock(), args))
                status, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._proc = None
                raise RuntimeError(f"the planning process died during {method}: {exc}") \
                    from None
        if status == "error":
            self.last_error = value
            raise PlanError(value)
        if status == "crash":
            raise RuntimeError(f"planning failed in the planning process:\n{value}")
        if method == "plan_now":
            self.last_error = None
        if value is None:
            return None
        plan_id, created, kind, text, rows = value
        return StoredPlan(plan_id, created, kind, text=text, rows=rows)

    @property
    def pid(self) -> int | None:
        """The planning process's pid (None before it started)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def plan_now(self, kind: str = "long-term") -> StoredPlan:
        return self._call("plan_now", kind)

    def reactive_tick(self) -> StoredPlan | None:
        return self._call("reactive_tick")

    def close(self) -> None:
        """Stop the child: asked to exit when idle, killed when a plan is in flight
        (a stop does not wait for a plan of the whole fleet)."""
        proc = self._proc
        if proc is None:
            return
        if self._lock.acquire(timeout=1.0):
            try:
                self._conn.send(None)
                proc.join(5)
            except OSError:
                pass
            finally:
                self._lock.release()
        if proc.is_alive():
            proc.kill()
        proc.join()
        self._proc = None


def exit_with_parent(parent: int, poll_s: float = 1.0) -> threading.Thread:
    """Exit this process (a child of ``parent``, the pid its parent passed it) within
    ``poll_s`` of that parent's death, whatever it is doing: a coordinator killed
    mid-plan (``kill -9``, the OOM killer) must not leave a planning process behind,
    running a plan nobody will read. A thread that watches the parent's pid (a process
    whose parent died is adopted by another); the pid is passed, not read here, as the
    parent may die while the child still imports."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


def _serve(conn: Any, config: CoordinatorConfig, parent: int) -> None:
    """The child: answer ``(method, now, args)`` messages until None or EOF."""
    exit_with_parent(parent)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # ingestion wins the cores: a plan may take longer, a report must not wait
        os.nice(PLANNER_NICENESS)
    except OSError:
        pass
    now = [time.time()]
    store = open_store(config)
    planner = Planner(store, config, clock=lambda: now[0])
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is None:
                return
            method, now[0], args = message
            gc.disable()  # a plan reads the whole fleet: no full collections meanwhile
            try:
                plan = getattr(planner, method)(*args)
                conn.send(("ok", None if plan is None  # text and rows: a large plan's
                           # dicts would unpickle holding the GIL that reports need
                           else (plan.id, plan.created, plan.kind, plan.text, plan.rows)))
            except PlanError as exc:
                conn.send(("error", str(exc)))
            except Exception:  # noqa: BLE001 - told to the parent, which logs it
                conn.send(("crash", traceback.format_exc()))
            finally:
                gc.enable()
    finally:
        store.close()
