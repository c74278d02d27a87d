"""What several test modules (and some bench scripts) share that is not a fixture
(fixtures are in conftest.py): model repositories written on the fly, real servers
(in-process and as processes), request bodies, waiting, ports, in-process serving, load
generators, fault doubles, the planner's fake clock, and pytest in a child process with
compiled policy kernels."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agent.modelzoo import write_mlp

ROOT = Path(__file__).resolve().parent.parent
#: The console script of the venv running the tests (with PYTHONPATH, this checkout's code).
EDGEAGENT = str(Path(sys.executable).with_name("edgeagent"))

#: The packages the default install leaves out (pyproject's extras and the tests' own):
#: ``edgeagent serve`` and the agent's commands import none of them.
HEAVY = ("numba", "llvmlite", "pandas", "pyarrow", "scipy", "sklearn", "matplotlib", "onnx",
         "skl2onnx", "tqdm", "threadpoolctl", "tensorflow", "tensorflow_serving",
         "opentelemetry")
_BLOCKER = """
import sys, importlib.abc
class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {names!r}:
            print(f"BLOCKED import {{name}}", file=sys.stderr, flush=True)
            raise ImportError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
"""


def without_packages(site: Path, names: tuple[str, ...] = HEAVY) -> dict[str, str]:
    """The environment of a child process (this checkout's code) in which ``names`` are
    not installed, as on an install without them: a ``sitecustomize`` in ``site`` refuses
    each import and reports it on stderr (``BLOCKED import x``)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_BLOCKER.format(names=tuple(names)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("EDGEAGENT_JIT", None)
    return env


def ask_the_demo(edgeagent: str, data_dir: Path, env: dict[str, str],
                 cwd: Path | None = None) -> tuple[dict, bytes, int, str]:
    """``edgeagent serve`` with no repository (``make run``: it writes the demo), asked
    the README's classifier request and its page ``/``, then stopped: (the prediction,
    the page, the exit status, stderr)."""
    proc = subprocess.Popen([edgeagent, "serve", "--port", "0", "--grpc-port", "0",
                             "--data-dir", str(data_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        line = proc.stdout.readline()
        if line.startswith("generating the demo"):
            line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        url = line.split()[3]
        body = json.dumps({"instances": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]}).encode()
        req = urllib.request.Request(f"{url}/v1/models/classifier:predict", data=body,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            (answer,) = json.loads(resp.read())["predictions"]
        with urllib.request.urlopen(f"{url}/", timeout=30) as resp:
            page = resp.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    return answer, page, proc.returncode, err


# -- model repositories ---------------------------------------------------------------------

#: A small real MLP used across node tests (a few KB; loads in milliseconds).
TINY_MLP = dict(inputs=4, hidden=16, layers=1, outputs=2, seed=11)


def add_synthetic(repo: Path, name: str, *, size_bytes: int = 10_000_000, load_ms: float = 0,
                  base_ms: float = 0, per_item_ms: float = 0, **extra) -> Path:
    """A synthetic model directory (only a config.yaml)."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"backend": "synthetic",
           "synthetic": {"base_ms": base_ms, "per_item_ms": per_item_ms,
                         "size_bytes": size_bytes, "load_ms": load_ms}, **extra}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def add_classifier(repo: Path, name: str, *, base_ms: float = 1.0, load_ms: float = 0,
                   size_bytes: int = 10_000_000, jitter: dict | None = None,
                   **classifier) -> Path:
    """A synthetic classifier (``synthetic.classifier``: ``classifier`` its options)."""
    d = add_synthetic(repo, name, size_bytes=size_bytes, load_ms=load_ms, base_ms=base_ms)
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["synthetic"]["classifier"] = classifier
    if jitter:
        cfg["synthetic"]["jitter"] = jitter
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def add_app(repo: Path, name: str, candidates: list[str], *, policy: str = "exp4",
            slo_ms: float = 200, **selection) -> Path:
    """A selection app (``backend: selection``) over ``candidates``."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"backend": "selection", "slo": {"latency_ms": slo_ms},
           "selection": {"policy": policy, "candidates": list(candidates), **selection}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def add_mlp(repo: Path, name: str, version: int = 1, config: dict | None = None,
            **shape) -> Path:
    """A real ONNX MLP at ``repo/name/version/model.onnx`` (TINY_MLP by default)."""
    write_mlp(repo / name / str(version) / "model.onnx", **{**TINY_MLP, **shape})
    if config is not None:
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    return repo / name


# -- request bodies -------------------------------------------------------------------------

#: One row for a synthetic model (input X of 2 floats).
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}

#: A node report with one resident measured model ("a") and one absent ("b").
REPORT = {"capacity": {"cores": 4, "cpu_memory_bytes": 1_000_000_000},
          "models": {"a": {"resident": True, "size_bytes": 1000,
                           "arrivals": [[1.0, 5.0, 100]],
                           "batches": {"1": {"count": 100, "seconds": 2.0}},
                           "latency_ms": {"p50": 20, "p99": 40}},
                     "b": {"resident": False}}}


def v2_body(data, datatype="FP32", shape=(1, 4), name="X") -> dict:
    """A KServe v2 infer request with one input tensor."""
    return {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape),
                        "data": data}]}


def request(url: str, method: str = "GET", body=None, timeout: float = 10, context=None):
    """(status, parsed JSON, headers) for one JSON request (``context``: an
    ``ssl.SSLContext`` for https)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def call(port: int, method: str, path: str, body=None, token: str | None = None, conn=None,
         context=None, *, source: str | None = None,
         headers: dict | None = None) -> tuple[int, object]:
    """(status, parsed JSON or text) for one request to 127.0.0.1:``port``: on ``conn``
    (a kept connection) or a new one (TLS with ``context``; from the loopback address
    ``source``), with ``token`` as a bearer token and ``headers`` besides."""
    import http.client

    own = conn is None
    if own:
        conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
                if context else http.client.HTTPConnection(
                    "127.0.0.1", port, timeout=30,
                    source_address=(source, 0) if source else None))
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, sent)
        answer = conn.getresponse()
        raw = answer.read()
        try:
            return answer.status, json.loads(raw)
        except ValueError:
            return answer.status, raw.decode()
    finally:
        if own:
            conn.close()


# -- waiting and ports ----------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
             step: float = 0.05) -> Any:
    """``predicate()``'s first true value, polled every ``step`` s for ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s: {what}")


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A loopback TCP port that stays this test's while the block runs, for a server that
    must be told its port before it starts (a gRPC port, a restart on the same port), or
    for an address where nothing listens. A socket holds it, bound and never listening,
    with SO_REUSEADDR and SO_REUSEPORT: servers (which set either) may bind it beside
    the holder, while the kernel hands it to no other bind to port 0 and no outgoing
    connection. Prefer port 0 and reading back the bound port where a server can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


# -- certificates made on the fly -----------------------------------------------------------


class Issued:
    """A certificate and its key, as objects and as PEM files (``cert_file``,
    ``key_file``); a CA's ``cert_file`` is what a peer trusts."""

    def __init__(self, cert, key, directory: Path, name: str) -> None:
        from cryptography.hazmat.primitives import serialization

        self.cert, self.key, self.name = cert, key, name
        self.cert_file, self.key_file = directory / f"{name}.crt", directory / f"{name}.key"
        self.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))


