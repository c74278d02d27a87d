"""What one stranger (no token, default config) can hold on an agent and a coordinator,
and whether other clients are still answered meanwhile. Each attack runs against a
fresh server process on loopback; a probe is a new client (its own connection) sending
one small request, answered or not within 5 s:

* gzip bomb: one request whose gzip body (2 MB on the wire) inflates to 2 GiB; the
  agent's peak RSS over what it held before (VmHWM, reset through clear_refs);
* silent bodies: 8 (and 64) connections announce 64 MiB bodies and send nothing; 8
  probes of a small inference request;
* held connections: 2,000 connections idle, slowloris (a header byte a second) or
  stalled before TLS, with RLIMIT_NOFILE at systemd's default (1024) and at the units'
  LimitNOFILE; 10 probes, agent and coordinator;
* TLS handshakes: 50 TCP connections that never start one, read_timeout_s 5: how many
  are still open after 8 s;
* silent gRPC calls: 4 ModelInfer calls that never send their message; 8 HTTP probes.

``--code DIR`` runs the servers from another checkout (before/after):

    git archive 104a21d | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    .venv/bin/python bench/strangers.py --code /tmp/base     # before
    .venv/bin/python bench/strangers.py                      # after

Needs an open-file limit of at least 2,200 in this process (it raises its soft limit).
The attack functions are the ones tests/test_strangers.py runs with its floors.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 2**20
#: A small inference request for ``add_mlp``'s model (4 inputs).
SMALL = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()
PROBE_TIMEOUT = 5.0


# -- servers from a checkout -----------------------------------------------------------------


class Server:
    """``edgeagent ARGV`` from the checkout ``code`` in its own process (open files
    limited to ``nofile``: (soft, hard)); ``url`` as it announced it, ``grpc`` its gRPC
    address when it printed one."""

    def __init__(self, code: Path, argv: list[str], log: Path, nofile=None,
                 grpc: bool = False) -> None:
        self.log_path = log
        self.log = open(log, "wb")

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from agent.cli import main; main()", *argv],
            cwd=code, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=limit,
            env={**os.environ, "PYTHONPATH": str(code)})
        deadline = time.monotonic() + 120
        self.url = self.grpc = None
        while self.url is None:
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            text = log.read_text()
            found = re.search(r"listening on (\S+)", text)
            grpc_line = re.search(r"gRPC \(KServe v2, tritonclient.grpc\): (\S+)", text)
            if found and (grpc_line or not grpc):
                self.url = found.group(1)
                self.grpc = grpc_line.group(1) if grpc_line else None
            time.sleep(0.05)
        self.resources = contextlib.ExitStack()  # held until ``stop``
        self.host, port = self.url.split("://")[1].rsplit(":", 1)
        self.port = int(port)
        self.context = None
        if self.url.startswith("https"):
            self.context = ssl.create_default_context()
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.resources.close()


def start_agent(code: Path, work: Path, config: dict, nofile=None) -> Server:
    """An agent over one small ONNX model, ``m``, with ``config`` (YAML keys)."""
    from tests.helpers import add_mlp, reserved_port

    repo = work / "models"
    if not repo.exists():
        add_mlp(repo, "m")
    path = work / "agent.yaml"
    path.write_text(json.dumps({"log_level": "warning", **config}))
    port = contextlib.ExitStack()
    grpc_port = port.enter_context(reserved_port())
    try:
        server = Server(code, ["serve", "--config", str(path), "--repository", str(repo),
                               "--port", "0", "--grpc-port", str(grpc_port),
                               "--data-dir", str(work / "data"), "--cpu-budget", "300MB"],
                        work / "agent.log", nofile, grpc=True)
    except BaseException:
        port.close()
        raise
    server.resources = port
    return server


def start_coordinator(code: Path, work: Path, config: dict, nofile=None) -> Server:
    path = work / "coordinator.yaml"
    path.write_text(json.dumps({"port": 0, "state_dir": str(work / "co"),
                                "log_level": "warning", "plan_interval_s": 3600, **config}))
    return Server(code, ["coordinator", "serve", "--config", str(path)],
                  work / "coordinator.log", nofile)


def self_signed(directory: Path) -> dict:
    """A ``tls:`` section with a certificate made here."""
    from tests.helpers import issue_cert, make_ca

    ca = make_ca(directory)
    leaf = issue_cert(ca, directory, "server")
    return {"cert_file": str(leaf.cert_file), "key_file": str(leaf.key_file)}


def unit_nofile(unit: str = "edgeagent.service") -> int | None:
    """The ``LimitNOFILE=`` a unit in systemd/ sets (None: it sets none)."""
    found = re.search(r"^LimitNOFILE=(\d+)", (ROOT / "systemd" / unit).read_text(), re.M)
    return int(found.group(1)) if found else None


def raise_own_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


# -- what a client sees ------------------------------------------------------------------------


def probe(server: Server, path: str = "/v2/models/m/infer", body: bytes | None = SMALL,
          timeout: float = PROBE_TIMEOUT, source: str = "127.0.0.1") -> float | None:
    """Seconds a new client from ``source`` waits for the answer to one request on a
    connection of its own (connect included); None: no answer within ``timeout``."""
    started = time.perf_counter()
    cls = http.client.HTTPSConnection if server.context else http.client.HTTPConnection
    kwargs = {"context": server.context} if server.context else {}
    conn = cls(server.host, server.port, timeout=timeout, source_address=(source, 0),
               **kwargs)
    try:
        conn.request("POST" if body is not None else "GET", path, body=body,
                     headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        if answer.status >= 500:
            return None
        return time.perf_counter() - started
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def probes(server: Server, count: int, path: str = "/v2/models/m/infer",
           body: bytes | None = SMALL, pause: float = 0.05,
           sources: tuple[str, ...] = ("127.0.0.1",)) -> list[float | None]:
    """``probe`` ``count`` times, from each of ``sources`` in turn. (A new client on the
    address and port of a connection the server closed a moment ago can wait a second
    on loopback: the server's TIME_WAIT answers its SYN; tests send from an address of
    their own after such closes.)"""
    out = []
    for i in range(count):
        out.append(probe(server, path, body, source=sources[i % len(sources)]))
        time.sleep(pause)
    return out


def within(latencies: list[float | None], seconds: float = 1.0) -> int:
    return sum(1 for t in latencies if t is not None and t <= seconds)


def describe(latencies: list[float | None]) -> str:
    answered = [t for t in latencies if t is not None]
    worst = f"{max(answered) * 1e3:.0f} ms" if answered else "-"
    return (f"{within(latencies)}/{len(latencies)} answered within 1 s, "
            f"{len(answered)}/{len(latencies)} within {PROBE_TIMEOUT:g} s, slowest {worst}")


# -- attacks ------------------------------------------------------------------------------------


def connect(server: Server, source: str | None = None,
            timeout: float = 2.0) -> socket.socket | None:
    """A TCP connection to ``server`` (from ``source``, a loopback address), or None
    when it cannot be made within ``timeout``."""
    try:
        return socket.create_connection((server.host, server.port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
    except OSError:
        return None


@contextlib.contextmanager
def held_connections(server: Server, count: int, kind: str,
                     sources: tuple[str, ...] = ("127.0.0.1",)
                     ) -> Iterator[list[socket.socket]]:
    """``count`` connections held open while the block runs, from each of ``sources``
    in turn: ``idle`` (nothing sent, or on a TLS port: no handshake started) or
    ``slowloris`` (a request head, one byte a second that never ends)."""
    sockets = []
    for i in range(count):
        s = connect(server, sources[i % len(sources)])
        if s is not None:
            sockets.append(s)
        if i % 100 == 99:  # a backlog of 128 (the agent's) that overflows costs a 1 s retry
            time.sleep(0.05)
    stop = threading.Event()

    def trickle() -> None:
        head = b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\nX-a: "
        for s in sockets:
            with contextlib.suppress(OSError):
                s.send(head)
        while not stop.wait(1.0):
            for s in sockets:
                with contextlib.suppress(OSError):
                    s.send(b"a")

    thread = threading.Thread(target=trickle, daemon=True)
    if kind == "slowloris":
        thread.start()
    try:
        yield sockets
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        for s in sockets:
            s.close()


def still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has not closed (what it sent is read and
    dropped)."""
    count = 0
    for s in sockets:
        try:
            s.setblocking(False)
            while s.recv(65536):
                pass
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


