"""Shared fixtures. Node-agent helpers: small model repositories written on the fly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.modelzoo import write_mlp

#: A small real MLP used across node tests (a few KB; loads in milliseconds).
TINY_MLP = dict(inputs=4, hidden=16, layers=1, outputs=2, seed=11)


def add_synthetic(repo: Path, name: str, *, size_bytes: int = 10_000_000, load_ms: float = 0,
                  base_ms: float = 0, per_item_ms: float = 0, **extra) -> Path:
    """A synthetic model directory (only a config.yaml)."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"backend": "synthetic",
           "synthetic": {"base_ms": base_ms, "per_item_ms": per_item_ms,
                         "size_bytes": size_bytes, "load_ms": load_ms}, **extra}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def add_mlp(repo: Path, name: str, version: int = 1, config: dict | None = None,
            **shape) -> Path:
    """A real ONNX MLP at ``repo/name/version/model.onnx`` (TINY_MLP by default)."""
    write_mlp(repo / name / str(version) / "model.onnx", **{**TINY_MLP, **shape})
    if config is not None:
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    return repo / name


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def settled_gc():
    """The collector as a serving agent has it (``agent.eventloop.settle_gc``) for an
    in-process timing test, restored after: otherwise a full collection walking what
    earlier tests left behind (50-100 ms here) shows up as batch latency."""
    import gc

    from agent.eventloop import settle_gc

    thresholds = gc.get_threshold()
    settle_gc()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class ThreadedServer:
    """A real aiohttp app on 127.0.0.1 in a background thread (own event loop), so that
    blocking clients such as ``tritonclient.http`` can call it from the test."""

    def __init__(self, app):
        import asyncio
        import threading

        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.app = app
        self.runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.closed = False
        self.call(self._start())

    async def _start(self):
        from aiohttp import web

        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def call(self, coro, timeout=60):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class AgentServer(ThreadedServer):
    """A real agent on 127.0.0.1 (see ``ThreadedServer``), started and ready."""

    def __init__(self, config, **node_kwargs):
        from agent.node.app import NODE, create_app, prepare_process

        prepare_process()  # as ``edgeagent serve`` does
        super().__init__(create_app(config, **node_kwargs))
        self.node = self.app[NODE]
        self.call(self.node.wait_ready())

    def request(self, method, path, body=None, headers=None):
        """(status, headers, parsed JSON or raw bytes) for one HTTP request."""
        import json
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, hdrs, raw = resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            status, hdrs, raw = err.code, dict(err.headers), err.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw

@pytest.fixture
def start_agent(tmp_path):
    """start_agent(repo, budget=..., **config) -> AgentServer; stopped after the test."""
    from agent.config import AgentConfig

    servers = []

    def start(repo, budget=200_000_000, **config):
        cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=budget,
                          infer_threads=2, **config)
        server = AgentServer(cfg, budgets={"cpu": budget})
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


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
