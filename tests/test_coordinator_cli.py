"""``edgeagent coordinator``: the catalog, nodes and plan commands against a real server,
and ``serve`` refusing a bad config."""

from __future__ import annotations

import json

from click.testing import CliRunner

from agent.cli import main
from tests.helpers import REPORT


def run(*args, env=None):
    result = CliRunner().invoke(main, ["coordinator", *args], env=env,
                                catch_exceptions=False)
    return result.exit_code, result.output


def test_models_set_ls_rm(start_coordinator):
    co = start_coordinator()
    code, out = run("models", "set", "resnet", "--slo-ms", "150", "--percentile", "99.9",
                    "--priority", "2", "--url", co.url)
    assert code == 0 and "resnet: SLO 150 ms at p99.9, priority 2" in out
    code, out = run("models", "set", "bert", "--slo-ms", "400", "--proc-ms", "40",
                    "--cpu-per-replica", "2", "--json", "--url", co.url)
    assert code == 0 and json.loads(out)["cpu_per_replica"] == 2
    code, out = run("models", "ls", "--url", co.url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["NAME", "SLO_MS", "PCTL"]
    assert [line.split()[0] for line in lines[1:]] == ["bert", "resnet"]
    code, out = run("models", "ls", "--json", env={"EDGEAGENT_COORDINATOR_URL": co.url})
    assert code == 0 and {m["name"]: m["slo_ms"] for m in json.loads(out)} == \
        {"bert": 400, "resnet": 150}
    assert run("models", "rm", "bert", "--url", co.url) == (0, "removed bert\n")
    code, out = run("models", "rm", "bert", "--url", co.url)
    assert code == 1 and "404: model 'bert' is not in the catalog" in out


def test_errors_are_readable(start_coordinator, tmp_path):
    co = start_coordinator()
    code, out = run("models", "set", "a", "--slo-ms", "-5", "--url", co.url)
    assert code == 1 and "400: field 'slo_ms' must be a number > 0" in out
    code, out = run("plan", "--url", co.url)
    assert code == 1 and "404: no plan yet" in out
    code, out = run("models", "ls", "--url", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach the coordinator" in out
    bad = tmp_path / "c.yaml"
    bad.write_text("objective: best\n")
    code, out = run("serve", "--config", str(bad))
    assert code == 1 and "objective: must be one of" in out


def test_nodes_and_plan(start_coordinator, tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-0123456789abcdef0123456789abcdef\n")
    co = start_coordinator(admin_token_file=token)
    code, out = run("models", "ls", "--url", co.url)
    assert code == 1 and "401" in out
    auth = ["--url", co.url, "--token-file", str(token)]
    assert co.request("POST", "/v1/nodes/n1/report", REPORT, token="tok-0123456789abcdef0123456789abcdef")[0] == 200
    run("models", "set", "a", "--slo-ms", "100", *auth)
    code, out = run("nodes", *auth)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["n1", "yes"]
    code, out = run("plan", "--now", *auth)
    assert code == 0 and out.startswith("plan 1 (manual") and "n1=" in out
    code, out = run("plan", "--json", *auth)
    assert code == 0 and json.loads(out)["id"] == 1
