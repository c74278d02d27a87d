"""TLS on every listener and client, on real sockets with certificates made here: trust,
client certificates, reloads that keep connections, the reporter's errors, report
workers, and the refusal to serve a non-loopback address in the clear."""

from __future__ import annotations

import datetime
import http.client
import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest

from agent.config import CoordinatorLink
from agent.node.protos import grpc_predict_v2_pb2 as pb
from agent.node.protos import grpc_predict_v2_pb2_grpc as pb_grpc
from agent.security.tls import ServerTls, TlsSettings, client_context
from tests.helpers import (BODY, EDGEAGENT, REPORT, Agent, CoordinatorProcess,
                           add_synthetic, issue_cert, make_ca, request, wait_for)

PAST = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)


@pytest.fixture
def pki(tmp_path):
    """Two CAs (``ca`` and a ``foreign`` one), a server, a client of each, an expired
    client, as ``Issued`` objects whose files lie in tmp_path."""
    d = tmp_path / "pki"
    d.mkdir()
    ca, foreign = make_ca(d, "ca"), make_ca(d, "foreign-ca")
    return {"ca": ca, "foreign": foreign, "server": issue_cert(ca, d, "server"),
            "client": issue_cert(ca, d, "client"),
            "foreign_client": issue_cert(foreign, d, "foreign-client"),
            "expired_client": issue_cert(ca, d, "expired-client", not_after=PAST)}


def settings(pki, **extra) -> TlsSettings:
    return TlsSettings(cert_file=pki["server"].cert_file, key_file=pki["server"].key_file,
                       **extra)


def trusting(issued, client=None) -> ssl.SSLContext:
    """A client context trusting ``issued`` (a CA), with ``client``'s certificate."""
    return client_context(issued.cert_file, client and client.cert_file,
                          client and client.key_file)


def get(url: str, context: ssl.SSLContext, timeout: float = 5.0):
    with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
        return resp.status


def grpc_live(port: int, ca, client=None, timeout: float = 5.0) -> bool:
    """ServerLive over TLS trusting ``ca`` (as ``client`` when given)."""
    creds = grpc.ssl_channel_credentials(
        ca.cert_file.read_bytes(), client and client.key_file.read_bytes(),
        client and client.cert_file.read_bytes())
    with grpc.secure_channel(f"localhost:{port}", creds) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return stub.ServerLive(pb.ServerLiveRequest(), timeout=timeout).live


def start_grpc_on(server):
    from agent.node.grpc_v2 import start_grpc

    return server.call(start_grpc(server.node, "127.0.0.1", 0, server.tls))


def test_bad_files_are_named_with_their_key(pki, tmp_path):
    missing = tmp_path / "nope.crt"
    with pytest.raises(ValueError, match=f"{missing}: tls.cert_file: no such file"):
        ServerTls(TlsSettings(cert_file=missing, key_file=pki["server"].key_file))
    with pytest.raises(ValueError, match="tls.key_file: does not match tls.cert_file"):
        ServerTls(TlsSettings(cert_file=pki["server"].cert_file,
                              key_file=pki["client"].key_file))
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    with pytest.raises(ValueError, match=f"{not_pem}: tls.client_ca_file: not a PEM"):
        ServerTls(settings(pki, client_ca_file=not_pem, client_auth="require"))
    with pytest.raises(ValueError, match="needs client_ca_file"):
        settings(pki, client_auth="require")


def test_a_client_trusting_another_ca_is_refused_on_http_and_grpc(pki, repo,
                                                                    start_agent):
    add_synthetic(repo, "m")
    agent = start_agent(repo, tls=settings(pki))
    assert agent.url.startswith("https://")
    assert get(agent.url + "/v2/health/live", trusting(pki["ca"])) == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(agent.url + "/v2/health/live", trusting(pki["foreign"]))
    g = start_grpc_on(agent)
    try:
        assert grpc_live(g.port, pki["ca"])
        with pytest.raises(grpc.RpcError) as refused:
            grpc_live(g.port, pki["foreign"])
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        agent.call(g.stop(0))


def test_a_client_trusting_another_ca_is_refused_by_the_coordinator(pki, start_coordinator):
    co = start_coordinator(tls=settings(pki))
    assert request(co.url + "/v1/health", context=trusting(pki["ca"]))[0] == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        request(co.url + "/v1/health", context=trusting(pki["foreign"]))


def _refused_fast(attempt) -> None:
    """``attempt()`` fails (any connection or TLS error), within a second."""
    t0 = time.monotonic()
    with pytest.raises((OSError, http.client.HTTPException)):
        attempt()
    assert time.monotonic() - t0 < 1.0


