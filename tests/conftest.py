"""Shared fixtures (helpers that are not fixtures: tests/helpers.py).

The policy kernels run interpreted in the test processes, as ``edgeagent serve`` runs
them (``EDGEAGENT_JIT=0``, set here before anything imports ``cachepolicies``; the choice
is made once per process); tests about the compiled kernels run those in a child
process (``helpers.run_pytest_compiled``). ``EDGEAGENT_JIT=1 pytest`` compiles
everywhere."""

from __future__ import annotations

import os

os.environ.setdefault("EDGEAGENT_JIT", "0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
    """In the controller of a parallel run (pytest-xdist), before its workers start: a
    fresh checkout's numba kernels compiled once (``helpers.warm_kernel_caches``)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from tests.helpers import warm_kernel_caches

        warm_kernel_caches()


def _closed_after(make):
    """A fixture's body: yield ``start`` (``make``, keeping what it returns), then close
    every server it started."""
    servers = []

    def start(*args, **kwargs):
        servers.append(make(*args, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def settled_gc():
    """The collector as a serving agent has it (``agent.http.eventloop.settle_gc``) for an
    in-process timing test, restored after: otherwise a full collection walking what
    earlier tests left behind (50-100 ms here) shows up as batch latency."""
    import gc

    from agent.http.eventloop import settle_gc

    thresholds = gc.get_threshold()
    settle_gc()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.fixture
def start_agent(tmp_path):
    """start_agent(repo, budget=..., **config) -> AgentServer; stopped after the test."""
    from agent.config import AgentConfig
    from tests.helpers import AgentServer

    def start(repo, budget=200_000_000, **config):
        cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=budget,
                          infer_threads=2, **config)
        return AgentServer(cfg, budgets={"cpu": budget})

    yield from _closed_after(start)


@pytest.fixture
def start_coordinator(tmp_path):
    """start_coordinator(**config) -> CoordinatorServer (planning loops off unless
    ``start_loops=True``); stopped after the test."""
    from agent.coordinator.config import CoordinatorConfig
    from tests.helpers import CoordinatorServer

    def start(**config):
        config.setdefault("state_dir", tmp_path / "coordinator")
        kwargs = {k: config.pop(k) for k in ("clock", "start_loops") if k in config}
        kwargs.setdefault("start_loops", False)
        return CoordinatorServer(CoordinatorConfig(**config), **kwargs)

    yield from _closed_after(start)


@pytest.fixture
def planner_setup(tmp_path):
    """(store, planner, clock): a planner on a fresh SQLite store and a fake clock."""
    from agent.coordinator.config import CoordinatorConfig
    from agent.coordinator.planner import Planner
    from agent.coordinator.store import Store
    from tests.helpers import Clock

    clock = Clock()
    config = CoordinatorConfig(state_dir=tmp_path, rate_step_s=5, history_s=120,
                               plan_window_s=30, node_timeout_s=30, reactive_patience=3)
    store = Store(config.database, rate_step_s=config.rate_step_s)
    yield store, Planner(store, config, clock=clock), clock
    store.close()


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL cluster for the session (tests/pgcluster.py); skips where
    no server binary is found (PATH, /usr/lib/postgresql/*/bin) or psycopg is missing."""
    import shutil
    import tempfile

    from tests.pgcluster import Cluster, find_bindir

    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binary (initdb) on PATH or in "
                    "/usr/lib/postgresql/*/bin: install the postgresql package")
    # not under pytest's 0700 base directory: the server may run as nobody
    root = Path(tempfile.mkdtemp(prefix="edgeagent-pg-"))
    cluster = Cluster(bindir, root).init()
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop("immediate")
        except Exception:  # noqa: BLE001 - already stopped by a test
            pass
        shutil.rmtree(root, ignore_errors=True)
