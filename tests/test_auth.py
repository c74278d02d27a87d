"""Scoped tokens, node identity, join, throttle and rotation on one real coordinator or
agent on loopback (in this process; the report workers' processes are in
test_auth_fleet.py): who may do what, answered 401/403/429 as the rule says."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl

import pytest
import yaml

from agent.security.authconfig import AgentAuthSettings, AuthSettings
from agent.security.auththrottle import FailureThrottle
from agent.security.credentials import (Credential, CredentialError, Credentials, load_credentials,
                               load_token_file, new_token, token_hash)
from tests.helpers import REPORT, add_mlp, v2_body

ADMIN, READ, INFER = new_token(), new_token(), new_token()
EDGE1, EDGE2 = new_token(), new_token()


def token_file(path, entries):
    path.write_text(yaml.safe_dump(entries))
    return path


def entry(name, token, scopes, **more) -> dict:
    return {"name": name, "sha256": token_hash(token), "scopes": scopes, **more}


@pytest.fixture
def tokens(tmp_path):
    return token_file(tmp_path / "tokens.yaml", [
        entry("ops", ADMIN, ["admin"]), entry("dash", READ, ["read"]),
        entry("app", INFER, ["infer"]),
        entry("edge-1", EDGE1, ["report"], node="edge-1"),
        entry("edge-2", EDGE2, ["report"], node="edge-2")])


def test_token_files_are_checked_and_keep_only_hashes(tmp_path):
    short = tmp_path / "short"
    short.write_text("s3cret\n")
    with pytest.raises(CredentialError, match="at least 32"):
        load_credentials(short, None)
    good = tmp_path / "admin"
    good.write_text(ADMIN + "\n")
    assert [c.scopes for c in load_credentials(good, None)] == [frozenset({"admin"})]
    for bad, words in (([{"name": "x", "sha256": "ab", "scopes": ["read"]}], "64 hex"),
                       ([entry("x", READ, ["root"])], "scopes"),
                       ([entry("x", READ, ["report"])], "names its node"),
                       ([entry("x", READ, ["read"], colour="red")], "unknown key"),
                       ([entry("x", READ, ["read"], not_after="soon")], "ISO 8601"),
                       ([entry("x", READ, ["read"]), entry("x", INFER, ["infer"])], "twice"),
                       ({"x": 1}, "list")):
        with pytest.raises(CredentialError, match=words):
            load_token_file(token_file(tmp_path / "bad.yaml", bad))
    assert READ not in (tmp_path / "bad.yaml").read_text()  # the file holds hashes only


def test_find_matches_the_token_and_honours_not_after():
    creds = Credentials([
        Credential("a", token_hash(ADMIN), frozenset({"admin"})),
        Credential("r", token_hash(READ), frozenset({"read"}), not_after=1000.0)])
    assert creds.find(ADMIN, 5000.0).name == "a"
    assert creds.find(READ, 999.0).name == "r" and creds.find(READ, 1001.0) is None
    assert creds.find(INFER, 0.0) is None and creds.find(None, 0.0) is None


def test_the_throttle_refills_and_keeps_a_bounded_number_of_peers():
    now = [0.0]
    t = FailureThrottle(burst=3, per_s=1.0, max_peers=100, clock=lambda: now[0])
    for _ in range(3):
        assert t.retry_after("a") == 0
        t.failed("a")
    assert t.retry_after("a") == 1 and t.retry_after("b") == 0
    now[0] += 1.0
    assert t.retry_after("a") == 0
    for i in range(1000):
        t.failed(f"p{i}")
    assert len(t) == 100 and t.retry_after("a") == 0  # the oldest were dropped


def test_coordinator_scopes_and_node_restriction(start_coordinator, tokens):
    co = start_coordinator(auth=AuthSettings(token_file=tokens))
    assert co.request("GET", "/v1/health")[0] == 200
    assert co.request("GET", "/v1/nodes")[0] == 401
    assert co.request("GET", "/v1/nodes", token=new_token())[0] == 401
    assert co.request("POST", "/v1/nodes/edge-1/report", REPORT, token=EDGE1)[0] == 200
    for _ in range(5):  # every time: a node posts only its own report
        status, doc = co.request("POST", "/v1/nodes/edge-2/report", REPORT, token=EDGE1)
        assert status == 403 and "only its own report" in doc["error"]
    for method, path, body in (("PUT", "/v1/models/m", {"slo_ms": 100}),
                               ("DELETE", "/v1/nodes/edge-2", None),
                               ("POST", "/v1/plan", None), ("GET", "/v1/nodes", None),
                               ("POST", "/v1/join-tokens", {"node": "edge-1"})):
        status, doc = co.request(method, path, body, token=EDGE1)
        assert status == 403 and "lacks scope" in doc["error"], (method, path)
    status, nodes = co.request("GET", "/v1/nodes", token=READ)  # the dashboard's reads
    assert status == 200 and [n["name"] for n in nodes] == ["edge-1"]
    assert co.request("GET", "/v1/models", token=READ)[0] == 200
    assert co.request("PUT", "/v1/models/m", {"slo_ms": 100}, token=READ)[0] == 403
    assert co.request("DELETE", "/v1/nodes/edge-1", token=READ)[0] == 403
    assert co.request("POST", "/v1/nodes/edge-2/report", REPORT, token=READ)[0] == 403
    assert co.request("PUT", "/v1/models/m", {"slo_ms": 100}, token=ADMIN)[0] == 201
    assert co.request("POST", "/v1/nodes/edge-9/report", REPORT, token=ADMIN)[0] == 200
    status, text = _get_text(co.url, READ)
    assert status == 200
    assert 'edgeagent_coordinator_auth_failures_total{reason="forbidden"} 13' in text
    assert 'edgeagent_coordinator_auth_failures_total{reason="unauthenticated"} 2' in text


def _get_text(url: str, token: str | None, *, source: str | None = None
              ) -> tuple[int, str]:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10,
                                      source_address=(source, 0) if source else None)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"}
                 if token else {})
    answer = conn.getresponse()
    return answer.status, answer.read().decode()


def test_join_gives_a_node_its_own_credential_once(start_coordinator, tokens):
    co = start_coordinator(auth=AuthSettings(token_file=tokens))
    assert co.request("POST", "/v1/join-tokens", {"node": "edge-7"}, token=READ)[0] == 403
    status, doc = co.request("POST", "/v1/join-tokens", {"node": "edge 7"}, token=ADMIN)
    assert status == 400 and "node" in doc["error"]
    status, made = co.request("POST", "/v1/join-tokens", {"node": "edge-7", "ttl_s": 60},
                              token=ADMIN)
    assert status == 201 and made["node"] == "edge-7"
    status, doc = co.request("POST", "/v1/join", {"node": "edge-8"}, token=made["token"])
    assert status == 403 and "edge-7" in doc["error"]  # and the join token is used up
    assert co.request("POST", "/v1/join", token=made["token"])[0] == 401
    made = co.request("POST", "/v1/join-tokens", {"node": "edge-7"}, token=ADMIN)[1]
    status, joined = co.request("POST", "/v1/join", {"node": "edge-7"}, token=made["token"])
    assert status == 200 and joined["node"] == "edge-7"
    node_token = joined["token"]
    assert len(node_token) >= 32 and node_token != made["token"]
    assert co.request("POST", "/v1/join", token=made["token"])[0] == 401  # once
    assert co.request("POST", "/v1/nodes/edge-7/report", REPORT, token=node_token)[0] == 200
    assert co.request("POST", "/v1/nodes/edge-1/report", REPORT, token=node_token)[0] == 403
    assert co.request("GET", "/v1/nodes", token=node_token)[0] == 403
    # the store keeps the hash, never the token
    assert co.co.store.node_credentials() == [("edge-7", token_hash(node_token))]
    # deleting the node revokes its credential: it must join again
    assert co.request("DELETE", "/v1/nodes/edge-7", token=ADMIN)[0] == 200
    assert co.request("POST", "/v1/nodes/edge-7/report", REPORT, token=node_token)[0] == 401


def test_expired_join_token_is_refused(start_coordinator, tokens):
    now = [1000.0]
    co = start_coordinator(auth=AuthSettings(token_file=tokens), clock=lambda: now[0])
    made = co.request("POST", "/v1/join-tokens", {"node": "edge-7", "ttl_s": 60},
                      token=ADMIN)[1]
    now[0] += 61
    assert co.request("POST", "/v1/join", token=made["token"])[0] == 401


def test_bad_tokens_from_one_address_are_throttled_not_the_good_client(start_coordinator,
                                                                        tokens):
    """50 bad tokens from 127.0.0.2 in a burst: 429 with Retry-After after the burst of
    failures; a good client on 127.0.0.1 meanwhile gets 200 every time; while throttled,
    127.0.0.2's tokens are not judged: a correct one is refused too."""
    co = start_coordinator(auth=AuthSettings(token_file=tokens))
    co.co.guard.throttle.clock = lambda: 0.0  # no refill however slowly a loaded box runs
    bad, good = [], []
    for i in range(50):
        bad.append(_get_text(co.url, new_token(), source="127.0.0.2")[0])
        good.append(_get_text(co.url, READ)[0])
    burst = FailureThrottle().burst
    assert bad == [401] * burst + [429] * (50 - burst)
    assert set(good) == {200}
    conn = http.client.HTTPConnection("127.0.0.1", co.port, timeout=10,
                                      source_address=("127.0.0.2", 0))
    conn.request("GET", "/v1/nodes", headers={"Authorization": f"Bearer {new_token()}"})
    answer = conn.getresponse()
    assert answer.status == 429 and int(answer.getheader("Retry-After")) >= 1
    assert "too many failed" in json.loads(answer.read())["error"]
    # a valid credential from the throttled address waits too: guesses are not judged
    assert _get_text(co.url, READ, source="127.0.0.2")[0] == 429
    co.co.guard.throttle.clock = lambda: 1.0  # its bucket refills: tried again, and right
    assert _get_text(co.url, READ, source="127.0.0.2")[0] == 200