@contextlib.contextmanager
def silent_bodies(server: Server, count: int, size: int = 64 * MiB,
                  source: str | None = None) -> Iterator[list[socket.socket]]:
    """``count`` connections that announce a ``size``-byte body and send none of it."""
    head = (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n").encode()
    sockets = []
    for _ in range(count):
        s = connect(server, source)
        if s is not None:
            s.sendall(head)
            sockets.append(s)
    try:
        time.sleep(0.3)  # the heads are read
        yield sockets
    finally:
        for s in sockets:
            s.close()


def bomb(inflated: int, encoding: str = "gzip") -> bytes:
    """A body of ``inflated`` zero bytes coded as ``encoding`` (gzip or deflate), about
    1,000 to 1: one 1 MiB deflate block, byte-aligned by a full flush, repeated."""
    zeros = bytes(MiB)
    count = inflated // MiB
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    blocks = block * count + zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    crc, adler = 0, 1
    for _ in range(count):
        crc, adler = zlib.crc32(zeros, crc), zlib.adler32(zeros, adler)
    if encoding == "gzip":
        return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + blocks
                + crc.to_bytes(4, "little") + (inflated % 2**32).to_bytes(4, "little"))
    return b"\x78\x9c" + blocks + adler.to_bytes(4, "big")


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def send_bomb(server: Server, body: bytes, encoding: str = "gzip",
              timeout: float = 120) -> tuple[int | None, str, int, float]:
    """(status or None, the answer's text, the peak RSS over the RSS before, seconds):
    one request with ``body`` as its ``encoding``-coded content."""
    with contextlib.suppress(OSError):  # the peak (VmHWM) starts again from the RSS
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    before = memory_status(server.pid)["VmRSS"]
    started = time.perf_counter()
    cls = http.client.HTTPSConnection if server.context else http.client.HTTPConnection
    conn = cls(server.host, server.port, timeout=timeout)
    status, text = None, ""
    try:
        conn.request("POST", "/v2/models/m/infer", body=body,
                     headers={"Content-Type": "application/json",
                              "Content-Encoding": encoding})
        answer = conn.getresponse()
        status, text = answer.status, answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        text = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    took = time.perf_counter() - started
    return status, text, memory_status(server.pid)["VmHWM"] - before, took


