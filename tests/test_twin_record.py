"""The node's record for its twin: the request ring and the measured profiles over HTTP
(admin only, in the simulator's own formats), ``edgeagent cache trace`` and the what-if
``edgeagent simulate --from URL|DIR``, with bad input refused by name."""

from __future__ import annotations

import asyncio
import csv
import json
import time

import aiohttp
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from agent.security.authconfig import AgentAuthSettings
from agent.config import AgentConfig
from agent.cli import main
from agent.security.credentials import new_token, token_hash
from agent.node.record import ENTRY_BYTES, RequestRecord
from cachepolicies.traces import read_profiles, read_trace
from tests.helpers import BODY, TINY_MLP, AgentServer, add_mlp, add_synthetic, v2_body
from tests.standin_source import StandinSources

ADMIN, READ = new_token(), new_token()
ROW = v2_body([1.0, 2.0, 3.0, 4.0])  # one row for TINY_MLP


@pytest.fixture
def recorded(repo, start_agent, tmp_path):
    """An agent (admin and read tokens) that served 30 requests over three synthetic
    models under a budget for two of them; (agent, admin token file)."""
    for name, size, load in (("a", 10_000_000, 40), ("b", 20_000_000, 60),
                             ("c", 15_000_000, 50)):
        add_synthetic(repo, name, size_bytes=size, load_ms=load, base_ms=5, per_item_ms=1)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([
        {"name": "ops", "sha256": token_hash(ADMIN), "scopes": ["admin"]},
        {"name": "dash", "sha256": token_hash(READ), "scopes": ["read"]}]))
    agent = start_agent(repo, budget=36_000_000, policy="lru",
                        auth=AgentAuthSettings(token_file=tokens, protect=()))  # open inference

    async def send():
        async with aiohttp.ClientSession() as session:
            for i in range(30):
                model = "abcab"[i % 5]
                async with session.post(f"{agent.url}/v2/models/{model}/infer",
                                        json=BODY) as r:
                    assert r.status == 200
    asyncio.run(send())
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN)
    return agent, admin_file


