"""The Dockerfiles (the agent's, ./Dockerfile; the coordinator's, Dockerfile.coordinator):
read as text everywhere (non-root user, the command as entrypoint, volumes, a
HEALTHCHECK, a build context of only what the image needs, the agent image with the
default install only, no ``--insecure`` default); built, run and their package lists read
only where a docker daemon answers.

No docker engine runs here, so each image's ENTRYPOINT and HEALTHCHECK, read from its
Dockerfile, are run as the image would run them (``python`` this interpreter, the port
the OS's): without a token they refuse to start and say how to give one; with a token
file (named by a variable, or in the mounted secrets' folder, with TLS) they serve and
require it."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from agent.container import Refused, command
from tests.containers import ROOT, Running, as_here, exec_form, instructions, process_env, status
from tests.helpers import HEAVY, add_mlp, issue_cert, make_ca, reserved_port, wait_for

ENTRY = '["python", "-m", "agent.container", '
#: file -> (entrypoint's start, its volumes, health path, port, what pip installs)
IMAGES = {
    "Dockerfile": (ENTRY + '"serve"', ("/models", "/var/lib/edgeagent"),
                   "/v2/health/ready", 8000, "."),
    "Dockerfile.coordinator": (ENTRY + '"coordinator", "serve"',
                               ("/var/lib/edgeagent-coordinator",), "/v1/health", 8100,
                               '".[coordinator,postgres]"'),
}
TOKEN = "container-token-0123456789abcdef0123456789"


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_dockerfile_shape(dockerfile):
    entry_start, volumes_wanted, health_path, port, installed = IMAGES[dockerfile]
    ins = instructions(dockerfile)
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
    # no default that serves the admin API to whoever reaches the port
    assert "--insecure" not in (ROOT / dockerfile).read_text().split("ENTRYPOINT", 1)[1]
    assert "CMD" not in kinds


def test_the_agent_image_installs_the_agent_alone():
    """No extra (the simulator, the coordinator, TensorFlow) in the agent's image, and
    nothing there for numba to cache."""
    (run,) = [v for k, v in instructions("Dockerfile") if k == "RUN" and "pip install" in v]
    assert "[" not in run.split("pip install", 1)[1].split("&&")[0]
    assert "NUMBA" not in (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_dockerignore_lets_in_what_the_copies_need(dockerfile):
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().split()
               if line.startswith("!")}
    for kind, value in instructions(dockerfile):
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
def test_image_builds_gets_healthy_and_holds_its_packages(dockerfile, tmp_path):
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
        token = tmp_path / "admin-token"
        token.write_text(TOKEN)
        subprocess.run(["docker", "run", "-d", "--name", name, "-p", f"127.0.0.1::{port}",
                        "-v", f"{token}:/run/secrets/edgeagent/admin-token:ro", tag],
                       check=True, timeout=60)
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


# -- the entrypoint and HEALTHCHECK, run here as the image runs them ----------------------


def _container_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """The process environment inside the image: the state folders under tmp_path, the
    secrets' folder tmp_path/secrets."""
    return process_env(EDGEAGENT_SECRETS_DIR=str(tmp_path / "secrets"),
                       EDGEAGENT_DATA_DIR=str(tmp_path / "data"),
                       EDGEAGENT_COORDINATOR_DIR=str(tmp_path / "coordinator"), **env)


