"""The disk tier and the three-tier miss path (issue 26, node side): sourced models are
pulled on first use into data_dir/models and served, one pull per version whatever the
number of waiting requests, evicted by the penalty-aware policy (a slow download kept
over a fast one), served from memory after their files left the disk, refused with a
clear 503 while their source is down and a 507 when the disk is full, while resident
models keep serving; credentials in a source URL show nowhere.

The sources are ``agent.sources``' own over a real Range-capable HTTP server
(``tests.servers.range_http_server``) where a test needs the network (a cut transfer,
credentials in a signed URL), else ``tests.standin_source``'s ``file://`` stand-in with
the same API, whose switches make a source slow, unreachable or count its pulls; the
models are real ONNX models written here; the agent is a real one on loopback answering
real HTTP requests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from agent.config import AgentConfig
from agent.modelzoo import write_mlp
from tests.helpers import TINY_MLP, AgentServer, add_mlp, v2_body, wait_for
from tests.servers import range_http_server
from tests.standin_source import StandinSources

SECRET = "s3cr3t-SENTINEL-9f2c"
ROW = v2_body([1.0, 2.0, 3.0, 4.0])


def publish(src: Path, name: str, version: int = 1, hidden: int = 16) -> Path:
    """A model version in a stand-in source directory (``src/name/version/model.onnx``)."""
    write_mlp(src / name / str(version) / "model.onnx", **{**TINY_MLP, "hidden": hidden})
    return src / name


def sourced(repo: Path, name: str, src: Path, **config) -> Path:
    """A repository model directory naming ``src/name`` as its source (config only)."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    url = f"file://agent:{SECRET}@{src / name}" if config.pop("secret", False) \
        else f"file://{src / name}"
    (d / "config.yaml").write_text(yaml.safe_dump({"source": url, **config}))
    return d


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "source"
    d.mkdir()
    return d


@pytest.fixture
def sources():
    return StandinSources()


@pytest.fixture
def agent(tmp_path, sources):
    """agent(repo, **config) -> AgentServer pulling from ``sources``; stopped after."""
    started = []

    def start(repo, budget=200_000_000, disk_free=None, real=False, **config):
        cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=budget,
                          infer_threads=2, **config)
        server = AgentServer(cfg, budgets={"cpu": budget}, disk_free=disk_free,
                             open_source=None if real else sources.open_source)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def infer(server, name, version=None):
    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
    return server.request("POST", path, ROW)


def cache_entry(server, name):
    status, _, body = server.request("GET", f"/v1/cache/{name}")
    assert status == 200, body
    return body


def test_a_sourced_model_is_pulled_and_served_on_its_first_request(agent, repo, src,
                                                                   sources, tmp_path):
    publish(src, "m", 1)
    publish(src, "m", 2, hidden=8)
    sourced(repo, "m", src)
    server = agent(repo)
    assert cache_entry(server, "m")["versions"] == [1, 2]  # listed at start
    assert not (tmp_path / "data" / "models" / "m" / "2").exists()
    status, _, body = infer(server, "m")
    assert status == 200, body
    assert body["model_version"] == "2" and len(body["outputs"][0]["data"]) == 2
    assert (tmp_path / "data" / "models" / "m" / "2" / "model.onnx").is_file()
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["config.yaml"]
    entry = cache_entry(server, "m")
    assert entry["state"] == "ready" and entry["on_disk"] is True
    assert entry["source"] == "file://.../m"  # a file:// source's folder: no host path
    assert entry["disk_bytes"] == (src / "m" / "2" / "model.onnx").stat().st_size
    assert entry["download_seconds"] > 0
    assert server.node.disk.holdings() == [
        {"model": "m", "version": 2, "bytes": entry["disk_bytes"],
         "download_seconds": entry["download_seconds"], "digest": None}]
    assert sources.pulls == [(str(src / "m"), 2)]
    status, _, body = infer(server, "m", 1)  # the other version: one more pull
    assert status == 200 and body["model_version"] == "1"
    assert len(sources.pulls) == 2


