"""Strangers cannot pin the agent's memory: a malformed body leaves nothing behind,
even with the garbage collector off (a real ``edgeagent serve`` process, its RSS and
its decoding child's read with psutil)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import psutil
import pytest

from tests.helpers import Agent, add_mlp

MiB = 2**20
BODY = 40 * MiB
MAX_REQUEST = 48 * MiB


def post(url: str, body: bytes, timeout: float = 120) -> int:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def padded(doc: dict, size: int) -> bytes:
    """``doc`` as JSON followed by spaces up to ``size`` bytes (still valid JSON)."""
    text = json.dumps(doc).encode()
    return text + b" " * (size - len(text))


def rss(process: psutil.Process) -> int:
    return process.memory_info().rss


def decoding_child(agent: Agent) -> psutil.Process:
    """The agent's decoding child process (not multiprocessing's resource tracker)."""
    children = [c for c in psutil.Process(agent.proc.pid).children()
                if "resource_tracker" not in " ".join(c.cmdline())]
    assert len(children) == 1, [c.cmdline() for c in children]
    return children[0]


def malformed_bodies() -> list[tuple[str, bytes]]:
    """(path, body) of 40 MiB: broken JSON, numbers that do not fit the shape, a
    binary header past the body, broken JSON for TF Serving."""
    numbers = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": ['
    numbers += b"1.5," * ((BODY - len(numbers) - 8) // 4) + b"1.5]}]}"
    return [("/v2/models/m/infer", b'{"inputs": [' + b"x" * (BODY - 12)),
            ("/v2/models/m/infer", numbers),
            ("/v1/models/m:predict", b'{"instances": [' + b"[1, 2, 3, 4" * (BODY // 11)),
            ("/v2/models/m/infer", padded({"inputs": 7}, BODY))]


def test_malformed_bodies_leave_nothing_behind_with_the_collector_off(repo, tmp_path):
    add_mlp(repo, "m")
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"max_request_size": MAX_REQUEST}))
    agent = Agent(repo, tmp_path / "data", "--config", str(config),
                  before="import gc; gc.disable()")
    try:
        process = psutil.Process(agent.proc.pid)
        # a well-formed body large enough for the decoding child starts it
        good = padded({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]}, 5 * MiB)
        assert post(agent.url + "/v2/models/m/infer", good) == 200
        child = decoding_child(agent)
        idle_agent, idle_child = rss(process), rss(child)
        bodies = malformed_bodies()
        for i in range(20):
            path, body = bodies[i % len(bodies)]
            assert post(agent.url + path, body) in (400, 413), path
            grown = rss(child) - idle_child
            assert grown <= 100 * MiB, f"body {i} ({path}) left the child {grown / MiB:.0f} MiB up"
        grown = rss(process) - idle_agent
        assert grown <= 1.5 * MAX_REQUEST, (
            f"20 malformed bodies of {BODY / MiB:.0f} MiB raised the agent's RSS by "
            f"{grown / MiB:.0f} MiB")
    finally:
        agent.stop()
