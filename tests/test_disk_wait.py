"""Pulls that wait for disk room (issue 26's follow-up): a pull that finds the disk
budget held by pulls under way and by versions loading waits for room, as a load waits
for memory, and is served; only files that can never fit are a 507 at once, and a pull
that waits past its model's ``load_wait_max_s`` a 503 + Retry-After. A pull in flight
is a window on the memory meter, so a load measured meanwhile is booked at its estimate
and never taught to the footprint model.

Real agents on loopback answering real HTTP requests; the sources are ``agent.sources``'
HTTP source over ``tests.servers``' Range server (with its per-file delays), or the
``file://`` stand-in (``tests.standin_source``) where a test holds a pull open."""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from agent.config import AgentConfig
from agent.modelzoo import write_mlp
from tests.helpers import BODY, TINY_MLP, AgentServer, add_mlp, add_synthetic, v2_body, \
    wait_for
from tests.servers import range_http_server
from tests.standin_source import StandinSources

SIZE = 200_000  # bytes of each synthetic model's file


@pytest.fixture
def agents(tmp_path):
    """agents(repo, **config) -> a real AgentServer; all stopped after the test."""
    started = []

    def start(repo, open_source=None, **config):
        cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data",
                          cpu_budget=200_000_000, infer_threads=2, **config)
        server = AgentServer(cfg, budgets={"cpu": 200_000_000}, open_source=open_source)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def http_models(repo: Path, http, names, *, load_ms: float, delay: float,
                **config) -> None:
    """Synthetic models (load ``load_ms``) whose one file of ``SIZE`` bytes ``http``
    sends after ``delay`` seconds, digest checked."""
    for i, name in enumerate(names):
        data = bytes([i]) * SIZE
        (http.root / name).mkdir(parents=True)
        (http.root / name / "model.bin").write_bytes(data)
        http.delays[f"{name}/model.bin"] = delay
        add_synthetic(repo, name, size_bytes=1_000_000, load_ms=load_ms, max_batch_size=0,
                      source=f"{http.url}/{name}/model.bin",
                      source_options={"sha256": hashlib.sha256(data).hexdigest()},
                      **config)


def infer(server, name):
    return server.request("POST", f"/v2/models/{name}/infer", BODY)


def test_more_cold_models_than_fit_on_disk_wait_for_room_and_are_all_served(
        agents, repo, tmp_path):
    """Eight cold models, room on disk for two and a half, one load at a time: pulls
    outrun the loads, whose files may not go while they load, so later pulls find the
    budget held and wait. Every request (three per model, all at once) is a 200."""
    names = [f"m{i}" for i in range(8)]
    (tmp_path / "remote").mkdir()
    with range_http_server(tmp_path / "remote") as http:
        http_models(repo, http, names, load_ms=150, delay=0.05)
        server = agents(repo, disk_budget=SIZE * 5 // 2, load_concurrency=1,
                        max_concurrent_pulls=2)
        with ThreadPoolExecutor(len(names) * 3) as pool:
            results = list(pool.map(lambda name: (name, infer(server, name)),
                                    names * 3))
        failed = [(name, status, body) for name, (status, _, body) in results
                  if status != 200]
        assert failed == [], failed
        disk = server.node.disk.summary()
        assert disk["pulls"] == len(names) and disk["pull_failures"] == 0, disk
        assert disk["used_bytes"] <= disk["budget_bytes"] and disk["evictions"] >= 6, disk
        assert not len(server.node.disk.rooms)
        bodies = [s for s in http.served if s.sent > 1]  # not the 1-byte size probes
        assert len(bodies) == len(names), http.served  # one download per model


def test_files_that_can_never_fit_are_a_507_at_once_naming_sizes(agents, repo, tmp_path):
    (tmp_path / "remote").mkdir()
    with range_http_server(tmp_path / "remote") as http:
        http_models(repo, http, ["big"], load_ms=0, delay=0.0)
        budget = SIZE // 2
        server = agents(repo, disk_budget=budget, load_wait_max_s=30)
        started = time.monotonic()
        status, _, body = infer(server, "big")
        took = time.monotonic() - started
    assert status == 507, body
    assert took < 5, took  # not after the 30 s wait bound
    error = body["error"]
    assert "model big:1 needs" in error and f"({SIZE} bytes)" in error, error
    assert f"({budget} bytes)" in error, error
    assert server.node.disk.summary()["used_bytes"] == 0