def _certificate(subject: str, issuer: Issued | None, *, ca: bool, not_before=None,
                 not_after=None, hosts=(), key_type: str = "ec"):
    """(certificate, key): EC P-256 (``key_type`` "rsa": RSA-2048, for comparing
    handshake costs), signed by ``issuer`` (None: by itself)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if key_type == "rsa":
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer.cert.subject if issuer else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(not_before or now - datetime.timedelta(hours=1))
               .not_valid_after(not_after or now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(h)) if h[0].isdigit() else x509.DNSName(h)
             for h in hosts]), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    return builder.sign(issuer.key if issuer else key, hashes.SHA256()), key


def make_ca(directory: Path, name: str = "test-ca", key_type: str = "ec") -> Issued:
    """A self-signed CA whose files are written to ``directory``."""
    return Issued(*_certificate(name, None, ca=True, key_type=key_type), directory, name)


def issue_cert(ca: Issued, directory: Path, name: str, *, not_before=None, not_after=None,
               hosts=("127.0.0.1", "localhost"), key_type: str = "ec") -> Issued:
    """A leaf certificate for ``name`` signed by ``ca``, valid for ``hosts`` (server
    and client use alike); ``not_after`` in the past: an expired one."""
    if not_after is not None and not_before is None:
        import datetime

        not_before = not_after - datetime.timedelta(days=1)
    return Issued(*_certificate(name, ca, ca=False, not_before=not_before,
                                not_after=not_after, hosts=hosts, key_type=key_type),
                  directory, name)


def mutual_tls(server: Issued, ca: Issued) -> dict:
    """The ``tls:`` section of a server on ``server``'s certificate that requires a
    client certificate ``ca`` issued."""
    return {"cert_file": str(server.cert_file), "key_file": str(server.key_file),
            "client_ca_file": str(ca.cert_file), "client_auth": "require"}


# -- real servers in this process -----------------------------------------------------------


class ThreadedServer:
    """A real aiohttp app on 127.0.0.1 in a background thread (own event loop), so that
    blocking clients such as ``tritonclient.http`` can call it from the test; HTTPS with
    ``ssl_context``."""

    def __init__(self, app, ssl_context=None):
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.ssl_context = ssl_context
        self.app = app
        self.runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.closed = False
        self.call(self._start())

    async def _start(self):
        from aiohttp import web

        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def call(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class AgentServer(ThreadedServer):
    """A real agent on 127.0.0.1 (see ``ThreadedServer``), started and ready."""

    def __init__(self, config, **node_kwargs):
        from agent.node.app import NODE, create_app, prepare_process

        from agent.security.tls import ServerTls

        prepare_process()  # as ``edgeagent serve`` does
        self.tls = ServerTls(config.tls) if config.tls is not None else None
        super().__init__(create_app(config, **node_kwargs),
                         ssl_context=self.tls.context if self.tls else None)
        self.node = self.app[NODE]
        self.node.router.listening(self.url, None)
        self.call(self.node.wait_ready())

    def request(self, method, path, body=None, headers=None):
        """(status, headers, parsed JSON or raw bytes) for one HTTP request."""
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, hdrs, raw = resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            status, hdrs, raw = err.code, dict(err.headers), err.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw


class CoordinatorServer(ThreadedServer):
    """A real coordinator on 127.0.0.1 in a background thread (see ``ThreadedServer``)."""

    def __init__(self, config, **kwargs):
        from agent.coordinator.app import COORDINATOR, create_app

        app = create_app(config, **kwargs)
        tls = app[COORDINATOR].tls
        super().__init__(app, ssl_context=tls.context if tls else None)
        self.co = self.app[COORDINATOR]

    def request(self, method, path, body=None, token=None, raw=None):
        """(status, parsed JSON) for one request (a plan may take a while on a loaded
        box: it waits up to 120 s)."""
        data = raw if raw is not None else (json.dumps(body).encode()
                                            if body is not None else None)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


# -- real servers as processes --------------------------------------------------------------


class Agent:
    """``edgeagent serve`` in its own process on ports the OS picks (``extra`` flags come
    last and override), ready; ``url`` as it announced it. ``before``: Python run in
    that process before the command (``"import gc; gc.disable()"``); ``context``: the
    ``ssl.SSLContext`` its https URL takes."""

    def __init__(self, repo, data_dir, *extra, env=None, before=None, context=None):
        self.context = context
        command = [EDGEAGENT] if before is None else [
            sys.executable, "-c", f"{before}\nfrom agent.cli import main; main()"]
        self.proc = subprocess.Popen(
            [*command, "serve", "--repository", str(repo), "--port", "0", "--grpc-port", "0",
             "--data-dir", str(data_dir), "--cpu-budget", "500MB", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline()
        assert "listening on" in line, line + self.proc.stderr.read()
        self.url = line.split()[3]
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        self.wait_for(lambda: self.get("/v2/health/ready") is not None)

    def get(self, path, method="GET", timeout=10):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError:
            return None

    def states(self):
        return {m["name"]: m["state"] for m in self.get("/v1/cache")}

    @staticmethod
    def wait_for(pred, timeout=20):
        return wait_for(pred, timeout)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


class CoordinatorProcess:
    """``edgeagent coordinator serve`` in its own process, on ``store`` (None: the SQLite
    file in ``state``), on the port in ``config`` (default 0: the OS picks, read back from
    the URL it announces), ready; ``context``: the ``ssl.SSLContext`` its https URL
    takes."""

    def __init__(self, store: str | None, state: Path, *, context=None, **config) -> None:
        self.context = context
        state.mkdir(parents=True, exist_ok=True)
        cfg = {"port": 0, "state_dir": str(state), "log_level": "warning",
               "reactive_interval_s": 1, "plan_interval_s": 3600,
               **({"store": store} if store else {}), **config}
        (state / "coordinator.yaml").write_text(json.dumps(cfg))
        self.log_path = state / "coordinator.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from agent.cli import main; main()", "coordinator",
             "serve", "--config", str(state / "coordinator.yaml")], cwd=ROOT,
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = wait_for(self._announced, 120, "the coordinator announces its URL")
        self.port = int(self.url.rsplit(":", 1)[1])
        wait_for(self.up, 60, "the coordinator answers /v1/health")

    def _announced(self) -> str | None:
        assert self.proc.poll() is None, self.log_path.read_text()
        for line in self.log_path.read_text().splitlines():
            if "coordinator listening on " in line:
                return line.split("listening on ")[1].split()[0]
        return None

    def up(self) -> bool:
        try:
            return request(f"{self.url}/v1/health", timeout=2, context=self.context)[0] == 200
        except OSError:
            return False

    def get(self, path: str):
        return request(self.url + path, context=self.context)[:2]

    def post(self, path: str, body=None):
        return request(self.url + path, "POST", body, context=self.context)

    def plans(self) -> bool:
        return self.get("/v1/health")[1]["planner"]

    def nodes(self) -> list[str]:
        return [n["name"] for n in self.get("/v1/nodes")[1]]

    def stop(self) -> None:
        """SIGTERM, as systemd stops it (it writes what it answered first); SIGKILL only
        after a minute."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- in-process serving (a ModelCache and Serving, no HTTP) ---------------------------------


