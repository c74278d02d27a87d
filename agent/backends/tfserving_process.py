"""The TensorFlow Serving server the TF backend talks to, managed or attached.

``ManagedServer`` runs ``tensorflow_model_server`` as a child: started on first use with
a gRPC port, a model config file holding an empty model list, and file-system polling
off (the model set only ever changes by ``HandleReloadConfigRequest``). When the child
dies it is restarted with exponential backoff, and ``on_started`` (the host restoring its
resident set) runs before the server counts as up again. It starts empty on purpose: a
model that cannot load must never keep the server itself from starting.

``AttachedServer`` is a server someone else runs (systemd, a container): never started
or restarted here; its process is found for RSS accounting when it is on this host.

Both give a gRPC ``channel`` that is valid while ``generation`` stays the same.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from agent.backends.base import BackendError, BackendUnavailable

log = logging.getLogger("edgeagent.tfserving")

#: No gRPC message size limit of our own: the agent's max_request_size already bounds it.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", -1)]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _channel_ready(channel: Any, timeout: float) -> bool:
    import grpc

    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False


class ManagedServer:
    """A ``tensorflow_model_server`` child process, restarted with backoff when it dies."""

    def __init__(self, command: str | list[str], workdir: Path, *, port: int = 0,
                 args: tuple[str, ...] = (), start_timeout: float = 60.0,
                 backoff: float = 1.0, backoff_max: float = 30.0) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        self.workdir = Path(workdir)
        self.fixed_port, self.args = port, tuple(args)
        self.start_timeout, self.backoff, self.backoff_max = start_timeout, backoff, backoff_max
        self.config_file = self.workdir / "models.config"
        self.log_file = self.workdir / "server.log"
        self.pid_file = self.workdir / "server.pid"
        #: Runs after each (re)start, before the server counts as up (restore models).
        self.on_started: Callable[[], None] = lambda: None
        self.generation = 0
        self.restarts = 0
        self.last_exit: str | None = None
        self.channel: Any = None
        self.address = ""
        self._proc: subprocess.Popen | None = None
        self._state = "stopped"  # stopped | starting | up | restarting | closed
        self._cond = threading.Condition()
        self._up_since = 0.0
        self._log_start = 0  # offset of the current run's output in log_file
        self._delay = backoff  # before the next restart; doubles while it keeps dying
        _live_servers.add(self)

    # -- state ---------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._state == "up"

    @property
    def state(self) -> str:
        return self._state

    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def describe_down(self) -> str:
        why = f" after it {self.last_exit}" if self.last_exit else ""
        return f"TF Serving ({Path(self.command[0]).name}) is {self._state}{why}"

    def ensure_up(self, timeout: float | None = None) -> None:
        """Start the server if it never ran; wait while it restarts. Raises
        ``BackendError`` when it cannot start, ``BackendUnavailable`` when it is still
        restarting after ``timeout`` (default: the start timeout)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.start_timeout)
        with self._cond:
            while self._state in ("starting", "restarting"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendUnavailable(f"{self.describe_down()}; retry shortly")
                self._cond.wait(left)
            if self._state == "up":
                return
            if self._state == "closed":
                raise BackendUnavailable("TF Serving is shut down (the agent is stopping)")
            self._state = "starting"
        try:
            self._start()
            self.on_started()
        except BaseException:
            self._stop_proc()
            with self._cond:
                if self._state != "closed":
                    self._state = "stopped"
                self._cond.notify_all()
            raise
        self._mark_up()

    def _mark_up(self) -> None:
        with self._cond:
            closed = self._state == "closed"
            if not closed:
                self._state, self._up_since = "up", time.monotonic()
                self._cond.notify_all()
            proc = self._proc
        if closed:
            self._stop_proc()
            return
        threading.Thread(target=self._watch, args=(proc,), daemon=True,
                         name="tfserving-watch").start()

    # -- starting ------------------------------------------------------------------------
    def _start(self) -> None:
        """Spawn the binary and wait until its gRPC port answers (blocking)."""
        import grpc

        self.workdir.mkdir(parents=True, exist_ok=True)
        self._reap_orphan()
        self.config_file.write_text("model_config_list {\n}\n")
        port = self.fixed_port or free_port()
        argv = [*self.command, f"--port={port}", f"--model_config_file={self.config_file}",
                "--file_system_poll_wait_seconds=0", "--max_num_load_retries=0", *self.args]
        env = dict(os.environ)
        env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # per-model GPU deltas
        log.info("starting TF Serving: %s", shlex.join(argv))
        with contextlib.suppress(OSError):
            if self.log_file.stat().st_size > 8 * 2**20:
                self.log_file.replace(self.log_file.with_suffix(".log.1"))
        with open(self.log_file, "ab") as out:
            self._log_start = out.tell()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
            except OSError as exc:
                raise BackendError(f"cannot start TF Serving {self.command[0]!r}: "
                                   f"{exc.strerror or exc} (set tfserving.binary in the agent "
                                   "config, or tfserving.address to attach)") from None
        self._proc = proc
        self.pid_file.write_text(f"{proc.pid}\n")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if proc.poll() is not None:
                channel.close()
                raise BackendError(f"TF Serving exited with code {proc.returncode} while "
                                   f"starting: {self.log_tail()}")
            if _channel_ready(channel, 0.25):
                break
            if time.monotonic() > deadline or self._state == "closed":
                channel.close()
                self._stop_proc()
                raise BackendError(f"TF Serving did not become ready within "
                                   f"{self.start_timeout:g} s: {self.log_tail()}")
        old, self.channel = self.channel, channel
        self.address = f"127.0.0.1:{port}"
        self.generation += 1
        if old is not None:
            old.close()
        log.info("TF Serving is up at %s (pid %d)", self.address, proc.pid)

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the server's output, for error messages."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_start)
                text = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        tail = " | ".join(line.strip() for line in text[-lines:] if line.strip())
        return f"last output: {tail}" if tail else "no output"

    def _reap_orphan(self) -> None:
        """Kill a server left behind by an agent that died without stopping it."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        import psutil

        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if any(str(self.config_file) in arg for arg in proc.cmdline()):
                log.warning("stopping TF Serving pid %d left by an earlier agent", pid)
                proc.kill()
                proc.wait(10)

    # -- watching and restarting --------------------------------------------------------
    def _watch(self, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._cond:
            if self._state == "closed" or proc is not self._proc:
                return
            self.last_exit = (f"was killed by signal {-code}" if code < 0
                              else f"exited with code {code}")
            self._state = "restarting"
            self._cond.notify_all()
            stable = time.monotonic() - self._up_since >= self.backoff_max
        if stable:
            self._delay = self.backoff
        log.error("TF Serving (pid %d) %s; restarting it in %.1f s: %s", proc.pid,
                  self.last_exit, self._delay, self.log_tail())
        while True:
            delay = self._delay
            self._delay = min(delay * 2, self.backoff_max)
            with self._cond:
                self._cond.wait_for(lambda: self._state == "closed", timeout=delay)
                if self._state == "closed":
                    return
            try:
                self._start()
                self.on_started()
            except Exception as exc:  # noqa: BLE001 - keep trying, with backoff
                self._stop_proc()
                log.error("TF Serving restart failed (%s); next try in %.1f s", exc,
                          self._delay)
                continue
            self.restarts += 1
            self._mark_up()
            return

    def _stop_proc(self, grace: float = 5.0) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(grace)

    def close(self) -> None:
        """Stop the server for good (agent shutdown)."""
        with self._cond:
            self._state = "closed"
            self._cond.notify_all()
        self._stop_proc()
        if self.channel is not None:
            self.channel.close()
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        _live_servers.discard(self)


class AttachedServer:
    """A TF Serving server someone else runs, at ``address``: checked, never started."""

    restarts = 0
    last_exit = None

    def __init__(self, address: str, *, start_timeout: float = 60.0) -> None:
        import grpc

        self.address = address
        self.start_timeout = start_timeout
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.generation = 1
        self.on_started: Callable[[], None] = lambda: None
        self._pid: int | None = None
        self._checked = False

    up = True
    state = "attached"

    def describe_down(self) -> str:
        return f"TF Serving at {self.address} is not reachable"

    def ensure_up(self, timeout: float | None = None) -> None:
        wait = timeout if timeout is not None else self.start_timeout
        if not _channel_ready(self.channel, wait):
            raise BackendUnavailable(f"{self.describe_down()} (waited {wait:g} s)")
        if not self._checked:
            self.on_started()
            self._checked = True

    def pid(self) -> int | None:
        """The server's pid when it listens on this host (for RSS), else None."""
        import psutil

        if self._pid is not None and psutil.pid_exists(self._pid):
            return self._pid
        host, _, port = self.address.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "[::1]", "0.0.0.0", ""):
            return None
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and \
                        conn.laddr.port == int(port) and conn.pid:
                    self._pid = conn.pid
                    return self._pid
        return None

    def close(self) -> None:
        self.channel.close()


# Managed servers still running when the interpreter exits (a test that never closed its
# agent, a crash in start-up) are stopped, never left behind.
_live_servers: "weakref.WeakSet[ManagedServer]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.close()
