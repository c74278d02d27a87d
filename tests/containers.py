"""The images' commands run here, as a container would run them (no docker engine on
this box, no cluster): the Dockerfiles read as instructions, an ENTRYPOINT or
HEALTHCHECK run with ``python`` this interpreter and the port the OS's, the image's ENV
with its paths moved under a test's folder. Used by tests/test_dockerfile.py and
tests/test_kubernetes.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its text) for each instruction of ``dockerfile``, continuations joined."""
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def exec_form(dockerfile: str, kind: str) -> list[str]:
    """The exec-form (JSON) command of ``kind`` (ENTRYPOINT, or HEALTHCHECK's CMD)."""
    (value,) = [v for k, v in instructions(dockerfile) if k == kind]
    return json.loads(value.split("CMD", 1)[1] if kind == "HEALTHCHECK" else value)


def image_env(dockerfile: str) -> dict[str, str]:
    """The image's ENV (``ENV A=1 B=2`` forms)."""
    env = {}
    for kind, value in instructions(dockerfile):
        if kind == "ENV":
            env.update(pair.split("=", 1) for pair in value.split())
    return env


def as_here(argv: list[str], port: int | None = None) -> list[str]:
    """An image's command with its ``python`` this interpreter, ``--port`` 0 (the OS
    picks) and, given ``port``, a HEALTHCHECK's ``127.0.0.1:PORT`` that port."""
    assert argv[0] == "python", argv
    argv = [sys.executable, *argv[1:]]
    if port is not None:
        argv = [a.replace(":8000/", f":{port}/").replace(":8100/", f":{port}/") for a in argv]
    if "--port" in argv:
        argv[argv.index("--port") + 1] = "0"
    return argv


def process_env(**env: str) -> dict[str, str]:
    """The environment a container's process gets here: ``edgeagent`` on PATH, this
    checkout's code, none of the caller's EDGEAGENT_* variables, then ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EDGEAGENT_")}
    return {**base, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT), **env}


class Running:
    """``argv`` (an image's ENTRYPOINT and its arguments) in its own process, once it
    announces its URL (``port``); stderr in ``log``; ``stop`` sends SIGTERM."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True, cwd="/")
        lines = [self.proc.stdout.readline()]
        while lines[-1] and "listening on" not in lines[-1]:
            lines.append(self.proc.stdout.readline())
        line = lines[-1]
        assert "listening on" in line, "".join(lines) + log.read_text()
        self.port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self.proc.stdout.close()


def status(url: str, token: str | None = None, context=None) -> int:
    """The HTTP status of GET ``url`` (with a bearer ``token``)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
