"""What TLS costs a request: the same agent build served in the clear, over TLS and over
mutual TLS (three agent processes side by side, certificates made on the fly), through
HTTP (aiohttp, KServe v2 with a binary tensor) and gRPC (KServe v2 ModelInfer,
``raw_input_contents``), with one kept connection (keep-alive; one gRPC channel) and
with a new connection per request (its TCP and TLS handshakes included), for a small
(1 KiB) and a 1 MiB input. Modes take turns in rounds, so load on the machine falls
on all three alike. ``handshake``: a new connection (Python's ssl), its handshake and
one ``GET /v2/health/live`` answered, the least a new connection costs; ``handshake
resumed``: the same with the TLS session of the connection before (a client that keeps
the agent's session ticket).

Prints p50/p99 per case and mode, TLS's and mTLS's p50 against plain in the same run
(ratio and milliseconds added), and the agent's own CPU per request in each mode (user
and system time of its process over the case: what TLS costs the server, apart from
the client's share and from the box's load). The HTTP client runs on uvloop where it
is installed, as the agent does (asyncio's own TLS transport is Python code, which
would bill the client's TLS to the comparison), with glibc's mmap threshold set as
the agent sets it (``tune_malloc``: at glibc's default, uvloop's 256 KiB read of each
TLS record maps fresh memory, 20-25 us per response on the client's side).

    .venv/bin/python bench/tls_overhead.py [--requests 400] [--rounds 5] [--key rsa]
        [--cases handshake]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from agent.memory import tune_malloc  # noqa: E402
from agent.security.tls import client_context  # noqa: E402
from bench.pressure import free_port  # noqa: E402
from tests.helpers import add_synthetic, issue_cert, make_ca  # noqa: E402

MODES = ("plain", "tls", "mtls")
SIZES = {"1KiB": 256, "1MiB": 262144}  # FP32 values of the input


class Target:
    """One agent process serving ``mode``: its ports and a client's TLS context."""

    def __init__(self, mode: str, repo: Path, work: Path, pki: dict) -> None:
        self.mode = mode
        self.grpc_port = free_port()
        config: dict = {"repository": str(repo), "port": 0, "grpc_port": self.grpc_port,
                        "data_dir": str(work / f"data-{mode}"), "cpu_budget": "1GiB",
                        "log_level": "warning"}
        if mode != "plain":
            config["tls"] = {"cert_file": str(pki["server"].cert_file),
                             "key_file": str(pki["server"].key_file)}
        if mode == "mtls":
            config["tls"] |= {"client_ca_file": str(pki["ca"].cert_file),
                              "client_auth": "require"}
        path = work / f"agent-{mode}.yaml"
        path.write_text(json.dumps(config))
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("edgeagent")), "serve", "--config", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"the {mode} agent did not start: {line}")
        self.url = line.split()[3]
        self.process = psutil.Process(self.proc.pid)
        self.port = int(self.url.rsplit(":", 1)[1])
        client = pki["client"] if mode == "mtls" else None
        self.ssl = None if mode == "plain" else client_context(
            pki["ca"].cert_file, client and client.cert_file, client and client.key_file)
        self.pem = (pki["ca"].cert_file.read_bytes(),
                    client.key_file.read_bytes() if client else None,
                    client.cert_file.read_bytes() if client else None)

    def cpu_s(self) -> float:
        """The agent process's CPU seconds so far (user and system)."""
        times = self.process.cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def http_body(values: int) -> tuple[bytes, dict]:
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, values],
                                     "parameters": {"binary_data_size": values * 4}}],
                         "outputs": [{"name": "Y"}]}).encode()
    raw = np.ones(values, dtype=np.float32).tobytes()
    return header + raw, {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"}


async def http_times(t: Target, values: int, n: int, keep: bool) -> list[float]:
    import aiohttp

    body, headers = http_body(values)
    url = f"{t.url}/v2/models/m/infer"
    out = []
    connector = aiohttp.TCPConnector(ssl=t.ssl or False, force_close=not keep)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(n + (3 if keep else 0)):
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            if i >= (3 if keep else 0):  # keep-alive: the first requests open it
                out.append(time.perf_counter() - t0)
    return out


def grpc_times(t: Target, values: int, n: int, keep: bool) -> list[float]:
    import grpc

    from agent.node.protos import grpc_predict_v2_pb2 as pb
    from agent.node.protos import grpc_predict_v2_pb2_grpc as pb_grpc

    req = pb.ModelInferRequest(model_name="m", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1, values])],
        raw_input_contents=[np.ones(values, dtype=np.float32).tobytes()])
    options = [("grpc.max_receive_message_length", -1)]
    target = f"127.0.0.1:{t.grpc_port}"

    def channel():
        if t.mode == "plain":
            return grpc.insecure_channel(target, options)
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(*t.pem), options)

    out = []
    kept = channel() if keep else None
    if kept is not None:
        for _ in range(3):
            pb_grpc.GRPCInferenceServiceStub(kept).ModelInfer(req, timeout=30)
    for _ in range(n):
        t0 = time.perf_counter()
        ch = kept or channel()
        pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
        if kept is None:
            ch.close()
        out.append(time.perf_counter() - t0)
    if kept is not None:
        kept.close()
    return out


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def handshake_times(t: Target, n: int, resume: bool = False) -> list[float]:
    """Connect, handshake and one health check read to the end (the server has
    finished its side of the handshake too); the socket closed after. ``resume``: each
    connection resumes the last one's TLS session (a TLS 1.3 ticket the agent issued:
    no certificates sent or checked)."""
    out, session = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", t.port)) as raw:
            s = t.ssl.wrap_socket(raw, server_hostname="127.0.0.1", session=session) \
                if t.ssl else raw
            s.sendall(LIVE)
            while s.recv(65536):
                pass
            if resume and t.ssl:
                session = s.session
        out.append(time.perf_counter() - t0)
    return out