@contextlib.contextmanager
def silent_grpc_calls(address: str, count: int) -> Iterator[None]:
    """``count`` ModelInfer calls to ``address``, each on a channel of its own, that
    send their headers and never their message."""
    import grpc

    release = threading.Event()
    channels = [grpc.insecure_channel(address) for _ in range(count)]
    futures = []

    def never() -> Iterator[bytes]:
        release.wait()
        return
        yield b""  # a generator

    for channel in channels:
        call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")
        futures.append(call.future(never(), timeout=120))
    try:
        time.sleep(0.5)  # the calls reach the agent and wait for their messages
        yield
    finally:
        release.set()
        for future in futures:
            future.cancel()
        for channel in channels:
            channel.close()


# -- the runs -----------------------------------------------------------------------------------


def run_bomb(code: Path, work: Path) -> None:
    body = bomb(2048 * MiB)
    agent = start_agent(code, work, {})
    try:
        status, text, lifted, took = send_bomb(agent, body)
        print(f"gzip bomb ({len(body) / 1e6:.1f} MB on the wire, 2 GiB inflated): answer "
              f"{status} in {took:.1f} s, peak RSS +{lifted / MiB:.0f} MiB "
              f"(max_request_size 64 MiB): {text[:100]!r}")
        print(f"  then a small request: {describe(probes(agent, 3))}")
    finally:
        agent.stop()


def run_silent_bodies(code: Path, work: Path) -> None:
    agent = start_agent(code, work, {})
    try:
        for count in (8, 64):
            with silent_bodies(agent, count):
                seen = probes(agent, 8, pause=0.3)
            print(f"{count} silent 64 MiB bodies: small inference {describe(seen)}")
    finally:
        agent.stop()


def run_held(code: Path, work: Path, nofile: tuple[int, int], label: str) -> None:
    tls = self_signed(work)
    for role in ("agent", "coordinator"):
        for kind, secure in (("idle", False), ("slowloris", False), ("idle", True)):
            name = "stalled before TLS" if secure else kind
            config = {"tls": tls} if secure else {}
            server = (start_agent if role == "agent" else start_coordinator)(
                code, work, config, nofile)
            path, body = (("/v2/models/m/infer", SMALL) if role == "agent"
                          else ("/v1/health", None))
            try:
                with held_connections(server, 2000, kind) as sockets:
                    time.sleep(1.0)
                    seen = probes(server, 10, path, body, pause=0.1)
                    held = len(sockets)
                print(f"{role}, {held} held {name}, {label}: {describe(seen)}")
            finally:
                server.stop()


def run_handshakes(code: Path, work: Path) -> None:
    agent = start_agent(code, work, {"tls": self_signed(work), "read_timeout_s": 5})
    try:
        sockets = [s for s in (connect(agent) for _ in range(50)) if s]
        time.sleep(8)
        print(f"50 TCP connections that never start TLS, read_timeout_s 5: "
              f"{still_open(sockets)} still open after 8 s")
        for s in sockets:
            s.close()
    finally:
        agent.stop()


def run_grpc(code: Path, work: Path) -> None:
    agent = start_agent(code, work, {})
    try:
        with silent_grpc_calls(agent.grpc, 4):
            seen = probes(agent, 8, pause=0.3)
        print(f"4 silent gRPC ModelInfer calls: HTTP inference {describe(seen)}")
    finally:
        agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="the checkout the servers run from [default: this one]")
    parser.add_argument("--only", choices=("bomb", "bodies", "held", "tls", "grpc"),
                        action="append", help="run only these attacks")
    args = parser.parse_args()
    raise_own_nofile(2400)
    only = set(args.only or ("bomb", "bodies", "held", "tls", "grpc"))
    print(f"servers from {args.code}; load average {os.getloadavg()[0]:.2f}")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    unit = unit_nofile()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "bomb" in only:
            run_bomb(args.code, work)
        if "bodies" in only:
            run_silent_bodies(args.code, work)
        if "held" in only:
            run_held(args.code, work, (1024, hard), "RLIMIT_NOFILE 1024 (systemd's default)")
            if unit:
                limit = min(unit, hard)
                run_held(args.code, work, (limit, limit), f"RLIMIT_NOFILE {limit} (the unit)")
        if "tls" in only:
            run_handshakes(args.code, work)
        if "grpc" in only:
            run_grpc(args.code, work)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
