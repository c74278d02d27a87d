"""Real servers on loopback for the model sources' tests (issue 26), shared by every
test that pulls models: a Range-capable HTTP file server with fault switches, moto's
S3-compatible server, and Debian's ``docker-registry`` (the CNCF distribution server).
Each is a context manager binding port 0; ``s3_server`` and ``oci_registry`` skip the
calling test, naming the reason, where their server cannot run."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Served:
    """One answered request: its path, its ``Range`` header (or None), the body bytes
    sent and the seconds from the request to the last of them."""

    path: str
    range: str | None
    sent: int
    seconds: float = 0.0


@dataclass
class RangeServer:
    """A threaded HTTP(S) file server over ``root``. Switches: ``cut_after`` (close the
    connection after that many body bytes, for every GET until reset to None),
    ``corrupt`` (flip the first body byte), ``ignore_range`` (answer 200 in full),
    ``delays`` (path → seconds: a whole file's wait before its body, a remote store's
    time to the first byte; a range waits its share); ``served`` records each GET."""

    root: Path
    ssl_context: ssl.SSLContext | None = None
    cut_after: int | None = None
    corrupt: bool = False
    ignore_range: bool = False
    delays: dict[str, float] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again, on the same port after a ``stop``)."""
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                started = time.perf_counter()
                name = self.path.split("?")[0].lstrip("/")
                path = server.root / name
                if not path.is_file():
                    self.send_error(404)
                    return
                data_size = path.stat().st_size
                asked = self.headers.get("Range")
                first, last = 0, data_size - 1
                if asked and not server.ignore_range and asked.startswith("bytes="):
                    a, _, b = asked[6:].partition("-")
                    first = int(a)
                    last = min(int(b), data_size - 1) if b else data_size - 1
                    if first >= data_size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{data_size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {first}-{last}/{data_size}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(last - first + 1))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if server.delays.get(name):
                    time.sleep(server.delays[name] * (last - first + 1) / max(data_size, 1))
                sent = 0
                with open(path, "rb") as f:
                    f.seek(first)
                    left = last - first + 1
                    while left > 0:
                        chunk = f.read(min(64 << 10, left))
                        if server.corrupt and sent == 0 and chunk:
                            chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                        if server.cut_after is not None and sent + len(chunk) > server.cut_after:
                            chunk = chunk[: server.cut_after - sent]
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            self.wfile.flush()
                            # counted before the cut: the client, seeing it at once,
                            # may clear ``served`` before this thread would go on
                            server.served.append(Served(self.path, asked, sent,
                                                        time.perf_counter() - started))
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        left -= len(chunk)
                server.served.append(Served(self.path, asked, sent,
                                            time.perf_counter() - started))

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        if self.ssl_context is not None:
            httpd.socket = self.ssl_context.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(10)
            self._httpd = None


@contextlib.contextmanager
def range_http_server(root: Path, ssl_context: ssl.SSLContext | None = None
                      ) -> Iterator[RangeServer]:
    """A ``RangeServer`` over ``root``, started, stopped on exit."""
    server = RangeServer(Path(root), ssl_context)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class S3Server:
    """moto's S3-compatible server on loopback: ``endpoint_url``, and the environment a
    client needs (fake credentials, a region, no real AWS config)."""

    endpoint_url: str
    env: dict[str, str]

    def client(self):  # noqa: ANN201 - boto3's client type
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])