def test_the_throttle_takes_its_settings_from_the_config(repo, start_agent,
                                                         start_coordinator, tokens):
    """``auth.failure_burst`` / ``failures_per_s`` / ``failure_peers``: the agent answers
    429 after its configured burst of failures; the coordinator's throttle is built
    from the same keys."""
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=tokens, failure_burst=3,
                                                     failures_per_s=0.5,
                                                     failure_peers=7))
    agent.node.guard.throttle.clock = lambda: 0.0  # no refill on a slow box
    statuses = [agent.request("GET", "/v1/cache", None,
                              {"Authorization": f"Bearer {new_token()}"})[0]
                for _ in range(5)]
    throttle = agent.node.guard.throttle
    assert statuses == [401] * 3 + [429] * 2
    assert (throttle.per_s, throttle.max_peers) == (0.5, 7)
    co = start_coordinator(auth=AuthSettings(token_file=tokens, failure_burst=4,
                                             failures_per_s=1.5, failure_peers=9))
    throttle = co.co.guard.throttle
    assert (throttle.burst, throttle.per_s, throttle.max_peers) == (4, 1.5, 9)


def test_agent_scopes_and_protect(repo, start_agent, tmp_path, tokens):
    add_mlp(repo, "m")
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=tokens, protect=()))

    def req(method, path, token=None, body=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return agent.request(method, path, body, headers)[0]

    infer = "/v2/models/m/infer"
    body = v2_body([[1, 2, 3, 4]])
    # protect: [] leaves inference, /metrics and statistics open; the rest needs a scope
    assert req("POST", infer, body=body) == 200 and req("GET", "/metrics") == 200
    assert req("GET", "/v2/models/stats") == 200
    assert req("POST", infer, new_token(), body) == 401  # a token sent is judged anyway
    for path in ("/v1/cache", "/v1/memory", "/v2/models/m/config", "/v1/coordinator"):
        assert req("GET", path) == 401, path
        assert req("GET", path, INFER) == 403, path
        assert req("GET", path, READ) in (200, 404), path  # 404: no coordinator
    assert req("POST", "/v1/cache/m/evict", READ) == 403
    assert req("POST", "/v2/repository/index", READ) == 403
    assert req("POST", "/v1/cache/m/evict", ADMIN) == 200
    assert req("POST", infer, INFER, body) == 200
    agent.close()
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=tokens))  # protect: both
    assert req("POST", infer, body=body) == 401 and req("GET", "/metrics") == 401
    assert req("POST", infer, READ, body) == 403 and req("GET", "/metrics", INFER) == 403
    assert req("POST", infer, INFER, body) == 200 and req("GET", "/metrics", READ) == 200
    assert req("GET", "/v2/health/ready") == 200 and req("GET", "/") == 200
    text = agent.request("GET", "/metrics", None, {"Authorization": f"Bearer {READ}"})[2]
    text = text.decode() if isinstance(text, bytes) else str(text)
    assert 'edgeagent_auth_failures_total{reason="unauthenticated"} 2' in text
    assert 'edgeagent_auth_failures_total{reason="forbidden"} 2' in text