class Recorder:
    """A backend factory that records the input shapes of every backend call."""

    def __init__(self, cls=None):
        from agent.backends.synthetic import SyntheticBackend

        self.cls, self.calls = cls or SyntheticBackend, []

    def __call__(self, kind, name, version, path, config, footprints):
        backend = self.cls(name, version, path, config, footprints)
        calls, original = self.calls, backend.infer_async

        async def infer_async(inputs, parameters, executor):
            calls.append((name, {k: v.shape for k, v in inputs.items()}))
            return await original(inputs, parameters, executor)
        backend.infer_async = infer_async
        return backend


class ServingListener:
    """The cache's listener where a test runs serving without a node: it tells
    ``serving`` of loads and unloads, as ``agent.node.node.Node`` does."""

    serving = None

    def model_loaded(self, entry):
        self.serving.model_loaded(entry)

    def model_unloaded(self, entry, reason):
        self.serving.model_unloaded(entry, reason)


async def start_serving(repo, backend_factory=None, clock=None, **config):
    """(cache, serving) over ``repo`` with a 1 GB CPU budget (``clock``: serving's)."""
    from agent.config import AgentConfig
    from agent.node.cache import ModelCache
    from agent.node.repository import scan_repository
    from agent.node.serving import Serving

    kwargs = {"backend_factory": backend_factory} if backend_factory else {}
    listener = ServingListener()
    cache = ModelCache(scan_repository(repo), {"cpu": 10**9}, listener=listener, **kwargs)
    listener.serving = Serving(cache, AgentConfig(repository=repo, **config), None,
                               **({"clock": clock} if clock else {}))
    return cache, listener.serving


