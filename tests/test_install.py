"""The edge-box install in five commands (docs/operations.md#install) leaves a unit that
starts (issue 38). systemd cannot run here, so the test plays the box: a scratch folder
stands for its root (``/etc``, ``/opt``, ``/var``, ``/run``, ``/tmp`` under it), the
checkout's venv for ``/opt/edgeagent/.venv`` (tests/test_wheel.py installs the real wheel
in a fresh venv), and the commands run as the page gives them, ``ssh box`` and ``sudo``
taken off. Then the unit runs as systemd would start it: its ``StateDirectory=`` folders
made and ``$STATE_DIRECTORY`` set, each ``LoadCredential=`` file copied into
``$CREDENTIALS_DIRECTORY`` (a missing one fails the start, as systemd's 243/CREDENTIALS
does), its ``Environment=``, ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC``, and its
``ExecStart`` with ``${CREDENTIALS_DIRECTORY}`` expanded. The installed agent must say
READY=1, serve, and want the admin token the install made for its admin API."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import add_mlp, reserved_port

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "operations.md"
#: The box's folders the commands and the unit name, each under the scratch root.
_BOX_PATH = re.compile(r"(?<![\w.}])/(etc|opt|var|run|tmp)/")


def install_commands() -> list[str]:
    """The ``sh`` block of docs/operations.md's Install section, one command a line."""
    section = OPERATIONS.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [line for line in block.splitlines() if line.strip()]


def on_box(text: str, root: Path) -> str:
    """``text`` with the box's absolute paths under ``root``."""
    return _BOX_PATH.sub(lambda m: f"{root}/{m.group(1)}/", text)


def remote(command: str) -> str:
    """The command ``ssh box '...'`` runs, without ``sudo``."""
    words = shlex.split(command)
    assert words[:2] == ["ssh", "box"] and len(words) == 3, command
    return re.sub(r"(^|&& )sudo ", r"\1", words[2])


def service(unit: Path) -> dict[str, list[str]]:
    """The ``[Service]`` directives of a unit file (comments left out)."""
    found: dict[str, list[str]] = {}
    section = None
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


class MissingCredential(Exception):
    """What systemd reports as status 243/CREDENTIALS."""