def test_agent_rotation_by_reload_overlaps_and_removes(repo, start_agent, tmp_path):
    """Re-reading the token file (what SIGHUP does): old and new both valid while both
    are listed; a removed one fails at once."""
    add_mlp(repo, "m")
    old, new = new_token(), new_token()
    path = tmp_path / "tokens.yaml"
    token_file(path, [entry("old", old, ["read"])])
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=path))
    node = agent.node

    def status(token):
        return agent.request("GET", "/v1/cache", None, {"Authorization": f"Bearer {token}"})[0]

    assert status(old) == 200 and status(new) == 401
    token_file(path, [entry("old", old, ["read"]), entry("new", new, ["read"])])
    agent.call(_reload(node))
    assert status(old) == 200 and status(new) == 200
    token_file(path, [entry("new", new, ["read"])])
    agent.call(_reload(node))
    assert status(old) == 401 and status(new) == 200
    path.write_text("- {name: broken")  # a broken file keeps the tokens in use
    agent.call(_reload(node))
    assert status(new) == 200


async def _reload(node) -> None:
    node.reload(node.config)


def test_expiry_by_not_after(start_coordinator, tmp_path):
    soon = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    path = token_file(tmp_path / "t.yaml", [
        entry("late", READ, ["read"], not_after=soon.isoformat()),
        entry("ops", ADMIN, ["admin"])])
    co = start_coordinator(auth=AuthSettings(token_file=path))
    assert co.request("GET", "/v1/nodes", token=READ)[0] == 401
    assert co.request("GET", "/v1/nodes", token=ADMIN)[0] == 200