async def stop_serving(cache, serving):
    await serving.close()
    await cache.close()


async def call_model(serving, name, x, timeout=None, parameters=None):
    """Model ``name``'s output Y for input X = ``x`` through ``serving``."""
    from agent.node.call import Call, Decoded

    _, out = await serving.infer(Call(name, None, "v2", serving.clock(), Decoded({"X": x}),
                                      parameters or {}, timeout=timeout))
    return out["Y"]


class LagMonitor:
    """Largest event-loop lag seen while active: a run during which the machine stalled
    (another job's memory reclaim can freeze it for a second) says nothing about the
    agent, and is measured again."""

    def __init__(self):
        self.worst, self._task = 0.0, None

    async def _watch(self):
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - t - 0.01)

    async def __aenter__(self):
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, *exc):
        self._task.cancel()


async def without_stalls(measure, attempts=3, max_lag=0.08):
    """``await measure()`` again (up to ``attempts``) while the machine stalled during it."""
    for _ in range(attempts):
        async with LagMonitor() as lag:
            result = await measure()
        if lag.worst <= max_lag:
            break
    return result


# -- load: open loops (Poisson arrivals) and closed loops ----------------------------------


async def open_loop(serving, name, rate, seconds, seed=1, record_after=0.0):
    """Poisson arrivals of 1-row requests at ``rate`` per second through ``serving``:
    (latencies of the successes after ``record_after`` s, (seconds, Shed) of each 503,
    requests sent)."""
    from agent.node.admission import Shed

    rng, x = random.Random(seed), np.ones((1, 4), np.float32)
    latencies, shed = [], []
    begin = serving.clock()

    async def one():
        t = serving.clock()
        try:
            await call_model(serving, name, x)
        except Shed as exc:
            shed.append((serving.clock() - t, exc))
            return
        if t - begin >= record_after:
            latencies.append(serving.clock() - t)

    tasks, nxt, end = [], time.perf_counter(), time.perf_counter() + seconds
    while nxt < end:
        nxt += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return latencies, shed, len(tasks)


