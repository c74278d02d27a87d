"""Cheap connections to the coordinator: an agent's reporter keeps one connection, and a
new one resumes its TLS session (``agent.security.tls.ResumingContext``) instead of a full
handshake; a connection whose handshake never ended does not stop the next."""

from __future__ import annotations

import ssl

from agent.config import AgentConfig, CoordinatorLink
from agent.security.tls import ResumingContext, TlsSettings
from tests.helpers import AgentServer, add_synthetic, issue_cert, make_ca, wait_for


def handshake(client: ssl.SSLObject, server: ssl.SSLObject, cin: ssl.MemoryBIO,
              cout: ssl.MemoryBIO, sin: ssl.MemoryBIO, sout: ssl.MemoryBIO) -> None:
    """Both ends' handshake over memory, then a byte each way (a TLS 1.3 ticket comes
    after the handshake)."""
    done = [False, False]
    while not all(done):
        for i, (end, src, dst) in enumerate(((client, cout, sin), (server, sout, cin))):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
            dst.write(src.read())
    server.write(b"x")
    cin.write(sout.read())
    assert client.read(1) == b"x"


def test_sessions_resume_and_an_unfinished_handshake_is_passed_over(tmp_path):
    ca = make_ca(tmp_path)
    cert = issue_cert(ca, tmp_path, "coordinator")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert.cert_file, cert.key_file)
    ctx = ResumingContext.for_client(ca.cert_file)
    assert ctx.resumed("127.0.0.1") is None

    def connect(finish: bool = True) -> ssl.SSLObject:
        bios = [ssl.MemoryBIO() for _ in range(4)]
        client = ctx.wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
        server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
        if finish:
            handshake(client, server, *bios)
        else:  # the server went away after the client's hello
            try:
                client.do_handshake()
            except ssl.SSLWantReadError:
                pass
        return client

    first = connect()
    assert not first.session_reused
    assert connect().session_reused and ctx.resumed("127.0.0.1") is True
    connect(finish=False)  # its session cannot be read (OpenSSL: "i2d() failed") ...
    connect(finish=False)
    assert connect().session_reused  # ... and the next connection still resumes
    assert server_ctx.session_stats()["hits"] == 2
    # another server name starts afresh
    bios = [ssl.MemoryBIO() for _ in range(4)]
    other = ctx.wrap_bio(bios[0], bios[1], server_hostname="localhost")
    handshake(other, server_ctx.wrap_bio(bios[2], bios[3], server_side=True), *bios)
    assert not other.session_reused


def tls_pair(tmp_path, start_coordinator, repo, **coordinator):
    """A coordinator over TLS (``coordinator``: more of its settings) and the CA that
    verifies it; a model in ``repo`` for the agent to report."""
    ca = make_ca(tmp_path)
    cert = issue_cert(ca, tmp_path, "coordinator")
    co = start_coordinator(tls=TlsSettings(cert_file=cert.cert_file, key_file=cert.key_file),
                           **coordinator)
    add_synthetic(repo, "m")
    return co, ca


def test_the_reporter_keeps_one_connection(tmp_path, repo, start_coordinator):
    co, ca = tls_pair(tmp_path, start_coordinator, repo)
    agent = AgentServer(AgentConfig(
        repository=repo, data_dir=tmp_path / "data", cpu_budget=50_000_000,
        coordinator=CoordinatorLink(url=co.url, node_name="n1", report_interval_s=0.1,
                                    ca_file=ca.cert_file)), budgets={"cpu": 50_000_000})
    try:
        wait_for(lambda: agent.request("GET", "/v1/coordinator")[2]["reports"] >= 15)
        stats = co.co.tls.context.session_stats()
        assert stats["accept"] == 1, stats  # fifteen reports, one handshake
    finally:
        agent.close()


def test_a_new_connection_resumes_the_reporters_tls_session(tmp_path, repo,
                                                             start_coordinator):
    # the coordinator closes a connection idle for 0.5 s: every report (each 1 s) comes
    # on a new one
    co, ca = tls_pair(tmp_path, start_coordinator, repo, read_timeout_s=0.5)
    agent = AgentServer(AgentConfig(
        repository=repo, data_dir=tmp_path / "data", cpu_budget=50_000_000,
        coordinator=CoordinatorLink(url=co.url, node_name="n1", report_interval_s=1.0,
                                    ca_file=ca.cert_file)), budgets={"cpu": 50_000_000})
    try:
        wait_for(lambda: agent.request("GET", "/v1/coordinator")[2]["reports"] >= 4, 20)
        stats = co.co.tls.context.session_stats()
        assert stats["accept"] >= 3 and stats["hits"] >= stats["accept"] - 1, stats
        assert agent.request("GET", "/v1/coordinator")[2]["failures"] == 0
    finally:
        agent.close()
