"""`edgeagent serve` as a real process: signals, warm restart, sd_notify."""

import json
import signal
import socket
import subprocess
import threading
import urllib.request

import pytest

from tests.helpers import EDGEAGENT, Agent, add_mlp, add_synthetic


def test_sighup_rescan_picks_up_a_new_model(repo, tmp_path):
    add_synthetic(repo, "first")
    agent = Agent(repo, tmp_path / "data")
    try:
        assert set(agent.states()) == {"first"}
        add_mlp(repo, "second")
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "second" in agent.states())
        assert agent.get("/v2/repository/models/second/load", "POST") == {}
        assert agent.states()["second"] == "ready"
    finally:
        assert agent.stop() == 0


def test_restart_restores_the_resident_set_most_popular_first(repo, tmp_path):
    for name in ("a", "b", "c"):
        add_mlp(repo, name, seed=ord(name))
    body = json.dumps({"instances": [[1, 2, 3, 4]]}).encode()

    def predict(agent, name):
        req = urllib.request.Request(f"{agent.url}/v1/models/{name}:predict", data=body)
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    agent = Agent(repo, tmp_path / "data")
    predict(agent, "a")
    for _ in range(5):
        predict(agent, "b")
    assert agent.stop() == 0
    saved = json.loads((tmp_path / "data" / "resident.json").read_text())
    assert [r["name"] for r in saved["resident"]] in (["a", "b"], ["b", "a"])

    agent = Agent(repo, tmp_path / "data")
    try:
        agent.wait_for(lambda: agent.states() == {"a": "ready", "b": "ready", "c": "unloaded"})
        log = "".join(agent.err)
        assert log.index("warm start: loaded b:1") < log.index("warm start: loaded a:1")
    finally:
        assert agent.stop() == 0


def test_sigterm_drains_requests_in_flight(repo, tmp_path):
    add_synthetic(repo, "slow", base_ms=1500)
    agent = Agent(repo, tmp_path / "data")
    result = {}

    def call():
        req = urllib.request.Request(
            f"{agent.url}/v2/models/slow/infer",
            data=json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                                         "data": [1, 2]}]}).encode())
        with urllib.request.urlopen(req, timeout=20) as r:
            result["status"], result["body"] = r.status, json.loads(r.read())

    t = threading.Thread(target=call)
    t.start()
    agent.wait_for(lambda: agent.get("/v1/cache/slow")["in_flight"] == 1)
    agent.proc.send_signal(signal.SIGTERM)
    t.join(20)
    assert agent.proc.wait(20) == 0
    assert result["status"] == 200 and result["body"]["outputs"][0]["data"] == [3.0]
    with pytest.raises(OSError):  # no longer accepting
        urllib.request.urlopen(agent.url + "/v2/health/live", timeout=2)


def test_sd_notify_ready_and_watchdog(repo, tmp_path):
    add_synthetic(repo, "s")
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    agent = Agent(repo, tmp_path / "data",
                  env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    try:
        messages = []
        while not any("WATCHDOG=1" in m for m in messages) or len(messages) < 3:
            messages.append(sock.recv(4096).decode())
        assert "READY=1" in messages[0]
        assert sum("WATCHDOG=1" in m for m in messages) >= 2
    finally:
        assert agent.stop() == 0
        sock.close()


def test_bad_config_is_reported_not_served(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("prot: 8000\n")
    run = subprocess.run([EDGEAGENT, "serve", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode != 0 and f"{cfg}: prot: unknown key" in run.stderr
    run = subprocess.run([EDGEAGENT, "serve", "--cpu-budget", "lots"], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode != 0 and "bad size 'lots'" in run.stderr