def run_loop(main) -> Any:
    """Run the coroutine ``main`` on uvloop where it is installed (as the agent does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000.0, q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400,
                    help="requests per case and mode (a tenth for new connections "
                         "with 1 MiB)")
    ap.add_argument("--rounds", type=int, default=5, help="turns the modes take")
    ap.add_argument("--key", choices=("ec", "rsa"), default="ec",
                    help="the certificates' keys: EC P-256 (default) or RSA-2048")
    ap.add_argument("--cases", default="",
                    help="only the cases whose name starts with one of these "
                         "(comma-separated: handshake,http keep-alive 1KiB,grpc,...)")
    args = ap.parse_args()
    tune_malloc()  # the client reads TLS records as the agent does (see the docstring)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "pki").mkdir()
        ca = make_ca(work / "pki", key_type=args.key)
        pki = {"ca": ca, "server": issue_cert(ca, work / "pki", "server", key_type=args.key),
               "client": issue_cert(ca, work / "pki", "client", key_type=args.key)}
        repo = work / "models"
        add_synthetic(repo, "m", size_bytes=1_000_000, max_batch_size=0)
        targets = {m: Target(m, repo, work, pki) for m in MODES}
        try:
            run(targets, args)
        finally:
            for t in targets.values():
                t.stop()


def run(targets: dict[str, Target], args) -> None:
    cases = [("handshake", "new", None), ("handshake", "resumed", None)] + [
        (proto, conn, size) for proto in ("http", "grpc") for conn in ("keep-alive", "new")
        for size in SIZES]
    print(f"{'case':<28}" + "".join(f"{m + ' p50/p99 ms':>22}" for m in MODES)
          + f"{'tls vs plain':>22}{'mtls vs plain':>22}"
          + f"{'agent CPU/request us':>24}")
    wanted = [c for c in args.cases.split(",") if c]
    for proto, conn, size in cases:
        name = f"{proto} {conn}" + (f" {size}" if size else " + GET live")
        if wanted and not any(name.startswith(c) for c in wanted):
            continue
        n = args.requests // (10 if conn == "new" and size == "1MiB" else 1)
        per_round = max(1, n // args.rounds)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        cpu = {m: 0.0 for m in MODES}
        for _ in range(args.rounds):
            for mode, t in targets.items():
                keep = conn == "keep-alive"
                cpu0 = t.cpu_s()
                if proto == "handshake":
                    times[mode] += handshake_times(t, per_round, resume=conn == "resumed")
                elif proto == "http":
                    times[mode] += run_loop(http_times(t, SIZES[size], per_round, keep))
                else:
                    times[mode] += grpc_times(t, SIZES[size], per_round, keep)
                cpu[mode] += t.cpu_s() - cpu0
        base = pct(times["plain"], 50)
        cells = "".join(f"{pct(times[m], 50):>12.3f} / {pct(times[m], 99):<7.3f}"
                        for m in MODES)
        vs = "".join(f"{pct(times[m], 50) / base:>10.2f}x {pct(times[m], 50) - base:+8.3f}ms"
                     for m in ("tls", "mtls"))
        per_request = " / ".join(f"{cpu[m] / len(times[m]) * 1e6:.0f}" for m in MODES)
        print(f"{name:<28}{cells}{vs}{per_request:>24}", flush=True)


if __name__ == "__main__":
    main()