def http_sourced(repo: Path, name: str, server, path: str, **options) -> None:
    """A repository model pulled from ``server`` (a ``RangeServer``) at ``path``."""
    digest = hashlib.sha256((server.root / path).read_bytes()).hexdigest()
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "source": f"{server.url}/{path}{options.pop('query', '')}",
        "source_options": {"sha256": digest, **options}}))


def test_a_pull_cut_midway_leaves_nothing_loadable_and_resumes(agent, repo, src, tmp_path):
    """A real HTTP source (agent.sources) whose server cuts the transfer, then stops."""
    write_mlp(src / "m" / "model.onnx", inputs=4, hidden=256, layers=2, outputs=2)
    write_mlp(src / "n" / "model.onnx", **TINY_MLP)
    add_mlp(repo, "local")
    with range_http_server(src) as http:
        http_sourced(repo, "m", http, "m/model.onnx")
        http_sourced(repo, "n", http, "n/model.onnx")
        http.cut_after = 20_000
        server = agent(repo, real=True, load_retry_s=0.2)
        status, headers, body = infer(server, "m")
        assert status == 503 and "model m:1" in body["error"], body
        assert "Retry-After" in headers
        models = tmp_path / "data" / "models" / "m"
        assert not (models / "1").exists()  # a partial is never a version directory
        assert infer(server, "local")[0] == 200
        http.cut_after = None
        wait_for(lambda: infer(server, "m")[0] == 200, what="the resumed pull")
        assert any(s.range and not s.range.startswith("bytes=0-") for s in http.served), \
            [s.range for s in http.served]
        assert cache_entry(server, "m")["on_disk"] is True
        http.stop()  # the server down: a clear 503, the others served
        status, headers, body = infer(server, "n")
        assert status == 503 and "model n:1" in body["error"] and "Retry-After" in headers
        assert infer(server, "m")[0] == 200 and infer(server, "local")[0] == 200
        http.start()  # back on its port
        wait_for(lambda: infer(server, "n")[0] == 200, what="the pull once the server is back")


def test_sixteen_cold_requests_cause_one_download(agent, repo, src, sources):
    publish(src, "m")
    sourced(repo, "m", src)
    gate = sources.hold[str(src / "m")] = threading.Event()
    server = agent(repo)
    results = []

    def one():
        results.append(infer(server, "m")[0])

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        # the phase shows first; the download's size once the source has listed it
        seen = wait_for(lambda: (lambda e: e.get("phase") == "downloading"
                                 and e["download"]["total_bytes"] > 0 and e)(
            cache_entry(server, "m")), what="the downloading phase with its size")
        wait_for(lambda: cache_entry(server, "m")["in_flight"] == 16, what="16 waiting")
    finally:
        gate.set()
    assert seen["state"] == "loading"
    for t in threads:
        t.join(30)
    assert results == [200] * 16
    assert sources.pulls == [(str(src / "m"), 1)]
    assert server.node.disk.summary()["pulls"] == 1