def test_client_auth_require_refuses_bad_clients_fast_and_still_serves(pki, repo,
                                                                       start_agent):
    add_synthetic(repo, "m")
    agent = start_agent(repo, tls=settings(pki, client_ca_file=pki["ca"].cert_file,
                                           client_auth="require"))
    url = agent.url + "/v2/models/m/infer"

    def infer(context):
        req = urllib.request.Request(url, data=json.dumps(BODY).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=context, timeout=5) as resp:
            return resp.status

    def plain_text():
        conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=5)
        try:
            conn.request("GET", "/v2/health/live")
            return conn.getresponse().status
        finally:
            conn.close()

    for _ in range(3):  # repeatedly: nothing is left hanging on the server
        _refused_fast(lambda: infer(trusting(pki["ca"])))  # no certificate
        _refused_fast(lambda: infer(trusting(pki["ca"], pki["foreign_client"])))
        _refused_fast(lambda: infer(trusting(pki["ca"], pki["expired_client"])))
        _refused_fast(plain_text)
        assert infer(trusting(pki["ca"], pki["client"])) == 200
    g = start_grpc_on(agent)
    try:
        for client in (None, pki["foreign_client"], pki["expired_client"]):
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError):
                grpc_live(g.port, pki["ca"], client, timeout=1.0)
            assert time.monotonic() - t0 < 1.5
        assert grpc_live(g.port, pki["ca"], pki["client"])
    finally:
        agent.call(g.stop(0))


def _peer_serial(sock) -> int:
    from cryptography import x509

    return x509.load_der_x509_certificate(sock.getpeercert(binary_form=True)).serial_number


def test_reload_swaps_the_certificate_and_keeps_open_connections(pki, repo, start_agent,
                                                                  tmp_path):
    add_synthetic(repo, "m")
    agent = start_agent(repo, tls=settings(pki))
    old = pki["server"].cert.serial_number
    kept = http.client.HTTPSConnection("127.0.0.1", agent.port, timeout=5,
                                       context=trusting(pki["ca"]))
    kept.request("GET", "/v2/health/live")
    assert kept.getresponse().read() is not None
    assert _peer_serial(kept.sock) == old
    g = start_grpc_on(agent)
    try:
        new_ca = make_ca(tmp_path, "new-ca")  # the new certificate: from a new CA
        new = issue_cert(new_ca, tmp_path, "server-2")
        pki["server"].cert_file.write_bytes(new.cert_file.read_bytes())
        pki["server"].key_file.write_bytes(new.key_file.read_bytes())
        with pytest.raises(grpc.RpcError):  # gRPC still presents the old one ...
            grpc_live(g.port, new_ca)
        agent.call(_reload(agent.tls))
        kept.request("GET", "/v2/health/live")  # the open connection goes on
        assert kept.getresponse().status == 200
        assert _peer_serial(kept.sock) == old
        fresh = http.client.HTTPSConnection("127.0.0.1", agent.port, timeout=5,
                                            context=trusting(new_ca))
        fresh.request("GET", "/v2/health/live")
        assert fresh.getresponse().status == 200
        assert _peer_serial(fresh.sock) == new.cert.serial_number
        fresh.close()
        assert grpc_live(g.port, new_ca)  # ... and the new one after the reload
    finally:
        kept.close()
        agent.call(g.stop(0))


def test_sighup_with_other_tls_paths_keeps_the_files_it_started_with(pki, repo, tmp_path):
    """``edgeagent serve``: a config whose ``tls:`` names other files takes effect at
    the next start; SIGHUP reads the files it started with again and says to restart."""
    add_synthetic(repo, "m")
    config = tmp_path / "agent.yaml"

    def write(issued) -> None:
        config.write_text(json.dumps({"tls": {"cert_file": str(issued.cert_file),
                                              "key_file": str(issued.key_file)}}))

    write(pki["server"])
    agent = Agent(repo, tmp_path / "data", "--config", str(config),
                  context=trusting(pki["ca"]))
    try:
        write(issue_cert(pki["ca"], tmp_path, "server-2"))
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: any("restart to use the new ones" in line for line in agent.err),
                 what="the warning")
        conn = http.client.HTTPSConnection("127.0.0.1", int(agent.url.rsplit(":", 1)[1]),
                                           timeout=5, context=trusting(pki["ca"]))
        conn.request("GET", "/v2/health/live")
        assert conn.getresponse().status == 200
        assert _peer_serial(conn.sock) == pki["server"].cert.serial_number
        conn.close()
    finally:
        agent.stop()


async def _reload(tls: ServerTls) -> None:
    tls.reload()  # on the server's event loop, as SIGHUP runs it


