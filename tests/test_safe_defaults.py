"""Safe defaults: the agent, the coordinator and its report workers answer a request
that carries no credential only where it names them (Host, and Origin when sent): a
web page that rebinds its own name to their address gets 403 (DNS rebinding), with or
without tokens configured. The systemd units take secrets as credentials and are
confined."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from agent.security.httpauth import names_this_server, own_names
from tests.helpers import REPORT, add_mlp


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:8000", True), ("[::1]:8000", True), ("10.1.2.3", True),
    ("localhost:8000", True), ("LOCALHOST.", True), ("app.localhost:80", True),
    ("edge-1.example.net:8000", True), ("evil.example:8000", False),
    ("localhost.evil.example", False), ("", False), (None, False), ("[::1", False)])
def test_names_this_server(host, ok):
    assert names_this_server(host, own_names("127.0.0.1", ["edge-1.example.net"])) is ok


def test_the_agent_without_a_token_answers_only_its_own_names(repo, start_agent, tmp_path):
    add_mlp(repo, "m")
    agent = start_agent(repo, allowed_hosts=("edge-1.example.net",))
    port = agent.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"edge-1.example.net:{port}"):
        assert agent.request("GET", "/v1/cache", headers={"Host": host})[0] == 200, host
    status, _, doc = agent.request("GET", "/v1/cache", headers={"Host": f"evil.example:{port}"})
    assert status == 403 and "evil.example" in doc["error"] and "allowed_hosts" in doc["error"]
    status, _, doc = agent.request("POST", "/v1/cache/m/unload",
                                   headers={"Origin": "http://evil.example:8000"})
    assert status == 403 and "Origin" in doc["error"] and "evil.example" in doc["error"]
    assert agent.request("GET", "/v2/health/live",
                         headers={"Origin": f"http://localhost:{port}"})[0] == 200


def test_the_agent_with_a_token_checks_the_host_of_requests_without_one(repo, start_agent,
                                                                       tmp_path):
    """A rebinding page knows no token: without one its Host is refused as without
    tokens; a made-up token is judged (401), a valid one may use any name (a proxy's)."""
    token_file = tmp_path / "token"
    token_file.write_text("t" * 40)
    agent = start_agent(repo, admin_token_file=token_file)
    evil = {"Host": "evil.example"}
    assert agent.request("GET", "/v2/health/live", headers=evil)[0] == 403
    assert agent.request("GET", "/v1/cache", headers=evil)[0] == 403
    assert agent.request("GET", "/v2/health/live",
                         headers={**evil, "Authorization": f"Bearer {'x' * 40}"})[0] == 401
    assert agent.request("GET", "/v1/cache",
                         headers={**evil, "Authorization": f"Bearer {'t' * 40}"})[0] == 200


def _post(url: str, path: str, body: dict, host: str) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Host": host})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_coordinator_without_a_token_answers_only_its_own_names(start_coordinator):
    co = start_coordinator()
    port = co.url.rsplit(":", 1)[1]
    assert _post(co.url, "/v1/nodes/edge-1/report", REPORT, f"localhost:{port}")[0] == 200
    status, doc = _post(co.url, "/v1/nodes/edge-2/report", REPORT, f"evil.example:{port}")
    assert status == 403 and "evil.example" in doc["error"]
    assert [n["name"] for n in co.request("GET", "/v1/nodes")[1]] == ["edge-1"]