def test_a_pull_waiting_past_its_bound_is_a_503_then_served(agents, repo, tmp_path):
    """Room for one model: ``slow`` loads for a second and a half (its files may not go
    meanwhile); ``b`` (``load_wait_max_s: 0.3``) waits for room, gives up with 503 +
    Retry-After naming what holds it, and is served once the load is done, its failure
    not remembered."""
    (tmp_path / "remote").mkdir()
    with range_http_server(tmp_path / "remote") as http:
        http_models(repo, http, ["slow"], load_ms=1500, delay=0.0)
        http_models(repo, http, ["b"], load_ms=0, delay=0.0, load_wait_max_s=0.3)
        server = agents(repo, disk_budget=SIZE * 3 // 2, load_retry_s=60)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(infer, server, "slow")
            wait_for(lambda: server.node.disk.has(("slow", 1)), what="slow's files")
            status, headers, body = infer(server, "b")
            assert status == 503 and "Retry-After" in headers, body
            assert "model b:1 waited 0.3s" in body["error"] and "slow:1" in body["error"]
            assert server.request("GET", "/v1/cache/b")[2]["state"] == "unloaded"
            assert first.result()[0] == 200
        status, _, body = infer(server, "b")  # slow is resident now: its files may go
        assert status == 200, body
        assert [h["model"] for h in server.node.disk.holdings()] == ["b"]
        assert infer(server, "slow")[0] == 200  # in memory, its files off disk


class BufferingSources(StandinSources):
    """Stand-in sources whose pulls buffer bytes in this process while they run (1 MiB
    every 10 ms, up to 48 MiB, freed when the pull ends), as a download does."""

    def open_source(self, url, options):
        source = super().open_source(url, options)
        pull = source.pull

        def buffering_pull(*args, **kwargs):
            done = threading.Event()
            buffers: list[bytes] = []

            def fill():
                while not done.is_set() and len(buffers) < 48:
                    buffers.append(b"\x01" * 2**20)
                    time.sleep(0.01)

            filler = threading.Thread(target=fill)
            filler.start()
            try:
                return pull(*args, **kwargs)
            finally:
                done.set()
                filler.join()
                buffers.clear()

        source.pull = buffering_pull
        return source


def test_a_load_measured_while_a_pull_runs_is_booked_at_its_estimate(agents, repo,
                                                                     tmp_path):
    """A real ONNX model loaded while a pull holds buffers: its RSS window overlapped
    the pull, so it is booked at its estimate and the footprint model learns nothing;
    loaded again once the pull is done, it is measured."""
    src = tmp_path / "source"
    write_mlp(src / "remote" / "1" / "model.onnx", **TINY_MLP)
    (repo / "remote").mkdir()
    (repo / "remote" / "config.yaml").write_text(
        yaml.safe_dump({"source": f"file://{src / 'remote'}"}))
    add_mlp(repo, "local", inputs=4, hidden=512, layers=3, outputs=2)
    sources = BufferingSources()
    gate = sources.hold[str(src / "remote")] = threading.Event()
    server = agents(repo, open_source=sources.open_source)
    footprints = server.node.cache.footprints
    learned = footprints.learned("onnx")
    row = v2_body([1.0, 2.0, 3.0, 4.0])
    with ThreadPoolExecutor(1) as pool:
        pulled = pool.submit(server.request, "POST", "/v2/models/remote/infer", row)
        try:
            wait_for(lambda: server.node.disk.pulls, what="the pull under way")
            time.sleep(0.1)  # its buffers growing
            assert server.request("POST", "/v2/models/local/infer", row)[0] == 200
            local = server.request("GET", "/v1/cache/local")[2]
            assert local["size_estimated"] is True, local
            assert footprints.learned("onnx") == learned  # nothing learned from it
        finally:
            gate.set()
        assert pulled.result()[0] == 200
    assert server.request("POST", "/v1/cache/local/evict")[0] == 200
    assert server.request("POST", "/v2/models/local/infer", row)[0] == 200
    local = server.request("GET", "/v1/cache/local")[2]
    assert local["size_estimated"] is False, local  # no pull: measured
    assert footprints.learned("onnx") != learned
