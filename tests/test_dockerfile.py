"""The Dockerfile: read as text everywhere (non-root user, the agent as entrypoint,
volumes, a HEALTHCHECK on readiness, a build context of only what the image needs);
built and run only where a docker daemon answers."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_shape():
    ins = _instructions()
    kinds = [k for k, _ in ins]
    assert ins[0][0] == "FROM" and "-slim" in ins[0][1]
    user = [v for k, v in ins if k == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    (entry,) = [v for k, v in ins if k == "ENTRYPOINT"]
    assert entry.startswith('["edgeagent", "serve"')
    (volumes,) = [v for k, v in ins if k == "VOLUME"]
    assert "/models" in volumes and "/var/lib/edgeagent" in volumes
    (health,) = [v for k, v in ins if k == "HEALTHCHECK"]
    assert "/v2/health/ready" in health
    assert "tensorflow" not in DOCKERFILE.split("pip install", 1)[1].split("\n", 1)[0]


def test_dockerignore_lets_in_what_the_copies_need():
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().split()
               if line.startswith("!")}
    for kind, value in _instructions():
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
def test_image_builds_and_gets_healthy():
    tag = f"edgeagent-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=1800)
    name = f"{tag}-run"
    try:
        subprocess.run(["docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8000", tag],
                       check=True, timeout=60)
        port = subprocess.run(["docker", "port", name, "8000"], capture_output=True,
                              text=True, check=True).stdout.split(":")[-1].strip()
        end = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
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
