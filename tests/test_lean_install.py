"""The default install is the node agent (pyproject's dependencies; ``make run``): no
TensorFlow, nothing of the sim and coordinator extras. The agent's commands and the demo
work without them; a command that needs an extra says which in one line.

The test venv has everything (the test extra), so each child process gets a
``sitecustomize`` that makes the left-out packages unimportable and reports every
attempt on stderr (``tests.helpers.without_packages``). test_wheel.py installs the
real wheel into a fresh venv.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from agent.commands import EXTRA_MODULES
from tests.helpers import (EDGEAGENT, HEAVY, TINY_MLP, add_mlp, ask_the_demo,
                           without_packages)

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_default_dependencies_have_no_tensorflow():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = " ".join(project["dependencies"]).lower()
    assert "tensorflow" not in names
    # The TF Serving backend has its own protos: its extra needs no TensorFlow either;
    # the tests' stand-in server does.
    assert "tensorflow" not in " ".join(project["optional-dependencies"]["tfserving"])
    assert "tensorflow" in " ".join(project["optional-dependencies"]["test"])


def test_serve_onnx_without_tensorflow(repo, tmp_path):
    add_mlp(repo, "mlp")
    env = without_packages(tmp_path / "site", ("tensorflow", "tensorflow_serving"))
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository", str(repo),
         "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "data"),
         "--cpu-budget", "200MB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        url = line.split()[3]
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, TINY_MLP["inputs"]],
                            "data": [0.5] * TINY_MLP["inputs"]}]}
        req = urllib.request.Request(f"{url}/v2/models/mlp/infer",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        end = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = json.loads(resp.read())
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.1)
        assert answer["outputs"][0]["shape"] == [1, TINY_MLP["outputs"]]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "BLOCKED" not in err, err[-3000:]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def _modules(distributions: set[str]) -> set[str]:
    return {{"scikit-learn": "sklearn"}.get(d, d).replace("-", "_") for d in distributions}


def test_default_install_leaves_the_heavy_packages_out():
    assert not _modules(_requirement_names(PROJECT["dependencies"])) & set(HEAVY)
    extras = PROJECT["optional-dependencies"]
    assert "pandas" not in _requirement_names(sum(extras.values(), []))  # one CSV engine
    tested = " ".join(extras["test"])
    assert all("edgeagent[sim,coordinator,postgres]" in text
               for text in (tested, " ".join(extras["all"])))


def test_each_commands_extra_is_pyprojects():
    """``EXTRA_MODULES`` (what the hint checks) is each extra's list in pyproject.toml."""
    extras = PROJECT["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        assert _modules(_requirement_names(extras[extra])) == set(modules), extra


def _edgeagent(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EDGEAGENT, *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("args, extra", [
    (["simulate", "--help"], "sim"), (["simulate", "--demo"], "sim"),
    (["workload", "synthetic", "--functions", "3"], "sim"), (["workload", "--help"], "sim"),
    (["plan", "latency", "--proc-ms", "5"], "coordinator"), (["plan", "--help"], "coordinator"),
    (["coordinator", "serve", "--help"], "coordinator"),
])
def test_a_command_without_its_extra_says_which_in_one_line(tmp_path, args, extra):
    done = _edgeagent(without_packages(tmp_path / "site", EXTRA_MODULES[extra][-1:]), *args)
    assert done.returncode == 1, done.stdout + done.stderr
    (said,) = [line for line in done.stderr.splitlines() if not line.startswith("BLOCKED")]
    # the interpreter that ran the command, and the extra's own requirements (never
    # 'edgeagent[...]', which pip would fetch from an index in place of this checkout)
    head, _, named = said.partition(" -m pip install ")
    python = head.rpartition(": ")[2]
    shebang = Path(EDGEAGENT).read_text().splitlines()[0].removeprefix("#!")
    assert Path(python).resolve() == Path(shebang).resolve(), said
    assert "edgeagent" not in named, said
    assert {_modules({re.split(r"[<>=\[]", r.strip("'"))[0]}).pop()
            for r in named.split()} == set(EXTRA_MODULES[extra]), said
    assert done.stdout == ""


def test_the_agents_commands_need_no_extra(tmp_path, repo):
    """serve, cache, profile, config and the coordinator's client commands, with every
    left-out package blocked: each runs, none tries to import one."""
    add_mlp(repo, "mlp")
    env = without_packages(tmp_path / "site")
    for args in (["--help"], ["serve", "--help"], ["cache", "--help"],
                 ["config", "example", "agent"], ["coordinator", "nodes", "--help"],
                 ["profile", "measure", "--runs", "2", str(repo)]):
        done = _edgeagent(env, *args)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert "BLOCKED" not in done.stderr, (args, done.stderr[-2000:])
    assert done.stdout.splitlines()[0].startswith("model,size_bytes")  # the profiles CSV
    assert done.stdout.splitlines()[1].startswith("mlp,")


def test_demo_is_written_and_served_without_the_extras(tmp_path):
    """``make run``'s path on the default install: no repository, so the agent writes
    the demo (no onnx, no skl2onnx) and answers the classifier."""
    answer, _, status, err = ask_the_demo(EDGEAGENT, tmp_path / "data",
                                          without_packages(tmp_path / "site"))
    assert answer["label"] in (0, 1, 2)
    assert abs(sum(answer["probabilities"]) - 1) < 1e-5
    assert status == 0 and "BLOCKED" not in err, err[-3000:]