async def closed_loop(serving, name, clients, seconds):
    """``clients`` clients sending 1-row requests back to back through ``serving`` (one
    that is shed waits 10 ms): requests answered per second."""
    from agent.node.admission import Shed

    done, x = 0, np.ones((1, 4), np.float32)
    end = time.perf_counter() + seconds

    async def client():
        nonlocal done
        while time.perf_counter() < end:
            try:
                await call_model(serving, name, x)
            except Shed:
                await asyncio.sleep(0.01)
                continue
            done += 1
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / seconds


async def http_open_loop(url, rate, seconds, seed=0):
    """Poisson arrivals of 1-row v2 requests at ``rate`` per second to ``url`` over HTTP:
    ([(status, seconds, headers, body)], requests sent)."""
    import aiohttp

    rng = np.random.default_rng(seed)
    body = json.dumps(v2_body([1.0, 1.0], shape=(1, 2))).encode()
    results = []
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one():
            t = time.perf_counter()
            async with session.post(url, data=body) as r:
                payload = await r.json()
                results.append((r.status, time.perf_counter() - t, dict(r.headers), payload))
        tasks, nxt = [], time.perf_counter()
        end = nxt + seconds
        while nxt < end:
            nxt += rng.exponential(1 / rate)
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return results, len(tasks)


class SteadyClient:
    """v2 infer requests for ``model`` at ``rate`` per second in a thread until
    ``stop``: each answer's (status, served version) in ``answers``, when it came in
    ``times`` (a client that keeps calling through a rollout)."""

    def __init__(self, agent, model, rate=50.0, body=None):
        self.agent, self.model, self.period = agent, model, 1.0 / rate
        self.body = body or v2_body([1.0, 2.0, 3.0, 4.0])
        self.answers: list[tuple[int, str | None]] = []
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        next_at = time.monotonic()
        while not self._stop.is_set():
            status, _, body = self.agent.request("POST", f"/v2/models/{self.model}/infer",
                                                 self.body)
            self.answers.append((status, body.get("model_version")
                                 if isinstance(body, dict) else None))
            self.times.append(time.monotonic())
            next_at += self.period
            time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        return self.answers


def churn(store, rng: random.Random, nodes: list[str], now: float,
          body: Callable[[str], dict], *, report: float, renew: float,
          delete: float, first: bool = False) -> None:
    """One 10 s interval of a fleet written to a coordinator's ``store``: each node, by
    one roll of ``rng``, sends a new full report (below ``report``, or every node when
    ``first``; ``body(node)`` its body; one in five stored without a summary, as an
    older coordinator wrote them), renews its lease (below ``renew``), is deleted
    (below ``delete``) or stays silent, at a time in (``now``, ``now + 10``)."""
    import orjson

    from agent.coordinator.ingest import report_record
    from agent.coordinator.store import ReportRecord
    from agent.wire import parse_report

    records, renewed = [], {}
    for node in nodes:
        roll = rng.random()
        at = now + rng.uniform(0.1, 9.9)  # strictly after the last report
        if roll < report or first:
            raw = orjson.dumps(body(node))
            record = report_record(node, raw, parse_report(node, raw), at)
            records.append(record if rng.random() < 0.8 else ReportRecord(node, raw, {}, at))
        elif roll < renew:
            renewed[node] = at
        elif roll < delete:
            store.delete_node(node)
    store.write_reports(records, renewed)