def test_a_bad_file_on_reload_keeps_the_running_certificate(pki, repo, start_agent):
    add_synthetic(repo, "m")
    agent = start_agent(repo, tls=settings(pki))
    pki["server"].key_file.write_bytes(pki["client"].key_file.read_bytes())
    with pytest.raises(ValueError, match="does not match"):
        agent.call(_reload(agent.tls))
    assert get(agent.url + "/v2/health/live", trusting(pki["ca"])) == 200


def _status(agent) -> dict:
    return agent.request("GET", "/v1/coordinator")[2]


@pytest.mark.parametrize("case", ["expired", "foreign"])
def test_the_reporter_says_why_the_coordinator_is_refused_while_inference_goes_on(
        case, pki, repo, tmp_path, start_agent, start_coordinator):
    d = tmp_path / "pki"
    server = issue_cert(pki["ca"], d, "co-expired", not_after=PAST) if case == "expired" \
        else issue_cert(pki["foreign"], d, "co-foreign")
    co = start_coordinator(tls=TlsSettings(cert_file=server.cert_file,
                                           key_file=server.key_file))
    add_synthetic(repo, "m")
    agent = start_agent(repo, coordinator=CoordinatorLink(
        url=co.url, report_interval_s=0.2, node_name="edge-1",
        ca_file=pki["ca"].cert_file))
    expected = "server certificate expired" if case == "expired" \
        else f"server certificate not trusted by ca_file {pki['ca'].cert_file}"
    wait_for(lambda: _status(agent)["last_error"], 20, "a failed report")
    assert _status(agent)["last_error"] == expected
    assert agent.request("POST", "/v2/models/m/infer", BODY)[0] == 200
    assert _status(agent)["reports"] == 0


def test_the_reporter_keeps_one_connection_with_a_client_certificate(
        pki, repo, start_agent, start_coordinator, tmp_path):
    co = start_coordinator(tls=settings(pki, client_ca_file=pki["ca"].cert_file,
                                        client_auth="require"))
    handshakes = []
    co.co.tls.context.sni_callback = lambda sock, name, ctx: handshakes.append(name)
    add_synthetic(repo, "m")
    # the certificate names the node: it may post only edge-1's report (NodeRestriction)
    node = issue_cert(pki["ca"], tmp_path, "edge-1", hosts=("edge-1",))
    agent = start_agent(repo, coordinator=CoordinatorLink(
        url=co.url.replace("127.0.0.1", "localhost"), report_interval_s=0.1,
        node_name="edge-1", ca_file=pki["ca"].cert_file,
        cert_file=node.cert_file, key_file=node.key_file))
    wait_for(lambda: _status(agent)["reports"] >= 10, 30, "10 reports")
    assert _status(agent)["last_error"] is None
    assert handshakes == ["localhost"]


def test_report_workers_serve_tls_and_reload_it_on_sighup(pki, tmp_path):
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2,
                            context=trusting(pki["ca"]),
                            tls={"cert_file": str(pki["server"].cert_file),
                                 "key_file": str(pki["server"].key_file)})
    try:
        assert co.url.startswith("https://")
        wait_for(lambda: co.post("/v1/nodes/edge-1/report", REPORT)[0] == 200, 30,
                 "a report answered over TLS")
        new_ca = make_ca(tmp_path, "new-ca")
        new = issue_cert(new_ca, tmp_path, "server-2")
        pki["server"].cert_file.write_bytes(new.cert_file.read_bytes())
        pki["server"].key_file.write_bytes(new.key_file.read_bytes())
        co.proc.send_signal(signal.SIGHUP)

        def all_new() -> bool:  # connections spread over both workers: 8 in a row
            try:
                return all(request(co.url + "/v1/nodes/edge-1/report", "POST", REPORT,
                                   context=trusting(new_ca))[0] == 200 for _ in range(8))
            except urllib.error.URLError:
                return False
        wait_for(all_new, 20, "every worker serves the new certificate")
        assert co.proc.poll() is None
    finally:
        co.stop()


@pytest.mark.parametrize("command", [["serve"], ["coordinator", "serve"]])
def test_a_non_loopback_address_in_the_clear_refuses_to_start(command, tmp_path):
    done = subprocess.run([EDGEAGENT, *command, "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ,
                               "EDGEAGENT_DATA_DIR": str(tmp_path / "data"),
                               "EDGEAGENT_COORDINATOR_DIR": str(tmp_path / "co")})
    assert done.returncode != 0
    assert "--insecure" in done.stderr
    assert "0.0.0.0" in done.stderr


