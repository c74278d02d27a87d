"""`edgeagent cache ...` against a real running agent."""

import json

from click.testing import CliRunner

from agent.cli import main
from tests.helpers import add_synthetic


def test_cache_cli(repo, start_agent, tmp_path):
    add_synthetic(repo, "alpha", size_bytes=3_000_000)
    add_synthetic(repo, "beta")
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef")
    agent = start_agent(repo, admin_token_file=token)
    run = CliRunner().invoke
    base = ["cache", "--token-file", str(token)]
    assert run(main, base + ["pin", "alpha", "--url", agent.url]).exit_code == 0
    agent.request("POST", "/v2/models/alpha/infer", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1]}]},
        {"Authorization": f"Bearer {token.read_text()}"})
    result = run(main, base + ["ls", "--wide", "--url", agent.url])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["NAME", "VER", "STATE", "SIZE"]
    alpha = next(line for line in lines if line.startswith("alpha")).split()
    assert alpha[2] == "ready" and alpha[3] == "2.9MiB" and "yes" in alpha
    result = run(main, base + ["--json", "ls", "--url", agent.url])
    assert {m["name"] for m in json.loads(result.output)} == {"alpha", "beta"}
    result = run(main, base + ["inspect", "alpha", "--url", agent.url, "--json"])
    assert json.loads(result.output)["misses"] == 1
    result = run(main, base + ["evict", "alpha", "--url", agent.url])
    assert result.exit_code == 1 and "409" in result.output and "pinned" in result.output
    run(main, base + ["unpin", "alpha", "--url", agent.url])
    result = run(main, base + ["evict", "alpha", "--url", agent.url])
    assert result.exit_code == 0 and "unloaded" in result.output
    result = run(main, ["cache", "ls", "--url", agent.url])  # no token
    assert result.exit_code == 1 and "401" in result.output
    result = run(main, ["cache", "ls", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach" in result.output


def test_cache_options_follow_the_subcommand(repo, start_agent, tmp_path, monkeypatch):
    """``--token-file``, ``--url`` and ``--json`` work after the subcommand, as users
    type them, and override the group's."""
    monkeypatch.delenv("EDGEAGENT_TOKEN", raising=False)
    add_synthetic(repo, "alpha")
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    agent = start_agent(repo, admin_token_file=token)
    run = CliRunner().invoke
    result = run(main, ["cache", "ls", "--token-file", str(token), "--url", agent.url,
                        "--json"])
    assert result.exit_code == 0, result.output
    assert [m["name"] for m in json.loads(result.output)] == ["alpha"]
    result = run(main, ["cache", "--token-file", str(wrong), "ls", "--url", agent.url])
    assert result.exit_code == 1 and "40" in result.output
    result = run(main, ["cache", "--token-file", str(wrong), "pin", "alpha", "--url",
                        agent.url, "--token-file", str(token)])
    assert result.exit_code == 0, result.output
    result = run(main, ["cache", "--url", "http://127.0.0.1:9", "unpin", "alpha",
                        "--token-file", str(token), "--url", agent.url])
    assert result.exit_code == 0, result.output
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args in (["cache", "--token-file", str(empty), "ls"], ["cache", "ls", "--token-file",
                                                              str(empty)]):
        result = run(main, args + ["--url", agent.url])  # not an empty bearer token
        assert result.exit_code == 2 and "is empty" in result.output, result.output