def zipf_workload(seed=5, models=12, requests=240, rate=12.0):
    """A trace for a live agent and the simulator alike: Zipf (s = 0.9) over ``models``
    synthetic models, Poisson arrivals at ``rate``; (names, sizes, load seconds, exec
    seconds, trace, profiles)."""
    from cachepolicies.traces import make_profiles, make_trace

    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(models)]
    sizes = rng.integers(10, 40, models) * 1_000_000
    loads = rng.uniform(0.2, 0.5, models)
    execs = rng.uniform(0.06, 0.12, models)  # well above the HTTP round trip
    weights = 1 / np.arange(1, models + 1) ** 0.9
    picks = rng.choice(models, requests, p=weights / weights.sum())
    times = np.cumsum(rng.exponential(1 / rate, requests))
    profiles = make_profiles(names, sizes, loads, execs)
    trace = make_trace(times - times[0], [names[i] for i in picks], profiles)
    return names, sizes, loads, execs, trace, profiles


def add_workload_models(repo, names, sizes, loads, execs) -> None:
    """``zipf_workload``'s models as synthetic models in ``repo``: one worker per request
    (none waits for a worker, as in the simulator's queueing with many workers)."""
    for name, size, load, exe in zip(names, sizes, loads, execs):
        add_synthetic(repo, name, size_bytes=int(size), load_ms=float(load) * 1000,
                      base_ms=float(exe) * 1000, max_batch_size=0, slo={"latency_ms": 60000},
                      batching={"workers": 64})


def cremebrulee_workload(seed=7, rate=5.0, seconds=90.0, compress=20.0, zipf=0.9):
    """The twin's workload (issue 25): the 26 shipped CremeBrulee profiles as synthetic
    models (published sizes; load and exec times / ``compress``), Poisson arrivals at
    ``rate`` for ``seconds``, Zipf popularity (exponent ``zipf``) in a seeded order;
    (names, sizes, loads, execs, trace, profiles)."""
    from cachepolicies.traces import (cremebrulee_profiles_path, make_profiles, make_trace,
                                      read_profiles)

    shipped = read_profiles(cremebrulee_profiles_path())
    rng = np.random.default_rng(seed)
    names = list(shipped.names)
    sizes = shipped.size_bytes
    loads = shipped.penalty_seconds / compress
    execs = shipped.exec_seconds / compress
    weights = 1 / np.arange(1, len(names) + 1) ** zipf
    order = rng.permutation(len(names))  # which model is the most popular: seeded
    times = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    times = times[times < seconds]
    picks = order[rng.choice(len(names), len(times), p=weights / weights.sum())]
    # the synthetic models' batches cost base_ms whatever their rows
    profiles = make_profiles(names, sizes, loads, execs,
                             exec_seconds_per_row=np.zeros(len(names)))
    trace = make_trace(times, [names[i] for i in picks], profiles)
    return names, sizes, loads, execs, trace, profiles


async def replay_live(url, trace, names):
    """Send each request of ``trace`` to the agent at ``url`` at its trace time (open
    loop); [(response seconds, status)]."""
    import aiohttp

    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def one(at, model):
            await asyncio.sleep(max(at - (time.perf_counter() - start), 0))
            sent = time.perf_counter()
            async with session.post(f"{url}/v2/models/{model}/infer", json=BODY) as r:
                await r.read()
                results.append((time.perf_counter() - sent, r.status))

        await asyncio.gather(*(one(float(t), names[m]) for t, m in
                               zip(trace.timestamps, trace.model_ids)))
    return results


# -- three tiers: remote -> disk -> memory (issue 26) ---------------------------------------


@dataclass(frozen=True)
class ThreeTier:
    """A three-tier replay's workload: profiles (with ``download_seconds`` and
    ``disk_bytes``), the trace, and the memory and disk capacities (bytes)."""

    profiles: Any
    trace: Any
    memory_bytes: int
    disk_bytes: int