def test_the_store_warning_names_host_and_sslmode_never_the_password():
    from agent.commands.coordinator import store_verification_warning

    warning = store_verification_warning("postgresql://edge:s3cret@db.example:5432/fleet")
    assert "db.example" in warning and "sslmode=prefer" in warning
    assert "s3cret" not in warning
    assert store_verification_warning("postgresql://edge:s3cret@db.example/fleet"
                                      "?sslmode=verify-full&sslrootcert=/ca.crt") is None
    assert store_verification_warning("postgresql://edge@127.0.0.1/fleet") is None
    assert store_verification_warning(None) is None


def test_the_coordinator_link_checks_its_files_at_start(pki, repo, tmp_path):
    """A missing ca_file is named with its key when the agent starts."""
    config = tmp_path / "agent.yaml"
    missing = tmp_path / "nope.crt"
    config.write_text(json.dumps({
        "repository": str(repo), "port": 0, "grpc_port": 0, "data_dir": str(tmp_path / "d"),
        "coordinator": {"url": "https://127.0.0.1:1", "ca_file": str(missing)}}))
    done = subprocess.run([EDGEAGENT, "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{missing}: coordinator.ca_file: no such file" in done.stderr



def test_the_cli_talks_https_with_ca_file_cert_and_key(pki, repo, start_agent):
    add_synthetic(repo, "m")
    agent = start_agent(repo, tls=settings(pki, client_ca_file=pki["ca"].cert_file,
                                           client_auth="require"))

    def cache_ls(*flags):
        return subprocess.run([EDGEAGENT, "cache", "--url", agent.url, "--json", *flags,
                               "ls"], capture_output=True, text=True, timeout=60)

    good = cache_ls("--ca-file", str(pki["ca"].cert_file), "--cert",
                    str(pki["client"].cert_file), "--key", str(pki["client"].key_file))
    assert good.returncode == 0, good.stderr
    assert [m["name"] for m in json.loads(good.stdout)] == ["m"]
    foreign = cache_ls("--ca-file", str(pki["foreign"].cert_file))
    assert foreign.returncode != 0
    assert f"not trusted by ca_file {pki['foreign'].cert_file}" in foreign.stderr


def test_exposure_needs_tls_and_a_token_beyond_loopback(pki, tmp_path):
    from agent.config import AgentConfig
    from agent.coordinator.config import CoordinatorConfig
    from agent.security.exposure import exposure_error

    token = tmp_path / "token"
    token.write_text("x" * 40)
    for cls in (AgentConfig, CoordinatorConfig):
        for host in ("127.0.0.1", "::1", "localhost"):
            assert exposure_error(cls(host=host)) is None
        assert "--insecure" in exposure_error(cls(host="0.0.0.0"))
        assert "a token" in exposure_error(cls(host="10.1.2.3", tls=settings(pki)))
        assert "tls" in exposure_error(cls(host="edge.example", admin_token_file=token))
        assert exposure_error(cls(host="0.0.0.0", tls=settings(pki),
                                  admin_token_file=token)) is None
        assert exposure_error(cls(host="0.0.0.0", insecure=True)) is None


_RECORD_READS = """
import resource, ssl, sys
from agent.memory import TLS_READ_BYTES, tune_malloc
threshold, ca, cert, key = sys.argv[1:]
tune_malloc(int(threshold)) if threshold != "default" else tune_malloc()
server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server_ctx.load_cert_chain(cert, key)
client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
client_ctx.load_verify_locations(ca)
client_ctx.check_hostname = False
s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
client = client_ctx.wrap_bio(c_in, c_out)
for _ in range(10):
    for end in (client, server):
        try:
            end.do_handshake()
        except ssl.SSLWantReadError:
            pass
    s_in.write(c_out.read())
    c_in.write(s_out.read())
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(500):  # what uvloop's transport does for each record it reads
    client.write(b"x" * 1024)
    s_in.write(c_out.read())
    assert len(server.read(TLS_READ_BYTES)) == 1024
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


def test_a_tls_record_read_maps_no_fresh_memory(pki):
    """uvloop reads each TLS record into a fresh 256 KiB bytes object, shrunk at once:
    with the agent's malloc settings (``tune_malloc``: mmap above 320 KiB) it comes
    from the heap, reused; at a 256 KiB threshold each read maps fresh pages (an mmap,
    a page fault, an mremap and a munmap per record: 20-25 us of the agent's CPU)."""
    from agent.memory import TLS_READ_BYTES

    def faults(threshold: str) -> int:
        out = subprocess.run([sys.executable, "-c", _RECORD_READS, threshold,
                              str(pki["ca"].cert_file), str(pki["server"].cert_file),
                              str(pki["server"].key_file)],
                             capture_output=True, text=True, timeout=60, check=True)
        return int(out.stdout)

    assert faults("default") < 100  # 500 records
    assert faults(str(TLS_READ_BYTES)) >= 500  # the old threshold: one or more each
