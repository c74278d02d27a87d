"""The dashboard pages over plain HTTP (the browser tests are in
``test_dashboard_browser.py``): served without the token, files only from the server
itself, a strict Content-Security-Policy, unknown files 404; the coordinator's API still
needs its token."""

from __future__ import annotations

import urllib.request

from tests.helpers import add_mlp


def test_page_files_stay_on_the_server(repo, start_agent):
    add_mlp(repo, "classifier")
    agent = start_agent(repo)
    status, headers, body = agent.request("GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert b"http://" not in body and b"https://" not in body  # no CDN
    for name in ("common.js", "node.js", "dashboard.css"):
        status, headers, body = agent.request("GET", f"/static/{name}")
        assert status == 200 and body and b"https://" not in body, name
    for bad in ("/static/nope.js", "/static/..%2Fdashboard.py", "/static/node.html"):
        status, _, body = agent.request("GET", bad)
        assert status == 404 and "error" in body, bad


def test_memory_endpoint_needs_a_token_and_matches_the_cache(repo, start_agent, tmp_path):
    add_mlp(repo, "classifier")
    token = tmp_path / "token"
    token.write_text("s3cret-0123456789abcdef0123456789abcdef")
    agent = start_agent(repo, admin_token_file=token)
    auth = {"Authorization": "Bearer s3cret-0123456789abcdef0123456789abcdef"}
    assert agent.request("GET", "/v1/memory")[0] == 401  # with tokens: scope read
    status, _, memory = agent.request("GET", "/v1/memory", headers=auth)
    assert status == 200 and memory["cpu"]["budget_bytes"] == 200_000_000
    assert memory["cpu"]["used_bytes"] == 0 and memory["cpu"]["waiting_loads"] == 0
    assert agent.request("POST", "/v2/repository/models/classifier/load", headers=auth)[0] == 200
    used = agent.request("GET", "/v1/memory", headers=auth)[2]["cpu"]["used_bytes"]
    info = agent.request("GET", "/v1/cache/classifier", headers=auth)[2]
    assert used == info["size_bytes"] > 0 and info["memory"]["used_bytes"] == used


def test_coordinator_page_needs_no_token_but_its_api_does(tmp_path, start_coordinator):
    token = tmp_path / "co-token"
    token.write_text("t0ken-0123456789abcdef0123456789abcdef")
    co = start_coordinator(admin_token_file=token)
    with urllib.request.urlopen(co.url + "/", timeout=10) as resp:
        assert resp.status == 200 and b"coordinator" in resp.read()
    assert co.request("GET", "/v1/nodes")[0] == 401
    assert co.request("GET", "/v1/nodes", token="t0ken-0123456789abcdef0123456789abcdef")[0] == 200