def three_tier_workload(seed: int = 1, models: int = 40, requests: int = 480,
                        rate: float = 8.0, zipf: float = 0.9, in_memory: int = 6,
                        on_disk: int = 15, download: tuple[float, float] = (0.05, 3.0)
                        ) -> ThreeTier:
    """Zipf (``zipf``) over ``models`` synthetic models, popularity independent of the
    download seconds (log-uniform in ``download``: a fast mirror to a slow remote store),
    Poisson arrivals at ``rate``; memory for ``in_memory`` models of mean size, disk for
    ``on_disk`` models' files of mean size."""
    from cachepolicies.traces import make_profiles, make_trace

    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(models)]
    size = rng.integers(10, 40, models) * 1_000_000
    disk = rng.integers(1, 5, models) * 500_000
    load = rng.uniform(0.1, 0.25, models)
    execs = rng.uniform(0.06, 0.12, models)  # well above the HTTP round trip
    seconds = np.exp(rng.uniform(*np.log(download), models))
    weights = 1 / np.arange(1, models + 1) ** zipf
    weights = weights[rng.permutation(models)]
    picks = rng.choice(models, requests, p=weights / weights.sum())
    times = np.cumsum(rng.exponential(1 / rate, requests))
    profiles = make_profiles(names, size, load, execs, download_seconds=seconds,
                             disk_bytes=disk)
    trace = make_trace(times - times[0], [names[i] for i in picks], profiles)
    return ThreeTier(profiles, trace, int(in_memory * size.mean()), int(on_disk * disk.mean()))


def replay_three_tiers(work: ThreeTier, policy: str, tmp: Path, **config):
    """``work`` replayed in real time against an agent with ``policy`` on both tiers.
    Its models are synthetic (the profiles' size, load and run times) and sourced over
    HTTP: files of their ``disk_bytes`` that a ``RangeServer`` sends after waiting their
    download seconds. (results as ``replay_live``'s, ``/v1/cache``, the server's
    ``served``); ``config``: more agent settings (default: 32 pulls and 32 loads at
    once; the twin replays the 32 load slots, its pulls are unbounded)."""
    import hashlib

    from agent.config import AgentConfig
    from tests.servers import range_http_server

    p, remote, repo = work.profiles, tmp / "remote", tmp / "models"
    rng = np.random.default_rng(0)
    with range_http_server(remote) as server:
        for i, name in enumerate(p.names):
            data = rng.bytes(int(p.disk_bytes[i]))
            (remote / name).mkdir(parents=True)
            (remote / name / "model.bin").write_bytes(data)
            server.delays[f"{name}/model.bin"] = float(p.download_seconds[i])
            add_synthetic(repo, name, size_bytes=int(p.size_bytes[i]),
                          load_ms=float(p.load_seconds[i]) * 1000,
                          base_ms=float(p.exec_seconds[i]) * 1000, max_batch_size=0,
                          slo={"latency_ms": 60000}, batching={"workers": 64},
                          source=f"{server.url}/{name}/model.bin",
                          source_options={"sha256": hashlib.sha256(data).hexdigest()})
        agent = AgentServer(AgentConfig(
            repository=repo, data_dir=tmp / "data", cpu_budget=work.memory_bytes,
            disk_budget=work.disk_bytes, policy=policy, infer_threads=2,
            **{"max_concurrent_pulls": 32, "load_concurrency": 32, **config}),
            budgets={"cpu": work.memory_bytes})
        try:
            results = asyncio.run(replay_live(agent.url, work.trace, p.names))
            listing = agent.request("GET", "/v1/cache")[2]
        finally:
            agent.close()
    return results, listing, server.served


# -- a runtime that fails on demand ---------------------------------------------------------