def _certificates(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate for edge-1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = dt.datetime.now(dt.timezone.utc)

    def make(cn, issuer=None, issuer_key=None, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        builder = (x509.CertificateBuilder().subject_name(name)
                   .issuer_name(issuer or name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=1))
                   .not_valid_after(now + dt.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    def write(name, key, cert):
        (tmp_path / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp_path / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    ca_key, ca = make("test-ca", ca=True)
    write("ca", ca_key, ca)
    write("server", *make("server", ca.subject, ca_key,
                          san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    write("edge-1", *make("edge-1", ca.subject, ca_key, san=[x509.DNSName("edge-1")]))
    return tmp_path


def test_a_client_certificate_names_its_node(start_coordinator, tokens, tmp_path):
    """Over mTLS, a node's certificate (DNS SAN edge-1) posts edge-1's report and only
    that: another node's report and the admin endpoints are 403."""
    from aiohttp import web

    certs = _certificates(tmp_path)
    co = start_coordinator(auth=AuthSettings(token_file=tokens))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs / "server.pem", certs / "server.key")
    server.load_verify_locations(certs / "ca.pem")
    server.verify_mode = ssl.CERT_REQUIRED

    async def tls_site():
        site = web.TCPSite(co.runner, "127.0.0.1", 0, ssl_context=server)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    port = co.call(tls_site())
    client = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    client.load_cert_chain(certs / "edge-1.pem", certs / "edge-1.key")

    def call(method, path, body=None):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=client, timeout=10)
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())

    assert call("POST", "/v1/nodes/edge-1/report", REPORT)[0] == 200
    for _ in range(5):
        assert call("POST", "/v1/nodes/edge-2/report", REPORT)[0] == 403
    assert call("PUT", "/v1/models/m", {"slo_ms": 100})[0] == 403
    assert call("DELETE", "/v1/nodes/edge-1")[0] == 403
    assert call("POST", "/v1/plan")[0] == 403
    assert call("GET", "/v1/nodes")[0] == 403


@pytest.mark.parametrize("command", [["serve", "--port", "0", "--grpc-port", "0"],
                                     ["coordinator", "serve", "--port", "0"]])
def test_a_short_token_refuses_to_start(tmp_path, command):
    import subprocess

    from tests.helpers import EDGEAGENT

    short = tmp_path / "token"
    short.write_text("s3cret\n")
    if command[0] == "serve":
        command = [*command, "--admin-token-file", str(short), "--data-dir",
                   str(tmp_path / "d")]
    else:
        (tmp_path / "co.yaml").write_text(json.dumps({
            "admin_token_file": str(short), "state_dir": str(tmp_path / "co")}))
        command = [*command, "--config", str(tmp_path / "co.yaml")]
    done = subprocess.run([EDGEAGENT, *command], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "6 characters long; tokens must have at least 32" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout


def test_coordinators_on_one_database_agree_on_node_credentials(start_coordinator,
                                                                 postgres, tokens, tmp_path):
    """A node that joined through one coordinator reports through another on the same
    PostgreSQL store within a couple of its follow intervals; a revocation likewise."""
    import time

    from tests.helpers import wait_for

    url = postgres.new_database()
    a = start_coordinator(store=url, auth=AuthSettings(token_file=tokens),
                          state_dir=tmp_path / "a")
    b = start_coordinator(store=url, auth=AuthSettings(token_file=tokens),
                          state_dir=tmp_path / "b")
    made = a.request("POST", "/v1/join-tokens", {"node": "edge-7"}, token=ADMIN)[1]
    node_token = a.request("POST", "/v1/join", token=made["token"])[1]["token"]
    started = time.monotonic()
    wait_for(lambda: b.request("POST", "/v1/nodes/edge-7/report", REPORT,
                               token=node_token)[0] == 200, 10, "b accepts the node")
    assert time.monotonic() - started < 3 * b.co.follow_interval_s
    assert b.request("POST", "/v1/nodes/edge-1/report", REPORT, token=node_token)[0] == 403
    assert a.request("DELETE", "/v1/nodes/edge-7", token=ADMIN)[0] == 200
    wait_for(lambda: b.request("POST", "/v1/nodes/edge-7/report", REPORT,
                               token=node_token)[0] == 401, 10, "b drops the node")
