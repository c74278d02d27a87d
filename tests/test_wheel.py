"""The wheel works on a fresh machine (issue 28): ``make dist``'s sdist and wheel hold the
package data, and the wheel installed into a new venv, with no checkout on the path,
serves the demo, holds none of the packages the default install leaves out, and answers
``edgeagent simulate --help`` with the one-line hint for the sim extra.

Slow (a build, then pip installs the agent's dependencies from its cache or index).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers import HEAVY, ROOT, ask_the_demo

pytestmark = pytest.mark.slow

#: Package data the agent reads at run time, as paths inside the wheel.
PACKAGE_DATA = ("agent/http/static/node.html", "agent/http/static/node.js", "agent/http/static/dashboard.css",
                "agent/node/protos/grpc_predict_v2_pb2.py",
                "agent/node/protos/grpc_predict_v2.proto",
                "agent/backends/tfserving_pb/tensorflow_serving_pb2.py",
                "cachepolicies/data/cremebrulee-profiles.csv")


def _clean_env() -> dict[str, str]:
    """This environment without the checkout: no PYTHONPATH, no venv of the tests."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "EDGEAGENT_JIT")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(sys.prefix))
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``make dist``, as the docs run it, into a scratch folder; it says what it built in
    a few lines (the build's own line per file goes to its log)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "dist", f"DIST={out / 'dist'}",
                           f"DIST_LOG={out / 'dist.log'}"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = (done.stdout + done.stderr).splitlines()
    assert len(said) <= 4 and "edgeagent-0.1.0-py3-none-any.whl" in said, said
    assert (out / "dist.log").stat().st_size > 0
    return out / "dist"


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (its dependencies from pip's cache, or its
    index where the cache lacks one)."""
    path = tmp_path_factory.mktemp("lean") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(path)], check=True, timeout=300, env=_clean_env())
    (wheel,) = dist.glob("edgeagent-*.whl")
    done = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=1200,
                          env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def test_sdist_and_wheel_hold_the_package_data(dist):
    (sdist,) = dist.glob("edgeagent-*.tar.gz")
    (wheel,) = dist.glob("edgeagent-*.whl")
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    for name in PACKAGE_DATA:
        assert name in in_sdist, name
        assert name in in_wheel, name
    assert not any(name.startswith("tests/") for name in in_wheel)


def test_the_wheel_installs_the_agent_alone(venv):
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format",
                           "json"], capture_output=True, text=True, check=True,
                          env=_clean_env())
    installed = {re.sub(r"[-_.]+", "_", p["name"].lower()) for p in json.loads(done.stdout)}
    heavy = {{"sklearn": "scikit_learn"}.get(m, m) for m in HEAVY}
    assert "edgeagent" in installed and "onnxruntime" in installed
    assert not installed & heavy, installed & heavy
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import agent; print(agent.__file__)"], capture_output=True,
                           text=True, check=True, env=_clean_env(), cwd=venv).stdout
    assert where.startswith(str(venv)), where


def test_a_command_of_an_extra_gives_the_hint(venv):
    done = subprocess.run([str(venv / "bin" / "edgeagent"), "simulate", "--help"],
                          capture_output=True, text=True, env=_clean_env(), cwd=venv,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    # the venv's own interpreter, and the extra's requirements (not edgeagent[sim])
    hint = done.stderr.strip().partition("not installed): ")[2]
    python, _, named = hint.partition(" -m pip install ")
    assert (venv / python).absolute() == venv / "bin" / "python", hint  # cwd: the venv
    assert named.startswith("'numba"), hint
    assert "edgeagent" not in named, hint


def test_the_wheel_serves_the_demo(venv, tmp_path):
    answer, page, status, err = ask_the_demo(str(venv / "bin" / "edgeagent"),
                                             tmp_path / "data", _clean_env(), cwd=tmp_path)
    assert answer["label"] in (0, 1, 2)
    assert b"<html" in page.lower()  # the packaged dashboard
    assert status == 0, err[-3000:]