class Container(Running):
    """An image's ENTRYPOINT (and ``args``) in its own process, until ``stop``."""

    def __init__(self, dockerfile: str, env: dict[str, str], *args: str) -> None:
        self.dockerfile = dockerfile
        super().__init__(as_here(exec_form(dockerfile, "ENTRYPOINT")) + list(args), env,
                         Path(env["EDGEAGENT_SECRETS_DIR"]).parent / f"{dockerfile}.log")

    def healthcheck(self, env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(as_here(exec_form(self.dockerfile, "HEALTHCHECK"), self.port),
                              env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_the_image_refuses_to_start_without_a_token_and_says_how_to_give_one(dockerfile,
                                                                            tmp_path):
    env = _container_env(tmp_path)
    (tmp_path / "secrets").mkdir()
    done = subprocess.run(as_here(exec_form(dockerfile, "ENTRYPOINT")), env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    said = done.stderr
    assert "refusing to start: no admin token" in said, said
    for hint in (f"{tmp_path / 'secrets'}/admin-token", "EDGEAGENT_ADMIN_TOKEN_FILE",
                 "tls.crt and tls.key", "--config FILE", "add --insecure"):
        assert hint in said, (hint, said)
    assert "Traceback" not in said and done.stdout == ""


def _serves_and_requires_the_token(box: Container, env: dict[str, str], url: str,
                                   health: str, guarded: str, context=None) -> None:
    """``box`` answers ``health`` and its HEALTHCHECK, ``guarded`` with the token only;
    then it stops cleanly on SIGTERM."""
    try:
        wait_for(lambda: status(url + health, context=context) == 200, 60, health)
        assert box.healthcheck(env).returncode == 0
        assert status(url + guarded, context=context) == 401
        assert status(url + guarded, TOKEN, context) == 200
    finally:
        assert box.stop() == 0


def test_the_agent_image_serves_with_a_token_file_named_by_a_variable(tmp_path):
    repo = tmp_path / "models"
    add_mlp(repo, "m")
    token = tmp_path / "admin-token"
    token.write_text(TOKEN + "\n")
    env = _container_env(tmp_path, EDGEAGENT_ADMIN_TOKEN_FILE=str(token))
    box = Container("Dockerfile", env, "--repository", str(repo), "--grpc-port", "0")
    _serves_and_requires_the_token(box, env, f"http://127.0.0.1:{box.port}",
                                   "/v2/health/ready", "/v1/cache")
    said = box.log.read_text()
    assert f"admin token from {token}; serving plain HTTP" in said, said


def test_the_agent_image_serves_https_with_the_mounted_secret(tmp_path):
    """A Kubernetes TLS Secret's tls.crt and tls.key and the admin token in the secrets'
    folder: HTTPS only, the HEALTHCHECK still answers (over HTTPS)."""
    repo = tmp_path / "models"
    add_mlp(repo, "m")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    ca = make_ca(tmp_path)
    leaf = issue_cert(ca, tmp_path, "agent")
    shutil.copyfile(leaf.cert_file, secrets / "tls.crt")
    shutil.copyfile(leaf.key_file, secrets / "tls.key")
    (secrets / "admin-token").write_text(TOKEN)
    env = _container_env(tmp_path)
    box = Container("Dockerfile", env, "--repository", str(repo), "--grpc-port", "0")
    with pytest.raises(OSError):  # listening (it said so), and no plain HTTP beside it
        status(f"http://127.0.0.1:{box.port}/v2/health/ready")
    _serves_and_requires_the_token(box, env, f"https://127.0.0.1:{box.port}",
                                   "/v2/health/ready", "/v1/cache",
                                   ssl.create_default_context(cafile=str(ca.cert_file)))
    assert f"admin token from {secrets / 'admin-token'}; serving HTTPS" in box.log.read_text()


def test_the_coordinator_image_serves_with_a_token_file(tmp_path):
    token = tmp_path / "admin-token"
    token.write_text(TOKEN)
    env = _container_env(tmp_path, EDGEAGENT_ADMIN_TOKEN_FILE=str(token))
    box = Container("Dockerfile.coordinator", env)
    _serves_and_requires_the_token(box, env, f"http://127.0.0.1:{box.port}", "/v1/health",
                                   "/v1/nodes")
    assert (tmp_path / "coordinator").is_dir()  # its state where the image keeps it


def test_the_healthcheck_fails_where_nothing_answers(tmp_path):
    env = _container_env(tmp_path)
    with reserved_port() as port:
        done = subprocess.run(as_here(exec_form("Dockerfile", "HEALTHCHECK"), port),
                              env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "/v2/health/ready" in done.stderr, done


SERVE = ["serve", "--host", "0.0.0.0", "--port", "8000"]


def test_what_the_entrypoint_runs(tmp_path):
    """The argv it hands over: the user's --insecure or --config unchanged; otherwise a
    config of its own naming the files found, inserted after ``serve``."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    env = {"EDGEAGENT_SECRETS_DIR": str(secrets)}
    assert command([*SERVE, "--insecure"], env) == (["edgeagent", *SERVE, "--insecure"],
                                                    None)
    assert command(["coordinator", *SERVE, "--config", "/etc/c.yaml"], env)[0] == \
        ["edgeagent", "coordinator", *SERVE, "--config", "/etc/c.yaml"]
    (secrets / "admin-token").write_text(TOKEN)
    argv, line = command(["coordinator", *SERVE, "--log-level", "debug"], env, tmp_path)
    assert argv == ["edgeagent", "coordinator", "serve", "--config",
                    str(tmp_path / "container.yaml"), "--host", "0.0.0.0", "--port", "8000",
                    "--log-level", "debug"]
    assert json.loads((tmp_path / "container.yaml").read_text()) == {
        "admin_token_file": str(secrets / "admin-token"), "insecure": True}
    assert "plain HTTP" in line
    (secrets / "tls.crt").write_text("x")
    (secrets / "tls.key").write_text("x")
    command(SERVE, env, tmp_path)
    assert json.loads((tmp_path / "container.yaml").read_text()) == {
        "admin_token_file": str(secrets / "admin-token"),
        "tls": {"cert_file": str(secrets / "tls.crt"), "key_file": str(secrets / "tls.key")}}


@pytest.mark.parametrize("env, args, said", [
    ({"EDGEAGENT_ADMIN_TOKEN_FILE": "/nowhere/token"}, SERVE,
     "EDGEAGENT_ADMIN_TOKEN_FILE names /nowhere/token: no such file"),
    ({"EDGEAGENT_TLS_CERT_FILE": "{tmp}/token"}, SERVE,
     "TLS needs the certificate and its key, only {tmp}/token is given"),
    ({"EDGEAGENT_ADMIN_TOKEN_FILE": "{tmp}/token"}, [*SERVE, "--config", "/etc/a.yaml"],
     "EDGEAGENT_ADMIN_TOKEN_FILE given with --config: name the files in the config"),
    ({"EDGEAGENT_TLS_CERT_FILE": "{tmp}/token", "EDGEAGENT_TLS_KEY_FILE": "{tmp}/token"},
     SERVE, "TLS files but no admin token"),
])
def test_the_entrypoint_refuses_what_would_not_be_what_was_meant(env, args, said, tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    with pytest.raises(Refused, match=re.escape(said.format(tmp=tmp_path))):
        command(args, {**env, "EDGEAGENT_SECRETS_DIR": str(tmp_path / "none")}, tmp_path)
