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


def test_rollout_commands(start_coordinator, tmp_path):
    """``rollout start|status|pause|resume|abort|clear`` against a real coordinator (the
    waves themselves: tests/test_rollout_*.py)."""
    from agent.coordinator.catalog import ModelSLO
    from agent.coordinator.rollout import RolloutSettings, new_rollout

    co = start_coordinator()
    url = ["--url", co.url]
    code, out = run("rollout", "start", "m", "--version", "2", *url)
    assert code == 1 and "404: model 'm' is not in the catalog" in out
    assert run("models", "set", "m", "--slo-ms", "100", "--source", f"file://{tmp_path}",
               "--version", "1", *url)[0] == 0
    # no node runs it: the rollout is over as it starts
    code, out = run("rollout", "start", "m", "--version", "2", "--waves", "1,50%",
                    "--bake-s", "5", "--gate", "min_requests=5", *url)
    assert code == 0 and out.startswith("rollout 1 of m: version 1 -> 2, completed"), out
    code, out = run("rollout", "start", "m", "--version", "3", "--gate", "colour=1", *url)
    assert code == 1 and "400: field rollout.gates.colour: unknown key" in out
    code, out = run("rollout", "status", "1", "--json", *url)
    assert code == 0 and json.loads(out)["settings"]["waves"] == [1, "50%"]
    code, out = run("rollout", "pause", "1", *url)
    assert code == 1 and "409: rollout 1 is completed" in out
    store = co.co.store  # one under way, over nodes that have not reported yet
    store.start_rollout(lambda i: new_rollout(i, "m", (2, None), (3, None),
                                              RolloutSettings(), ["a", "b"], {}, 99.0, 1.0),
                        ModelSLO("m", slo_ms=100, source=f"file://{tmp_path}", version=3), 1.0)
    code, out = run("rollout", "status", "--active", *url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "MODEL", "FROM", "TO", "STATE", "WAVE",
                                              "PHASE", "REASON"]
    assert lines[1].split()[:7] == ["2", "m", "2", "3", "running", "1/2", "switching"]
    assert "paused" in run("rollout", "pause", "2", *url)[1]
    assert "running" in run("rollout", "resume", "2", *url)[1]
    code, out = run("rollout", "abort", "2", *url)
    assert code == 0 and "aborted: aborted by an operator" in out
    code, out = run("rollout", "clear", "m", "3", *url)
    assert code == 1 and "404: version 3 of 'm' is not marked bad" in out