class FailingSession:
    """A real ONNX Runtime session whose next ``fail`` runs raise ORT's own
    RuntimeException. A double because ONNX Runtime cannot be made to fail on demand with
    a valid model and input (a real one is a device error or a failed allocation deep in a
    kernel); the exception is ORT's class, so the backend classifies what ORT raises."""

    def __init__(self, real, faults: dict) -> None:
        self.real, self.faults = real, faults

    def run(self, outputs, feed, *args):
        from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

        with self.faults["lock"]:
            fail = self.faults["left"] > 0
            self.faults["left"] -= fail
        if fail:
            time.sleep(0.05)  # mid-run: requests batched with it fail with it
            raise RuntimeException("Non-zero status code returned while running Gemm node. "
                                   "Name:'gemm0' Status Message: injected fault")
        return self.real.run(outputs, feed, *args)

    def __getattr__(self, name):
        return getattr(self.real, name)


class FaultyFactory:
    """``make_backend`` with the ``FailingSession`` double around model ``name``'s
    session after each load; counts the loads."""

    def __init__(self, name: str) -> None:
        self.name, self.loads = name, 0
        self.faults = {"left": 0, "lock": threading.Lock()}

    def __call__(self, kind, name, *args, **kwargs):
        from agent.backends import make_backend

        backend = make_backend(kind, name, *args, **kwargs)
        if name != self.name:
            return backend
        real_load, factory = backend.load, self

        def load(*a, **k):
            result = real_load(*a, **k)
            backend.session = FailingSession(backend.session, factory.faults)
            factory.loads += 1
            return result

        backend.load = load
        return backend


# -- the planner on a fake clock ------------------------------------------------------------


class Clock:
    """A clock that moves only when a test sets ``t``."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def node_report(models: dict, cores: float = 4, memory: float = 1e9) -> dict:
    """A node report's body with these ``models``."""
    return {"capacity": {"cores": cores, "cpu_memory_bytes": memory}, "models": models}


def feed(store, clock, node, rates: dict[str, float], models: dict, *, steps=12, dt=5.0,
         cores=4, also=()):
    """``steps`` reports ``dt`` apart, each with ``rate × dt`` arrivals per model; ``also``:
    more (node, rates, models) reporting at the same times."""
    for _ in range(steps):
        clock.t += dt
        for name, node_rates, node_models in ((node, rates, models), *also):
            arrivals = {m: [(clock.t, dt, r * dt)] for m, r in node_rates.items()}
            store.record_report(name, node_report(node_models, cores), arrivals, clock.t,
                                keep_s=120)


# -- numba's kernels ------------------------------------------------------------------------

#: Compile (or load) the kernels most tests reach: Faro's solver (the coordinator's
#: planning), and every policy with the simulator's compiled loop.
_WARM_KERNELS = ("""
from agent.coordinator.faro import Capacity, JobSpec, Problem, solve
solve(Problem(Capacity(8, 1e12), (JobSpec("a", 20.0, 0.05, 0.2, 99.0, 1.0, 1.0, 1e8),)))
""", """
from cachepolicies import POLICY_NAMES
from cachepolicies.registry import prime_policy
from cachepolicies.simulator import simulate
from cachepolicies.traces import make_profiles, make_trace
profiles = make_profiles(["a", "b", "c"], [10, 10, 10], [1.0, 2.0, 3.0], [0.1, 0.1, 0.1])
trace = make_trace([0.0, 1.0, 2.0, 3.0], ["a", "b", "c", "a"], profiles)
for name in POLICY_NAMES:
    prime_policy(name)
    simulate(trace, profiles, 20, name, seed=1)
""")


def warm_kernel_caches() -> None:
    """Compile numba's kernels into their on-disk caches (beside the sources) once, in
    two children side by side, where a fresh checkout has none: the test processes
    started afterwards load them instead of each compiling the same kernels at once
    (~25 s of CPU per process and package)."""
    if any(p for d in ("agent/coordinator/faro", "cachepolicies")
           for p in (ROOT / d / "__pycache__").glob("*.nbi")):
        return
    env = {**os.environ, "EDGEAGENT_JIT": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    children = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
                for code in _WARM_KERNELS]
    for child in children:
        child.wait(600)


# -- the compiled policy kernels ------------------------------------------------------------


def run_pytest_compiled(*args: str, timeout: float = 600) -> None:
    """pytest ``args`` in a child process whose policy kernels are compiled
    (``EDGEAGENT_JIT=1``, numba): the test processes run them interpreted, as ``edgeagent
    serve`` does (conftest.py), and the choice is made once per process
    (``cachepolicies.jit``). Fails with the child's report."""
    env = {**os.environ, "EDGEAGENT_JIT": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