def test_sixteen_cold_requests_download_once_from_a_real_http_source(agent, repo, src):
    """agent.sources' HTTP source held to ``pull_bandwidth``: the server sends the
    model's bytes once (besides each pull's one-byte size probe)."""
    write_mlp(src / "m" / "model.onnx", inputs=4, hidden=256, layers=2, outputs=2)
    size = (src / "m" / "model.onnx").stat().st_size
    with range_http_server(src) as http:
        http_sourced(repo, "m", http, "m/model.onnx")
        server = agent(repo, real=True, pull_bandwidth=size)  # about a second
        results = []
        threads = [threading.Thread(target=lambda: results.append(infer(server, "m")[0]))
                   for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [200] * 16
        bodies = [s for s in http.served if s.sent > 1]
        assert len(bodies) == 1 and bodies[0].sent == size, http.served
        assert server.node.disk.summary()["pulls"] == 1
        # held to pull_bandwidth (size bytes/s, less the cap's burst of a tenth)
        assert server.node.disk.download_seconds(("m", 1)) >= 0.7


def test_a_failed_pull_is_a_clear_503_and_others_are_served(agent, repo, src, sources):
    publish(src, "m")
    sourced(repo, "m", src)
    add_mlp(repo, "local")
    server = agent(repo, load_retry_s=0.3)
    sources.down.add(str(src / "m"))
    status, headers, body = infer(server, "m")
    assert status == 503, body
    assert "model m:1" in body["error"] and "unreachable" in body["error"]
    assert int(headers["Retry-After"]) >= 1
    assert infer(server, "local")[0] == 200
    assert cache_entry(server, "m")["state"] == "failed"
    assert not (server.node.disk.root / "m" / "1").exists()  # nothing loadable left
    sources.down.clear()
    wait_for(lambda: infer(server, "m")[0] == 200, what="the pull after the source is back")
    assert cache_entry(server, "m")["on_disk"] is True


def test_a_listing_is_kept_for_a_restart_with_the_source_down(agent, repo, src, sources,
                                                              tmp_path):
    publish(src, "m")
    sourced(repo, "m", src)
    sourced(repo, "never", src)  # never listed: its source directory does not exist
    first = agent(repo)
    assert infer(first, "m")[0] == 200
    status, headers, body = infer(first, "never")
    assert status == 503 and "never" in body["error"] and "Retry-After" in headers
    listed = {s["model"]: s for s in first.request("GET", "/v1/disk")[2]["sources"]}
    assert listed["m"]["versions"] == [1] and listed["m"]["listing_error"] is None
    assert listed["never"]["versions"] == [] and "unreachable" in listed["never"][
        "listing_error"]
    first.close()
    sources.down.add(str(src / "m"))
    second = agent(repo)
    assert cache_entry(second, "m")["versions"] == [1]
    assert "unreachable" in cache_entry(second, "m")["listing_error"]
    status, _, body = infer(second, "m")  # its files are on disk: no pull needed
    assert status == 200, body
    assert len(sources.pulls) == 1


@pytest.mark.parametrize("disk_policy,kept", [(None, "slow"), ("lru", "fast")])
def test_the_disk_budget_keeps_a_slow_download_over_a_fast_one(agent, repo, src, sources,
                                                               disk_policy, kept):
    """Two versions of one size and popularity, the slow one used least recently: the
    agent's penalty-aware policy keeps the slow download; LRU (the control) does not."""
    for name in ("fast", "slow", "third"):
        publish(src, name)
        sourced(repo, name, src)
    sources.delay[str(src / "slow")] = 0.6
    size = (src / "fast" / "1" / "model.onnx").stat().st_size
    server = agent(repo, disk_budget=2 * size + size // 2, disk_policy=disk_policy)
    for _ in range(3):
        for name in ("slow", "fast"):
            assert infer(server, name)[0] == 200
            server.request("POST", f"/v1/cache/{name}/evict")  # the disk may evict it
    assert infer(server, "third")[0] == 200
    held = {h["model"] for h in server.node.disk.holdings()}
    assert held == {kept, "third"}, held
    assert server.node.disk.summary()["evictions"] == 1


def test_a_resident_model_whose_files_were_evicted_keeps_serving(agent, repo, src, sources):
    for name in ("a", "b"):
        publish(src, name)
        sourced(repo, name, src)
    size = (src / "a" / "1" / "model.onnx").stat().st_size
    server = agent(repo, disk_budget=size + size // 2)
    assert infer(server, "a")[0] == 200
    cache = server.node.cache
    entry_a = cache.entry("a")
    before = cache.pools["cpu"].policy.penalty_of(entry_a.id)
    assert infer(server, "b")[0] == 200  # only room for one: a's files go, a stays
    a = cache_entry(server, "a")
    assert a["state"] == "ready" and a["on_disk"] is False
    after = cache.pools["cpu"].policy.penalty_of(entry_a.id)
    # (the warm run's seconds may have moved the first-run surplus by microseconds)
    assert after - before == pytest.approx(a["download_seconds"], abs=1e-4)
    assert after == pytest.approx(cache.penalty(entry_a))
    for _ in range(5):
        assert infer(server, "a")[0] == 200
    assert len(sources.pulls) == 2
    server.request("POST", "/v1/cache/a/evict")
    server.request("POST", "/v1/cache/b/evict")
    assert infer(server, "a")[0] == 200  # reloaded: its files are pulled again
    assert len(sources.pulls) == 3 and cache_entry(server, "a")["on_disk"] is True


def test_a_full_disk_is_a_507_and_resident_models_keep_serving(agent, repo, src, sources):
    """Free space injected (``disk_free``): the check before a pull reads it."""
    publish(src, "big")
    sourced(repo, "big", src)
    add_mlp(repo, "local")
    free = {"bytes": 10**9}
    server = agent(repo, disk_free=lambda path: free["bytes"])
    assert infer(server, "local")[0] == 200
    free["bytes"] = 100
    status, _, body = infer(server, "big")
    assert status == 507, body
    need = (src / "big" / "1" / "model.onnx").stat().st_size
    assert "model big:1" in body["error"] and f"({need} bytes)" in body["error"]
    assert "(100 bytes) free" in body["error"]
    assert infer(server, "local")[0] == 200
    free["bytes"] = 10**9
    assert infer(server, "big")[0] == 200  # a full disk is checked again at once


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs (root with CAP_SYS_ADMIN only; else the test skips saying so)."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_tmpfs_is_a_507_and_resident_models_keep_serving(repo, src, tmpfs):
    """A real 1 MiB file system and agent.sources' real file:// source. The tier's own
    check refuses the first pull before a byte is written; told the disk is larger
    than it is (``disk_free``), it lets the second start, and the source's disk-full
    error (the real file system's room) is the same 507."""
    for name in ("big", "bigger"):
        write_mlp(src / name / "1" / "model.onnx", inputs=4, hidden=512, layers=2, outputs=2)
        sourced(repo, name, src)
    add_mlp(repo, "local")
    lie = {"on": False}

    def disk_free(path):
        return 10**12 if lie["on"] else shutil.disk_usage(path).free

    cfg = AgentConfig(repository=repo, data_dir=tmpfs, cpu_budget=200_000_000,
                      infer_threads=2, disk_budget=100 * 2**20)
    server = AgentServer(cfg, budgets={"cpu": 200_000_000}, disk_free=disk_free)
    try:
        assert infer(server, "local")[0] == 200
        status, _, body = infer(server, "big")
        assert status == 507 and "model big:1 needs" in body["error"], body
        assert "bytes) free" in body["error"]
        lie["on"] = True
        status, _, body = infer(server, "bigger")
        assert status == 507 and "model bigger:1" in body["error"], body
        assert "disk full" in body["error"]
        assert infer(server, "local")[0] == 200
        assert not (tmpfs / "models" / "big" / "1").exists()
        assert not (tmpfs / "models" / "bigger" / "1").exists()
        assert server.node.disk.summary()["pull_failures"] == 2
    finally:
        server.close()


def test_pinned_files_are_never_evicted_for_a_pull(agent, repo, src, sources):
    for name in ("kept", "other"):
        publish(src, name)
    sourced(repo, "kept", src, pin=True)
    sourced(repo, "other", src)
    size = (src / "kept" / "1" / "model.onnx").stat().st_size
    server = agent(repo, disk_budget=size + size // 2)
    assert cache_entry(server, "kept")["state"] == "ready"  # pinned: loaded at start
    status, _, body = infer(server, "other")
    assert status == 507, body
    assert "model other:1 needs" in body["error"] and "kept:1" in body["error"]
    assert cache_entry(server, "kept")["on_disk"] is True
    assert infer(server, "kept")[0] == 200
    server.request("POST", "/v1/cache/kept/unpin")
    server.request("POST", "/v1/cache/kept/evict")
    assert infer(server, "other")[0] == 200  # unpinned and idle: now it may go
    assert [h["model"] for h in server.node.disk.holdings()] == ["other"]


def test_a_version_published_later_is_listed_at_the_next_rescan(agent, repo, src, sources):
    publish(src, "m")
    sourced(repo, "m", src)
    server = agent(repo)
    assert infer(server, "m")[2]["model_version"] == "1"
    publish(src, "m", 2, hidden=8)
    assert server.request("POST", "/v2/repository/index")[0] == 200
    wait_for(lambda: cache_entry(server, "m")["versions"] == [1, 2], what="version 2 listed")
    # version 1 serves until version 2 is pulled and loaded (the rollout), never a failure
    answers = []
    wait_for(lambda: answers.append(infer(server, "m")) or
             answers[-1][2].get("model_version") == "2", what="version 2 served")
    assert all(status == 200 for status, _, _ in answers), answers


def test_cold_start_reject_counts_the_download(agent, repo, src, sources):
    """``cold_start: reject`` expects load + first run + the download while the files
    are off disk: a request whose deadline the pull would miss is refused at once."""
    publish(src, "m")
    sourced(repo, "m", src, cold_start="reject", slo={"latency_ms": 300})
    sources.delay[str(src / "m")] = 0.6
    server = agent(repo)
    assert infer(server, "m")[0] == 200  # the first load: nothing known, served
    server.request("POST", "/v1/cache/m/evict")
    assert infer(server, "m")[0] == 200  # from disk: fast enough
    server.request("POST", "/v1/cache/m/evict")
    assert server.call(_drop(server.node.disk, "m")) == [1]
    status, headers, body = infer(server, "m")
    assert status == 503 and "Retry-After" in headers, body


def test_credentials_in_a_source_url_show_nowhere(agent, repo, src, caplog):
    """A signed URL's query string (real HTTP source) and a user:password in a URL:
    served, failed and listed, the secret shows in no answer, metric, log or file."""
    write_mlp(src / "m" / "model.onnx", **TINY_MLP)
    (repo / "userinfo").mkdir()
    (repo / "userinfo" / "config.yaml").write_text(yaml.safe_dump(
        {"source": f"https://agent:{SECRET}@127.0.0.1:1/m.onnx#sha256={'0' * 64}"}))
    caplog.set_level(logging.DEBUG)
    texts = []
    with range_http_server(src) as http:
        http_sourced(repo, "m", http, "m/model.onnx",
                     query=f"?X-Amz-Credential=agent&X-Amz-Signature={SECRET}")
        server = agent(repo, real=True, load_retry_s=0.1)
        assert infer(server, "m")[0] == 200
        server.request("POST", "/v1/cache/m/evict")
        assert server.call(_drop(server.node.disk, "m")) == [1]
        http.stop()
        status, _, failed = infer(server, "m")
        assert status == 503, failed
        texts.append(json.dumps(failed))
        status, _, bad = infer(server, "userinfo")
        assert status == 400 and "userinfo/config.yaml: source:" in bad["error"], bad
        texts.append(json.dumps(bad))
        for path in ("/v1/cache", "/v1/cache/m", "/v1/memory", "/v1/disk", "/metrics",
                     "/v2/repository/index"):
            with urllib.request.urlopen(urllib.request.Request(
                    server.url + path, method="POST" if "index" in path else "GET")) as r:
                texts.append(r.read().decode())
        assert cache_entry(server, "m")["source"] == f"{http.url}/m/model.onnx"
    texts.append(caplog.text)
    texts.append((server.node.disk.root / ".tier.json").read_text())
    for text in texts:
        assert SECRET not in text


def test_node_disk_api_ensure_holdings_pulling_drop(agent, repo, src, sources):
    publish(src, "m")
    publish(src, "m", 2)
    sourced(repo, "m", src)
    gate = sources.hold[str(src / "m")] = threading.Event()
    server = agent(repo)
    disk = server.node.disk
    future = asyncio.run_coroutine_threadsafe(disk.ensure("m", 1), server.loop)
    try:
        pulling = wait_for(lambda: server.call(_pulling(disk)), what="a pull under way")
    finally:
        gate.set()
    assert pulling[0]["model"] == "m" and pulling[0]["version"] == 1
    future.result(30)
    assert [h["version"] for h in disk.holdings()] == [1]
    assert server.call(_pulling(disk)) == []
    assert infer(server, "m", 1)[0] == 200  # resident: drop leaves it
    assert server.call(_drop(disk, "m")) == []
    server.request("POST", "/v1/cache/m/evict?version=1")
    assert server.call(_drop(disk, "m", 1)) == [1]
    assert disk.holdings() == [] and not (disk.root / "m" / "1").exists()
    assert server.call(_drop(disk, "m")) == []
    with pytest.raises(Exception, match="no source"):
        server.call(disk.ensure("nope", 1))


async def _pulling(disk):
    return disk.pulling()


async def _drop(disk, name, version=None):
    return disk.drop(name, version)


def test_source_keys_are_checked_naming_the_file_and_the_key(repo, src, sources, tmp_path):
    from agent.node.cache.disktier import DiskTier
    from agent.node.repository import scan_repository

    publish(src, "ok")
    sourced(repo, "ok", src)
    cases = {
        "scheme": {"source": f"ftp://agent:{SECRET}@host/m"},
        "options": {"source": f"file://{src}/ok", "source_options": {"nope": 1}},
        "lonely": {"source_options": {"note": "x"}},
        "nested": {"source": f"file://{src}/ok", "source_options": {"note": [1]}},
    }
    for name, config in cases.items():
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    publish(repo, "dirs")  # a version directory in the repository beside a source
    (repo / "dirs" / "config.yaml").write_text(yaml.safe_dump({"source": f"file://{src}/ok"}))
    sourced(repo, "triton", src)  # a Triton config.pbtxt beside a source applies too
    (repo / "triton" / "config.pbtxt").write_text('max_batch_size: 4\n')
    disk = DiskTier(tmp_path / "models", 10**6, open_source=sources.open_source)
    specs = scan_repository(repo, disk.listing)
    assert specs["ok"].error is None and specs["ok"].pending  # not listed yet: 503
    assert specs["triton"].error is None and specs["triton"].config.max_batch_size == 4
    assert specs["triton"].config.source == f"file://{src / 'triton'}"
    assert specs["ok"].files_root == tmp_path / "models" / "ok"
    errors = {n: specs[n].error for n in (*cases, "dirs")}
    assert errors["scheme"].endswith("scheme/config.yaml: source: scheme 'ftp' is none of "
                                     "s3, oci, https, http, file")
    assert "options/config.yaml: source: unknown source option 'nope'" in errors["options"]
    assert errors["lonely"].endswith("source_options: only allowed with source")
    assert "nested/config.yaml: source_options: note: must be a string" in errors["nested"]
    assert "dirs/config.yaml: source: a sourced model keeps no version directories" \
        in errors["dirs"]
    assert all(SECRET not in e for e in errors.values())


def test_a_sourced_synthetic_model_pulls_its_files_and_serves(agent, repo, src, sources):
    """A synthetic backend with a source (a replay's stand-in model: its download is its
    source's files, its load and size its synthetic: keys)."""
    (src / "s" / "1").mkdir(parents=True)
    (src / "s" / "1" / "padding.bin").write_bytes(b"\0" * 50_000)
    sourced(repo, "s", src, backend="synthetic",
            synthetic={"size_bytes": 2_000_000, "load_ms": 5})
    server = agent(repo)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    status, _, answer = server.request("POST", "/v2/models/s/infer", body)
    assert status == 200 and answer["outputs"][0]["data"] == [3.0], answer
    entry = cache_entry(server, "s")
    assert entry["on_disk"] is True and entry["disk_bytes"] == 50_000
    assert entry["backend"] == "synthetic" and entry["size_bytes"] == 2_000_000


def test_at_start_partials_are_kept_never_loaded_and_holdings_keep_their_seconds(
        agent, repo, src, sources, tmp_path):
    publish(src, "m")
    publish(src, "m", 2)
    sourced(repo, "m", src)
    sources.delay[str(src / "m")] = 0.2
    first = agent(repo)
    assert infer(first, "m", 1)[0] == 200
    seconds = first.node.disk.download_seconds(("m", 1))
    assert seconds >= 0.2
    first.close()
    models = tmp_path / "data" / "models"
    partial = models / "m" / ".partial-2"  # what agent.sources leaves of a cut pull
    partial.mkdir()
    (partial / "model.onnx").write_bytes(b"half a model")
    (models / ".trash-1-0").mkdir()  # an eviction's leftover
    second = agent(repo)
    disk = second.node.disk
    assert [(h["version"], h["download_seconds"]) for h in disk.holdings()] == \
        [(1, pytest.approx(seconds, abs=1e-6))]
    assert disk.pool.policy.penalty_of(("m", 1)) == pytest.approx(seconds)
    assert partial.is_dir() and not (models / ".trash-1-0").exists()
    assert cache_entry(second, "m")["on_disk"] is False  # version 2 is not on disk
    status, _, body = infer(second, "m")  # version 2: pulled, never the partial
    assert status == 200 and body["model_version"] == "2", body


def test_cache_ls_v1_disk_and_metrics_show_both_tiers(agent, repo, src, sources):
    from click.testing import CliRunner
    from prometheus_client.parser import text_string_to_metric_families

    from agent.cli import main

    publish(src, "m")
    sourced(repo, "m", src)
    add_mlp(repo, "local")
    server = agent(repo, disk_budget=1_000_000)
    assert infer(server, "m")[0] == 200 and infer(server, "local")[0] == 200
    size = (src / "m" / "1" / "model.onnx").stat().st_size
    status, _, disk = server.request("GET", "/v1/disk")
    assert status == 200 and disk["budget_bytes"] == 1_000_000
    assert disk["used_bytes"] == size and disk["pulls"] == 1 and disk["pulling"] == []
    assert disk["holdings"][0]["model"] == "m"
    result = CliRunner().invoke(main, ["cache", "ls", "--wide", "--url", server.url])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = lines[0].split()
    assert head[-4:] == ["DISK", "DL_S", "ROUTE", "FWD/ERR/FB/RCV"]  # routing: issue 34
    row = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert row["m"][head.index("DISK")] != "-" and row["local"][head.index("DISK")] == "-"
    assert lines[-1].startswith("disk tier: ") and "pulls 1" in lines[-1]
    text = server.request("GET", "/metrics")[2].decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {s.name: s.value for f in families.values() for s in f.samples
             if s.name.startswith("edgeagent_disk_") and not s.name.endswith("_created")}
    assert value["edgeagent_disk_pulls_total"] == 1
    assert value["edgeagent_disk_used_bytes"] == size
    assert value["edgeagent_disk_budget_bytes"] == 1_000_000
    disk_bytes = [s for s in families["edgeagent_model_disk_bytes"].samples]
    assert [(s.labels, s.value) for s in disk_bytes] == [({"model": "m", "version": "1"}, size)]
    assert families["edgeagent_model_download_seconds"].samples[0].value > 0


def test_the_dashboard_shows_a_download_and_the_disk_tier(agent, repo, src, sources,
                                                          tmp_path):
    from tests.browser import Browser

    binary = Browser.find()
    if binary is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium; .ci/run "
                    "installs it where apt is available)")
    publish(src, "m")
    sourced(repo, "m", src)
    gate = sources.hold[str(src / "m")] = threading.Event()
    server = agent(repo)
    state = "document.querySelector('#models tr[data-model=\"m\"] td.state')?.textContent"

    async def scenario():
        async with Browser(binary, tmp_path) as browser:
            await browser.open(server.url + "/?refresh=200")
            await browser.wait_for(state + " === 'unloaded'")
            request = threading.Thread(target=infer, args=(server, "m"))
            request.start()
            try:
                await browser.wait_for(f"({state} || '').startsWith('downloading')")
            finally:
                gate.set()
            await browser.wait_for(state + " === 'ready'")
            request.join(30)
            disk = await browser.evaluate(
                "document.querySelector('#memory [data-device=disk]').textContent")
            assert "on disk of" in disk and "1 version," in disk and "1 pull," in disk, disk
            assert [e for e in browser.errors if not e.startswith("network:")] == []

    asyncio.run(asyncio.wait_for(scenario(), 120))


async def test_a_tier_found_over_its_budget_evicts_down_to_it_at_the_next_pull(
        src, sources, tmp_path):
    """A restart with a smaller disk_budget: what is on disk is kept as found, and the
    next pull evicts (least valuable first) until it fits."""
    from agent.config import ModelConfig
    from agent.node.cache.disktier import DiskTier

    for name in ("a", "b", "c"):
        publish(src, name)
    size = (src / "a" / "1" / "model.onnx").stat().st_size
    root = tmp_path / "models"
    big = DiskTier(root, 10 * size, policy="lru", open_source=sources.open_source)
    for name in ("a", "b"):
        big.listing(name, ModelConfig(source=f"file://{src / name}"), tmp_path)
        await big.ensure(name, 1)
    await big.close()
    small = DiskTier(root, size + size // 2, policy="lru", open_source=sources.open_source)
    assert small.pool.used == 2 * size > small.pool.budget
    small.listing("c", ModelConfig(source=f"file://{src / 'c'}"), tmp_path)
    await small.ensure("c", 1)
    assert [h["model"] for h in small.holdings()] == ["c"]
    assert small.pool.used == size and small.summary()["evictions"] == 2
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == \
        ["a", "b", "c"] and not (root / "a" / "1").exists()
    await small.close()


def test_v1_disk_needs_a_read_token_where_the_agent_has_tokens(agent, repo, tmp_path):
    token = tmp_path / "admin-token"
    token.write_text("tok-0123456789abcdef0123456789abcdef")
    add_mlp(repo, "local")
    server = agent(repo, admin_token_file=token)
    assert server.request("GET", "/v1/disk")[0] == 401
    status, _, body = server.request(
        "GET", "/v1/disk", headers={"Authorization": f"Bearer {token.read_text()}"})
    assert status == 200 and body["holdings"] == [] and body["sources"] == []


def test_pulls_wait_their_turn_beyond_max_concurrent_pulls(agent, repo, src, sources):
    for name in ("a", "b"):
        publish(src, name)
        sourced(repo, name, src)
    gates = {n: sources.hold.setdefault(str(src / n), threading.Event()) for n in "ab"}
    server = agent(repo, max_concurrent_pulls=1)
    results = {}
    threads = [threading.Thread(target=lambda n=n: results.update({n: infer(server, n)[0]}))
               for n in "ab"]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(sources.pulls) == 1, what="one pull started")
        first = "a" if sources.pulls[0][0].endswith("/a") else "b"
        wait_for(lambda: all(cache_entry(server, n)["phase"] == "downloading" for n in "ab"),
                 what="both downloading")
        assert len(sources.pulls) == 1 and len(server.node.disk.pulling()) == 2
        gates[first].set()
        wait_for(lambda: len(sources.pulls) == 2, what="the second pull's turn")
    finally:
        for gate in gates.values():
            gate.set()
    for t in threads:
        t.join(30)
    assert results == {"a": 200, "b": 200}