@contextlib.contextmanager
def s3_server(tmp: Path, *, secret: str = "test-secret-key-9f3b") -> Iterator[S3Server]:
    """moto's standalone server (``moto[server]``) on a free loopback port, in this
    process, emptied first; skips the test where moto is not installed. ``env`` holds credentials with
    ``secret`` as the secret key and config files under ``tmp`` (none of the user's)."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}): pip install 'edgeagent[test]'")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its buckets in this process's memory: each server starts empty
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset",
                                                  method="POST"), timeout=30).close()
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"AWS_ACCESS_KEY_ID": "AKIDTESTEDGEAGENT", "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(tmp / "aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "aws-credentials"),
           "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        yield S3Server(f"http://{host}:{port}", env)
    finally:
        server.stop()


REGISTRY_BINARIES = ("docker-registry", "registry")


@dataclass
class TokenService:
    """A bearer-token service for the registry (distribution's ``auth: token``): it
    answers ``GET /token?service=&scope=`` from ``user``/``password`` (basic auth) with
    an ES256 JWT granting the scope, signed by a certificate the registry trusts; it
    counts the tokens it issued."""

    directory: Path
    user: str
    password: str
    service: str = "edgeagent-test"
    issuer: str = "edgeagent-test-issuer"
    issued: list[str] = field(default_factory=list)
    refused: int = 0

    def __post_init__(self) -> None:
        from tests.helpers import make_ca

        self.directory.mkdir(parents=True, exist_ok=True)
        self.signer = make_ca(self.directory, "token-signer")
        self._httpd: http.server.ThreadingHTTPServer | None = None

    def config(self) -> str:
        return (f"auth:\n  token:\n    realm: {self.url}/token\n    service: {self.service}\n"
                f"    issuer: {self.issuer}\n    rootcertbundle: {self.signer.cert_file}\n")

    def token(self, scope: str) -> str:
        import base64
        import json as _json
        import secrets

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        access = []
        for item in filter(None, scope.split(" ")):
            kind, name, actions = item.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"alg": "ES256", "typ": "JWT", "x5c": [base64.b64encode(
            self.signer.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": self.issuer, "sub": self.user, "aud": self.service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": secrets.token_hex(8), "access": access}
        signing = f"{b64(_json.dumps(header).encode())}.{b64(_json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.signer.key.sign(signing.encode(),
                                                         ec.ECDSA(hashes.SHA256())))
        token = f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
        self.issued.append(token)
        return token

    def start(self) -> None:
        import base64
        import json as _json
        import urllib.parse

        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                want = "Basic " + base64.b64encode(
                    f"{service.user}:{service.password}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    service.refused += 1
                    self.send_error(401)
                    return
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                body = _json.dumps({"token": service.token(query.get("scope", ""))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


@dataclass
class Registry:
    """A running CNCF distribution registry: ``host`` (``127.0.0.1:port``), ``url``,
    its storage directory and process; ``restart()`` starts it again (same port and
    storage) after a test stopped it."""

    host: str
    storage: Path
    proc: subprocess.Popen
    argv: list[str]
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def restart(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = _start_registry(self.argv, self.log)
        if not _wait_port(int(self.host.rpartition(":")[2]), self.proc):
            raise RuntimeError(f"docker-registry did not restart: {self.log.read_text()[-500:]}")


@contextlib.contextmanager
def oci_registry(tmp: Path, *, htpasswd: Path | None = None,
                 tokens: TokenService | None = None) -> Iterator[Registry]:
    """Debian's ``docker-registry`` on a free loopback port with a temporary config and
    storage directory (basic auth when ``htpasswd`` is given, bearer tokens from
    ``tokens``, started here); skips the test where the binary is missing
    (``apt-get install docker-registry``)."""
    binary = next((b for b in map(shutil.which, REGISTRY_BINARIES) if b), None)
    if binary is None:
        pytest.skip("no docker-registry binary: apt-get install docker-registry "
                    "(the CNCF distribution server)")
    tmp.mkdir(parents=True, exist_ok=True)
    storage = tmp / "storage"
    auth = (f"auth:\n  htpasswd:\n    realm: edgeagent-test\n    path: {htpasswd}\n"
            if htpasswd else "")
    if tokens is not None:
        tokens.start()
        auth = tokens.config()
    for attempt in range(5):
        port = _free_port()
        config = tmp / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n{auth}")
        argv = [binary, "serve", str(config)]
        proc = _start_registry(argv, tmp / "registry.log")
        if _wait_port(port, proc):
            break
        proc.kill()
        proc.wait()
    else:
        if tokens is not None:
            tokens.stop()
        pytest.skip(f"docker-registry did not start: {(tmp / 'registry.log').read_text()[-500:]}")
    registry = Registry(f"127.0.0.1:{port}", storage, proc, argv, tmp / "registry.log")
    try:
        yield registry
    finally:
        if tokens is not None:
            tokens.stop()
        registry.proc.terminate()
        try:
            registry.proc.wait(10)
        except subprocess.TimeoutExpired:
            registry.proc.kill()
            registry.proc.wait()


def _start_registry(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})


def _free_port() -> int:
    # The registry takes its port from its config file only: one the kernel picked a
    # moment ago, retried by the caller where another process took it meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False
