"""The Dockerfiles (the agent's, ./Dockerfile; the coordinator's, Dockerfile.coordinator):
read as text everywhere (non-root user, the command as entrypoint, volumes, a
HEALTHCHECK, a build context of only what the image needs, the agent image with the
default install only); built, run and their package lists read only where a docker
daemon answers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.helpers import HEAVY

ROOT = Path(__file__).resolve().parent.parent
#: file -> (entrypoint's start, its volumes, health path, port, what pip installs)
IMAGES = {
    "Dockerfile": ('["edgeagent", "serve"', ("/models", "/var/lib/edgeagent"),
                   "/v2/health/ready", 8000, "."),
    "Dockerfile.coordinator": ('["edgeagent", "coordinator", "serve"',
                               ("/var/lib/edgeagent-coordinator",), "/v1/health", 8100,
                               '".[coordinator,postgres]"'),
}


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_dockerfile_shape(dockerfile):
    entry_start, volumes_wanted, health_path, port, installed = IMAGES[dockerfile]
    ins = _instructions(dockerfile)
    kinds = [k for k, _ in ins]
    assert ins[0][0] == "FROM" and "-slim" in ins[0][1]
    user = [v for k, v in ins if k == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    (entry,) = [v for k, v in ins if k == "ENTRYPOINT"]
    assert entry.startswith(entry_start)
    (volumes,) = [v for k, v in ins if k == "VOLUME"]
    assert all(v in volumes for v in volumes_wanted)
    (health,) = [v for k, v in ins if k == "HEALTHCHECK"]
    assert f"127.0.0.1:{port}{health_path}" in health
    assert str(port) in [v for k, v in ins if k == "EXPOSE"][0].split()
    (run,) = [v for k, v in ins if k == "RUN" and "pip install" in v]
    assert run.split("pip install", 1)[1].split()[0] == installed


def test_the_agent_image_installs_the_agent_alone():
    """No extra (the simulator, the coordinator, TensorFlow) in the agent's image, and
    nothing there for numba to cache."""
    (run,) = [v for k, v in _instructions("Dockerfile") if k == "RUN" and "pip install" in v]
    assert "[" not in run.split("pip install", 1)[1].split("&&")[0]
    assert "NUMBA" not in (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_dockerignore_lets_in_what_the_copies_need(dockerfile):
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().split()
               if line.startswith("!")}
    for kind, value in _instructions(dockerfile):
        if kind == "COPY":
            source = value.split()[0]
            assert source.rstrip("/") in allowed, source


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _docker_daemon(), reason="no docker daemon")
@pytest.mark.parametrize("dockerfile", IMAGES)
def test_image_builds_gets_healthy_and_holds_its_packages(dockerfile):
    _, _, health_path, port, _ = IMAGES[dockerfile]
    tag = f"edgeagent-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-f", str(ROOT / dockerfile), "-t", tag, str(ROOT)],
                   check=True, timeout=1800)
    name = f"{tag}-run"
    try:
        listed = subprocess.run(["docker", "run", "--rm", "--entrypoint", "pip", tag, "list",
                                 "--format", "json"], capture_output=True, text=True,
                                check=True, timeout=300).stdout
        installed = {re.sub(r"[-_.]+", "_", p["name"].lower()) for p in json.loads(listed)}
        heavy = {{"sklearn": "scikit_learn"}.get(m, m) for m in HEAVY}
        if dockerfile == "Dockerfile":
            assert not installed & heavy, installed & heavy
        else:
            assert {"numba", "scipy", "scikit_learn", "psycopg"} <= installed
        subprocess.run(["docker", "run", "-d", "--name", name, "-p", f"127.0.0.1::{port}",
                        tag], check=True, timeout=60)
        host_port = subprocess.run(["docker", "port", name, str(port)], capture_output=True,
                                   text=True, check=True).stdout.split(":")[-1].strip()
        end = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{host_port}{health_path}",
                                       timeout=5).read()
                break
            except OSError:
                assert time.time() < end, "the container never got ready"
                time.sleep(2)
        user = subprocess.run(["docker", "exec", name, "id", "-u"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert user != "0"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