def start_unit(unit: Path, root: Path, notify: str) -> subprocess.Popen:
    """The unit's ExecStart, started with the environment systemd gives a service."""
    d = service(unit)
    name = unit.name
    states = [root / "var" / "lib" / s for v in d.get("StateDirectory", []) for s in v.split()]
    for path in states:
        path.mkdir(parents=True, exist_ok=True)
    credentials = root / "run" / "credentials" / name
    credentials.mkdir(parents=True, exist_ok=True)
    for item in d.get("LoadCredential", []):
        key, _, path = item.partition(":")
        source = Path(on_box(path, root))
        if not source.is_file():
            raise MissingCredential(f"{name}: credential {key}: {path}: no such file")
        shutil.copy(source, credentials / key)
        (credentials / key).chmod(0o400)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8",
           "STATE_DIRECTORY": ":".join(map(str, states)),
           "CREDENTIALS_DIRECTORY": str(credentials), "NOTIFY_SOCKET": notify,
           "WATCHDOG_USEC": str(int(d["WatchdogSec"][0]) * 1_000_000)}
    for item in d.get("Environment", []):
        key, _, value = item.partition("=")
        env[key] = on_box(value, root)
    if os.environ.get("PYTHONPATH"):  # the checkout under test, as the venv runs it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    command = on_box(d["ExecStart"][0], root).replace(
        "${CREDENTIALS_DIRECTORY}", str(credentials))
    return subprocess.Popen(shlex.split(command), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture
def box(tmp_path):
    """The box after the install's first three commands: the files copied to /tmp, the
    venv in /opt/edgeagent/.venv."""
    root = tmp_path / "box"
    commands = install_commands()
    assert len(commands) == 5 and commands[0] == "make dist"
    copied = shlex.split(commands[1])
    assert copied[0] == "scp" and copied[-1] == "box:/tmp/", commands[1]
    for folder in ("tmp", "etc/systemd/system", "var/lib", "run"):  # a systemd box's
        (root / folder).mkdir(parents=True)
    for name in copied[1:-1]:
        if not name.startswith("dist/"):  # the wheel: tests/test_wheel.py
            shutil.copy(ROOT / name, root / "tmp")
    assert "/opt/edgeagent/.venv" in commands[2] and "pip install" in commands[2]
    (root / "opt" / "edgeagent").mkdir(parents=True)
    (root / "opt" / "edgeagent" / ".venv").symlink_to(sys.prefix)
    return root, commands


def _call(url: str, method: str = "GET", token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_five_commands_leave_a_unit_that_starts_and_guards_its_admin_api(box):
    root, commands = box
    done = subprocess.run(["bash", "-c", on_box(remote(commands[3]), root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "systemctl daemon-reload" in commands[4] and "enable --now edgeagent" in commands[4]
    unit = root / "etc" / "systemd" / "system" / "edgeagent.service"
    token_file = root / "etc" / "edgeagent" / "admin-token"
    assert unit.is_file() and token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    # the installed config, its ports moved off those other tests and servers may hold
    config = root / "etc" / "edgeagent" / "agent.yaml"
    with reserved_port() as port, reserved_port() as grpc_port:
        config.write_text(on_box(config.read_text(), root)
                          .replace("\nport: 8000\n", f"\nport: {port}\n")
                          .replace("\ngrpc_port: 8001\n", f"\ngrpc_port: {grpc_port}\n"))
        said, err, code = _run_unit(unit, root, port, token)
    assert code == 0, err[-3000:]
    assert said[0].startswith("READY=1") and f"serving on http://127.0.0.1:{port}" in said[0]
    assert (root / "var" / "lib" / "edgeagent" / "resident.json").is_file()  # its state


def _run_unit(unit: Path, root: Path, port: int, token: str) -> tuple[list[str], str, int]:
    """Start the unit, wait for READY=1, check it serves and guards its admin API with
    ``token``, stop it: (the notify messages, its stderr, its exit status)."""
    notify_dir = Path(tempfile.mkdtemp(prefix="nc-"))  # a socket path under 108 bytes
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(notify_dir / "notify"))
            notify.settimeout(120)
            proc = start_unit(unit, root, str(notify_dir / "notify"))
            try:
                said = [notify.recv(4096).decode()]
                url = f"http://127.0.0.1:{port}"
                assert _call(url + "/v2/health/ready") == 200
                # the repository systemd made holds the operator's models
                add_mlp(root / "var" / "lib" / "edgeagent" / "models", "resnet")
                assert _call(url + "/v2/repository/index", "POST") == 401
                assert _call(url + "/v2/repository/index", "POST", token) == 200  # rescan
                assert _call(url + "/v2/repository/models/resnet/load", "POST") == 401
                assert _call(url + "/v2/repository/models/resnet/load", "POST", token) == 200
                # with a token, inference and statistics need one too (auth.protect)
                assert _call(url + "/v2/models/resnet/ready") == 401
                assert _call(url + "/v2/models/resnet/ready", "GET", token) == 200
            finally:
                proc.terminate()
                _, err = proc.communicate(timeout=60)
    finally:
        shutil.rmtree(notify_dir, ignore_errors=True)
    return said, err, proc.returncode


def test_without_the_admin_token_the_unit_does_not_start(box):
    """What the fourth command prevents: systemd refuses a unit whose credential file is
    missing."""
    root, commands = box
    step = remote(commands[3]).split(" && ")
    without_token = " && ".join(c for c in step if "token new" not in c)
    subprocess.run(["bash", "-c", on_box(without_token, root)], check=True, timeout=60)
    unit = root / "etc" / "systemd" / "system" / "edgeagent.service"
    with pytest.raises(MissingCredential, match="admin-token: /etc/edgeagent/admin-token"):
        start_unit(unit, root, "/nonexistent")


def test_the_installed_config_checks_ok_on_the_box(box):
    """``config check`` refuses what serve refuses: the installed config, with the box's
    folders made as the unit makes them, checks ok."""
    root, commands = box
    subprocess.run(["bash", "-c", on_box(remote(commands[3]), root)], check=True,
                   capture_output=True, timeout=120)
    config = root / "etc" / "edgeagent" / "agent.yaml"
    config.write_text(on_box(config.read_text(), root))
    (root / "var" / "lib" / "edgeagent" / "models").mkdir(parents=True)
    done = subprocess.run([str(root / "opt" / "edgeagent" / ".venv" / "bin" / "edgeagent"),
                           "config", "check", "agent", str(config)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == f"{config}: ok\n", done.stderr