def get(agent, path, token=ADMIN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _, body = agent.request("GET", path, headers=headers)
    return status, body.decode() if isinstance(body, bytes) else body


def test_trace_and_profiles_are_admin_only_in_the_simulators_formats(recorded, tmp_path):
    agent, _ = recorded
    for path in ("/v1/trace", "/v1/profiles"):
        assert get(agent, path, None)[0] == 401
        assert get(agent, path, READ)[0] == 403  # the node's traffic: admin only
    assert get(agent, "/v1/whatif", None)[0] == 401
    status, curve = get(agent, "/v1/whatif", READ)  # the dashboard's curve: read
    assert status == 200 and curve["requests"] == 30 and curve["policy"] == "lru"
    status, trace_text = get(agent, "/v1/trace")
    assert status == 200
    status, profiles_text = get(agent, "/v1/profiles")
    assert status == 200
    (tmp_path / "t.csv").write_text(trace_text)
    (tmp_path / "p.csv").write_text(profiles_text)
    profiles = read_profiles(tmp_path / "p.csv")  # the simulator's own readers
    trace = read_trace(tmp_path / "t.csv", profiles)
    assert len(trace) == 30 and sorted(profiles.names) == ["a:1", "b:1", "c:1"]
    names = [profiles.names[i] for i in trace.model_ids[:5]]
    assert names == ["a:1", "b:1", "c:1", "a:1", "b:1"]  # arrival order
    assert trace.timestamps[0] == 0 and np.all(np.diff(trace.timestamps) >= 0)
    b = profiles.index["b:1"]
    assert profiles.size_bytes[b] == 20_000_000
    assert 0.05 <= profiles.load_seconds[b] < 0.5  # its 60 ms load, measured
    assert 0.004 <= profiles.exec_seconds[b] < 0.1  # its 5 ms + 1 ms a row batch
    # the time its loads held their slot (their mean): the load and the hand-offs
    assert 0.06 <= profiles.load_slot_seconds[b] < 1.0
    rows = trace_text.splitlines()
    assert rows[0].split(",") == ["timestamp", "model", "rows", "status",
                                  "latency_seconds", "unix_time"]
    assert all(line.split(",")[3] == "200" for line in rows[1:])
    metrics = agent.request("GET", "/metrics")[2].decode()
    assert "edgeagent_record_requests 30.0" in metrics
    assert f"edgeagent_record_bytes {100_000 * 22:.1f}" in metrics or \
        "edgeagent_record_bytes 2.2e+06" in metrics


def test_since_keeps_the_later_requests_and_refuses_the_future(recorded):
    agent, _ = recorded
    trace_text = get(agent, "/v1/trace")[1]
    times = [float(line.split(",")[5]) for line in trace_text.splitlines()[1:]]
    later = get(agent, f"/v1/trace?since={times[20]!r}")[1].splitlines()[1:]
    assert len(later) == 10
    status, body = get(agent, f"/v1/trace?since={time.time() + 3600}")
    assert status == 400 and "in the future" in body["error"]
    for bad in ("yesterday", "nan", "inf"):
        status, body = get(agent, f"/v1/trace?since={bad}")
        assert status == 400 and "since must be Unix seconds" in body["error"], bad


def test_the_ring_keeps_the_last_requests_within_its_bytes():
    clock = iter(range(100)).__next__
    record = RequestRecord(5, wall_clock=lambda: float(clock()))
    for i in range(8):
        record.add(f"m{i % 2}:1", i + 1, 200, 0.0)
    kept = record.since(0)
    assert len(record) == 5 and record.added == 8
    assert kept.rows.tolist() == [4, 5, 6, 7, 8]  # the oldest overwritten first
    assert record.nbytes == 5 * ENTRY_BYTES
    assert sum(a.itemsize * len(a) for a in (record._arrival, record._latency,
                                             record._model, record._rows,
                                             record._status)) == record.nbytes
    from agent.config import AgentConfig
    from agent.schema import settings
    help = settings(AgentConfig)["record_requests"].help
    assert f"{ENTRY_BYTES} bytes a request" in help  # the documented cap is the ring's
    empty = RequestRecord(0)
    empty.add("m:1", 1, 200, 0.1)
    assert len(empty) == 0 and empty.since(0).to_csv().count("\n") == 1


def test_cache_trace_then_simulate_from_the_directory(recorded, tmp_path):
    agent, admin_file = recorded
    out = tmp_path / "record"
    saved = CliRunner().invoke(main, ["cache", "--url", agent.url, "--token-file",
                                      str(admin_file), "trace", "--out", str(out)])
    assert saved.exit_code == 0, saved.output
    assert "30 requests, 3 model profiles" in saved.output
    result = CliRunner().invoke(main, [
        "simulate", "--from", str(out), "--capacity", "36MB,60MB", "--policy", "lru",
        "--policy", "cremebrulee", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["policy"], r["capacity_bytes"]) for r in rows] == [
        ("lru", 36_000_000), ("lru", 60_000_000), ("cremebrulee", 36_000_000),
        ("cremebrulee", 60_000_000)]
    listing = get(agent, "/v1/cache")[1]
    live_loads = sum(m["loads"] for m in listing)
    # the agent ran lru, whose choices depend on the order of requests only, and they
    # came one by one: the same loads (cremebrulee's rates would see the recorded
    # arrival times, a little earlier than the cache's own)
    assert rows[0]["misses"] == live_loads
    assert rows[1]["misses"] == 3  # 60 MB holds all three: cold misses only
    assert rows[0]["load_concurrency"] == 1 and "p95_response_seconds" in rows[0]
    # the node's settings travel in its profiles: a node with 2 load slots is replayed so
    with open(out / "profiles.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {row["load_concurrency"] for row in table} == {"1"}
    with open(out / "profiles.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows({**row, "load_concurrency": "2"} for row in table)
    two = CliRunner().invoke(main, ["simulate", "--from", str(out), "--capacity", "60MB",
                                    "--policy", "lru", "--json", "--no-progress"])
    assert json.loads(two.stdout)[0]["load_concurrency"] == 2


def test_simulate_from_a_url_plots_the_curve(recorded, tmp_path):
    agent, admin_file = recorded
    plot = tmp_path / "curve.png"
    result = CliRunner().invoke(main, [
        "simulate", "--from", agent.url, "--token-file", str(admin_file),
        "--capacity", "36MB,45MB,60MB", "--policy", "lru", "--plot", str(plot),
        "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "p95_resp_s" in result.stdout and "slo_viol" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_what_if_input_is_named(recorded, tmp_path):
    agent, admin_file = recorded
    out = tmp_path / "record"
    CliRunner().invoke(main, ["cache", "--url", agent.url, "--token-file", str(admin_file),
                              "trace", "--out", str(out)])
    small = CliRunner().invoke(main, ["simulate", "--from", str(out), "--capacity", "15MB",
                                      "--policy", "lru"])
    assert small.exit_code != 0 and "'b:1' needs 20000000 bytes" in small.output
    (out / "profiles.csv").unlink()
    missing = CliRunner().invoke(main, ["simulate", "--from", str(out), "--capacity",
                                        "60MB", "--policy", "lru"])
    assert missing.exit_code != 0 and "has no profiles.csv" in missing.output
    nowhere = CliRunner().invoke(main, ["simulate", "--from", str(tmp_path / "none"),
                                        "--capacity", "60MB", "--policy", "lru"])
    assert nowhere.exit_code != 0 and "neither an http(s) URL nor a directory" in \
        nowhere.output
    denied = CliRunner().invoke(main, ["simulate", "--from", agent.url, "--capacity", "60MB",
                                       "--policy", "lru"], env={"EDGEAGENT_TOKEN": READ})
    assert denied.exit_code != 0 and "403" in denied.output
    future = CliRunner().invoke(main, ["cache", "--url", agent.url, "--token-file",
                                       str(admin_file), "trace", "--out", str(out),
                                       "--since", str(time.time() + 3600)])
    assert future.exit_code != 0 and "in the future" in future.output


def test_a_node_with_sources_is_replayed_with_its_pulls(repo, tmp_path):
    """A node with sourced models exports each one's measured download and bytes on
    disk (0 for a model in its repository), so ``simulate --from URL --disk-capacity``
    replays the disk tier; three models asked at once of an agent with one pull slot
    download one after the other, and the twin on the node's record predicts their
    response (with three pull slots it predicts far less); a disk below the largest
    model is named."""
    from agent.modelzoo import write_mlp

    src, sources = tmp_path / "source", StandinSources()
    names = {"p": 64, "q": 16, "r": 32}  # hidden units: their files' sizes differ
    for name, hidden in names.items():
        write_mlp(src / name / "1" / "model.onnx", **{**TINY_MLP, "hidden": hidden})
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(yaml.safe_dump(
            {"source": f"file://{src / name}"}))
        sources.delay[str(src / name)] = 0.4
    add_mlp(repo, "local")
    budget = 200_000_000
    agent = AgentServer(AgentConfig(repository=repo, data_dir=tmp_path / "data",
                                    cpu_budget=budget, infer_threads=2,
                                    max_concurrent_pulls=1),
                        budgets={"cpu": budget}, open_source=sources.open_source)
    try:
        async def send(models):
            async with aiohttp.ClientSession() as session:
                async def one(model):
                    started = time.perf_counter()
                    async with session.post(f"{agent.url}/v2/models/{model}/infer",
                                            json=ROW) as r:
                        assert r.status == 200, await r.text()
                    return time.perf_counter() - started
                return await asyncio.gather(*(one(m) for m in models))
        at_once = asyncio.run(send(list(names)))  # one after the other: ~0.4, 0.8, 1.2 s
        later = [asyncio.run(send([m]))[0] for m in ("local", "p")]
        live = float(np.mean(at_once + later))
        assert sorted(at_once)[-1] >= 1.1

        profiles_text = agent.request("GET", "/v1/profiles")[2]
        (tmp_path / "p.csv").write_bytes(profiles_text)
        profiles = read_profiles(tmp_path / "p.csv")
        for name in names:
            i = profiles.index[f"{name}:1"]
            assert profiles.disk_bytes[i] == (src / name / "1" / "model.onnx").stat().st_size
            assert 0.4 <= profiles.download_seconds[i] < 5  # its slow pull, measured
        local = profiles.index["local:1"]
        assert profiles.download_seconds[local] == 0 and profiles.disk_bytes[local] == 0

        def twin(memory: str, disk: int, *flags: str) -> dict:
            run = CliRunner().invoke(main, [
                "simulate", "--from", agent.url, "--capacity", memory, "--policy", "lru",
                "--disk-capacity", str(disk), "--json", "--no-progress", *flags])
            assert run.exit_code == 0, run.output
            row = json.loads(run.stdout)[0]
            assert row["failed"] == 0
            return row
        # all in memory and on disk: three pulls, taking turns for the one pull slot
        roomy = twin("200MB", budget)
        assert roomy["downloads"] == 3
        assert roomy["mean_response_seconds"] == pytest.approx(live, rel=0.25)
        assert twin("200MB", budget, "--max-concurrent-pulls", "3")[
            "mean_response_seconds"] < 0.75 * live
        # memory for one model: p loads again at the end, from disk where its files are
        # still there; on a disk for the largest model only, q's pull evicted them
        one = str(int(profiles.size_bytes.max()))
        largest = int(profiles.disk_bytes.max())
        assert twin(one, int(profiles.disk_bytes.sum()))["downloads"] == 3
        tight = twin(one, largest)
        assert tight["downloads"] == 4
        assert tight["download_delay_seconds"] >= 4 * 0.4
        small = CliRunner().invoke(main, [
            "simulate", "--from", agent.url, "--capacity", "200MB", "--policy", "lru",
            "--disk-capacity", str(largest - 1), "--no-progress"])
        assert small.exit_code != 0 and "'p:1' needs" in small.output \
            and "disk capacity" in small.output
    finally:
        agent.close()


def test_simulate_from_skips_requests_of_models_that_never_loaded(repo, start_agent):
    """One request to a model that never loaded (bad ONNX: no profile) does not break the
    window: its requests are left out and counted, as the dashboard's what-if does; no
    message names a temporary file the user never made."""
    add_mlp(repo, "good")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a protobuf")
    agent = start_agent(repo)
    for name in ("good", "broken", "good", "broken", "good"):
        agent.request("POST", f"/v2/models/{name}/infer", ROW)
    result = CliRunner().invoke(main, ["simulate", "--from", agent.url, "--capacity", "64MB",
                                       "--policy", "lru", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["requests"] == 3
    assert result.stderr == ("skipped 2 of 5 request(s): broken:1 never loaded on the node "
                             "(no profile to replay them with)\n"), result.stderr
    assert "/tmp" not in result.output


def test_a_record_with_no_replayable_request_is_refused_by_name(repo, start_agent,
                                                                  tmp_path):
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a protobuf")
    add_mlp(repo, "good")
    agent = start_agent(repo)
    agent.request("POST", "/v2/models/good/infer", ROW)
    agent.request("POST", "/v2/models/broken/infer", ROW)
    out = tmp_path / "record"
    CliRunner().invoke(main, ["cache", "--url", agent.url, "trace", "--out", str(out)])
    lines = (out / "trace.csv").read_text().splitlines()
    (out / "trace.csv").write_text("\n".join([lines[0]] + [
        line for line in lines[1:] if "broken" in line]) + "\n")
    result = CliRunner().invoke(main, ["simulate", "--from", str(out), "--capacity", "64MB",
                                       "--policy", "lru"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {out / 'trace.csv'}: no request names a model in the profiles "
        f"({out / 'profiles.csv'}): all 1 are of broken:1"), result.output
