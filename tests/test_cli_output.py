"""Output for people (issue 38): tables that fit the terminal (``--wide``: every column),
``-`` for what is not known (an unloaded model's size and load time), human sizes and
local times, ISO 8601 times in JSON, a newline at the end of every JSON answer, a model
the repository cannot serve listed as ``invalid`` with why (its files named relative to
the repository; the log says it once), the port-in-use hint, and a line when numba
compiles (timed apart from the work)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.commands.output import table
from tests.helpers import EDGEAGENT, add_app, add_mlp, add_synthetic, node_report

WIDE_HEAD = ["NAME", "VER", "STATE", "SIZE", "LOAD_S", "HITS", "MISSES", "EVICT", "RATE/S",
             "UTILITY", "PINNED", "INFLIGHT", "BATCH", "QUEUE", "WAIT", "P99_MS", "DISK",
             "DL_S", "ROUTE", "FWD/ERR/FB/RCV"]


def _cli(*args: str, columns: int = 100) -> str:
    done = CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)})
    assert done.exit_code == 0, done.output
    return done.output


def _broken_repo(repo):
    """Models the repository cannot serve, of each kind that used to vanish: a synthetic
    one, a selection app and a sourced one with a bad config.yaml; and one that serves."""
    add_mlp(repo, "fine")
    add_synthetic(repo, "synth", bogus=1)
    add_app(repo, "app", ["fine"], polcy="exp3")
    (repo / "pulled").mkdir()
    (repo / "pulled" / "config.yaml").write_text(yaml.safe_dump(
        {"source": "file:///nowhere/pulled", "versoin": 2}))


def test_cache_ls_fits_the_terminal_and_says_dash_for_unknown(repo, start_agent):
    add_mlp(repo, "never-loaded")
    add_mlp(repo, "served")
    agent = start_agent(repo)
    assert agent.request("POST", "/v2/models/served/infer", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})[0] == 200
    for columns in (60, 80, 100):
        lines = _cli("cache", "ls", "--url", agent.url, columns=columns).splitlines()
        table_lines = lines[:lines.index("") if "" in lines else -1]
        assert all(len(line) <= columns for line in table_lines), (columns, lines)
        assert lines[0].split()[:4] == ["NAME", "VER", "STATE", "SIZE"]
    wide = _cli("cache", "ls", "--wide", "--url", agent.url, columns=60).splitlines()
    head = wide[0].split()
    assert head == WIDE_HEAD
    rows = {line.split()[0]: line.split() for line in wide[1:] if line.split()
            and line.split()[0] in ("never-loaded", "served")}
    never, served = rows["never-loaded"], rows["served"]
    assert never[head.index("SIZE")] == "-" and never[head.index("LOAD_S")] == "-"
    assert never[head.index("P99_MS")] == "-"
    assert re.fullmatch(r"[\d.]+[KM]iB", served[head.index("SIZE")]), served
    assert float(served[head.index("LOAD_S")]) > 0
    assert "0B" not in " ".join(never) and "0.000" not in " ".join(never)


def test_cache_inspect_reads_as_words_and_its_json_gives_iso_times(repo, start_agent):
    add_mlp(repo, "m")
    agent = start_agent(repo)
    agent.request("POST", "/v2/models/m/infer", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    text = _cli("cache", "inspect", "m", "--url", agent.url)
    fields = dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) > 1)
    assert "None" not in text and "True" not in text and "False" not in text
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", fields["last_used"].strip())
    assert re.fullmatch(r"[\d.]+[KM]iB", fields["size_bytes"].strip())
    assert fields["error"].strip() == "-"
    doc = json.loads(_cli("cache", "inspect", "m", "--url", agent.url, "--json"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["last_used"])


def test_models_the_repository_cannot_serve_are_listed_invalid_with_why(
        repo, start_agent, caplog):
    _broken_repo(repo)
    caplog.set_level(logging.INFO, "edgeagent.node")
    agent = start_agent(repo)
    said = {r.getMessage() for r in caplog.records if "is invalid" in r.getMessage()}
    assert said == {
        "model synth is invalid: synth/config.yaml: bogus: unknown key (none of the 21 "
        "keys here is close; `edgeagent config example` lists them)",
        "model app is invalid: app/config.yaml: selection.polcy: unknown key (did you "
        "mean policy?)",
        "model pulled is invalid: pulled/config.yaml: versoin: unknown key (did you mean "
        "version?)"}, said
    caplog.clear()
    status, _, index = agent.request("POST", "/v2/repository/index")
    assert status == 200
    agent.request("POST", "/v2/repository/index")  # a rescan: logged once, not again
    assert not [r for r in caplog.records if "is invalid" in r.getMessage()]
    reasons = {item["name"]: (item["state"], item.get("reason", "")) for item in index}
    for name in ("synth", "app", "pulled"):
        state, reason = reasons[name]
        assert state == "UNAVAILABLE" and reason.startswith(f"invalid: {name}/config.yaml"), \
            reasons
    assert reasons["fine"][0] in ("READY", "UNAVAILABLE") and not reasons["fine"][1]
    rows = {m["name"]: m for m in agent.request("GET", "/v1/cache")[2]}
    assert {n: rows[n]["state"] for n in ("synth", "app", "pulled")} == dict.fromkeys(
        ("synth", "app", "pulled"), "invalid")
    assert rows["app"]["error"].startswith("app/config.yaml: selection.polcy")
    text = _cli("cache", "ls", "--url", agent.url)
    listed = {line.split()[0]: line.split()[2] for line in text.splitlines()[1:]
              if len(line.split()) > 2 and not line.startswith(" ")}
    assert {n: listed[n] for n in ("synth", "app", "pulled")} == dict.fromkeys(
        ("synth", "app", "pulled"), "invalid")
    why = text[text.index("not serving:"):]
    assert "  app: app/config.yaml: selection.polcy: unknown key (did you mean policy?)" \
        in why
    assert str(repo) not in text
    # repaired, it is served again (and the log says so)
    add_synthetic(repo, "synth")
    agent.request("POST", "/v2/repository/index")
    assert any(r.getMessage() == "model synth is valid again" for r in caplog.records)
    assert {m["name"]: m["state"] for m in agent.request("GET", "/v1/cache")[2]}[
        "synth"] == "unloaded"


def _raw(url: str, method: str = "GET", body: bytes | None = None) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method),
                                    timeout=30) as resp:
            return resp.read()
    except urllib.error.HTTPError as err:
        return err.read()


def test_every_json_answer_ends_with_a_newline(repo, start_agent, start_coordinator):
    add_mlp(repo, "m")
    agent = start_agent(repo)
    row = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                  "data": [1, 2, 3, 4]}]}).encode()
    answers = {
        "v2": _raw(agent.url + "/v2"),
        "health": _raw(agent.url + "/v2/health/ready"),
        "cache": _raw(agent.url + "/v1/cache"),
        "infer": _raw(agent.url + "/v2/models/m/infer", "POST", row),
        "tf predict": _raw(agent.url + "/v1/models/m:predict", "POST",
                           b'{"instances": [[1, 2, 3, 4]]}'),
        "404": _raw(agent.url + "/v2/models/nope/infer", "POST", row),
        "400": _raw(agent.url + "/v2/models/m/infer", "POST", b"{"),
        "route": _raw(agent.url + "/nowhere"),
    }
    co = start_coordinator()
    answers |= {"co health": _raw(co.url + "/v1/health"),
                "co report": _raw(co.url + "/v1/nodes/edge-1/report", "POST",
                                  json.dumps(node_report({})).encode()),
                "co nodes": _raw(co.url + "/v1/nodes"),
                "co 404": _raw(co.url + "/v1/plan")}
    for what, body in answers.items():
        json.loads(body)
        assert body.endswith(b"\n") and not body.endswith(b"\n\n"), (what, body[-40:])


def test_coordinator_nodes_gives_sizes_and_ages_for_people(start_coordinator):
    co = start_coordinator()
    report = node_report({}, memory=128_000_000)
    assert co.request("POST", "/v1/nodes/edge-1/report", report)[0] == 200
    text = _cli("coordinator", "nodes", "--url", co.url)
    head, row = text.splitlines()[:2]
    assert head.split()[:5] == ["NAME", "ALIVE", "LAST_REPORT", "CORES", "CPU_MEM"]
    assert re.fullmatch(r"edge-1\s+yes\s+\d+s ago\s+4\s+122\.1MiB\s+0\s+-\s+-", row), row
    assert "e+" not in text
    doc = json.loads(_cli("coordinator", "nodes", "--url", co.url, "--json"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc[0]["last_seen"])


def test_a_port_in_use_says_who_to_ask_and_how_to_choose_another(repo, tmp_path):
    add_synthetic(repo, "m")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = CliRunner().invoke(main, ["serve", "--repository", str(repo), "--port",
                                         str(port), "--grpc-port", "0", "--data-dir",
                                         str(tmp_path / "data")])
    assert done.exit_code == 1
    said = done.output.strip().splitlines()[-1]
    assert said == (f"Error: port {port} on 127.0.0.1 is in use: another process listens "
                    f"there (`ss -ltnp 'sport = :{port}'` names it); stop it, or choose "
                    "another port with --port (make run: PORT=8010 GRPC_PORT=8011)"), said


def test_the_table_keeps_the_columns_that_matter_when_narrow():
    rows = [["a-long-model-name", "1", "ready", "12.0MiB", "3", "0.125"]]
    head = ["NAME", "VER", "STATE", "SIZE", "HITS", "LOAD_S"]
    text = table(head, rows, drop_order=["LOAD_S", "HITS", "SIZE"], width=40)
    assert text.splitlines()[0].split() == ["NAME", "VER", "STATE", "SIZE"]
    assert table(head, rows, drop_order=["LOAD_S"], width=10, wide=True).splitlines()[
        0].split() == head


def test_numba_compilation_is_said_and_timed_apart(capsys):
    pytest.importorskip("numba")
    from numba import njit

    from agent.commands.progress import Compilation

    @njit(cache=False)
    def fresh(x):  # compiled here, for the first time
        return x * 2 + 1

    compilation = Compilation("compiling ...")
    with compilation.watching():
        assert fresh(3) == 7
    assert capsys.readouterr().err == "compiling ...\n" and compilation.seconds > 0
    again = Compilation("compiling ...")
    with again.watching():
        assert fresh(4) == 9  # compiled already: nothing said, nothing counted
    assert capsys.readouterr().err == "" and again.seconds == 0


@pytest.mark.slow
def test_the_first_plan_allocate_says_it_compiles_and_times_it_apart(tmp_path):
    """A fresh numba cache (a new box): the planner's kernels compile, which is said at
    once on stderr and reported beside the solver's own time; the next run loads them."""
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps({"capacity": {"cpu": 8, "memory_bytes": 2**33},
                                   "models": [{"name": "a", "rate": 40.0, "proc_ms": 150,
                                               "slo_ms": 600}]}))
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [subprocess.run([EDGEAGENT, "plan", "allocate", "--problem", str(problem),
                            "--json"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **env})
            for _ in range(2)]
    first, second = (json.loads(r.stdout) for r in runs)
    assert runs[0].stderr.startswith("compiling the planner's kernels"), runs[0].stderr
    assert first["compile_seconds"] > 1 and first["solve_seconds"] < first["compile_seconds"]
    assert "compiling" not in runs[1].stderr and second["compile_seconds"] == 0


def test_work_past_its_bound_says_what_it_does_and_quick_work_says_nothing(capsys):
    import time

    from agent.commands.progress import after

    with after("simulating ...", seconds=0.05):
        time.sleep(0.3)
    with after("never said", seconds=5):
        pass
    assert capsys.readouterr() == ("", "simulating ...\n")
