"""Report workers whose polls are batched in time (``report_worker_poll_ms``,
``agent.http.coalescing``), end to end: a real coordinator with two workers, many nodes
on kept connections of their own posting a full report and then leases all at the same
instant, over plain HTTP and TLS. Every one is answered as without batching (the
report's directives, each lease its version) within the bench's bounds, and every node
reaches the store."""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

from agent.security.credentials import new_token, token_hash
from agent.security.tls import client_context
from tests.helpers import REPORT, CoordinatorProcess, issue_cert, make_ca, wait_for
from tests.test_coordinator_rawlane import Conn

NODES = 24
LEASES = 4
POLL_MS = 5


def node_report(i: int) -> bytes:
    return json.dumps({**REPORT, "report_id": 1000 + i}).encode()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_batched_polls_answer_concurrent_leases_and_reports(tmp_path, tls):
    names = [f"edge-{i}" for i in range(NODES)]
    tokens = {n: new_token() for n in ["ops", *names]}
    token_file = tmp_path / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(
        [{"name": "ops", "sha256": token_hash(tokens["ops"]), "scopes": ["admin"]}] + [
            {"name": n, "sha256": token_hash(tokens[n]), "scopes": ["report"], "node": n}
            for n in names]))
    context, tls_config = None, {}
    if tls:
        ca = make_ca(tmp_path)
        server = issue_cert(ca, tmp_path, "server")
        context = client_context(ca.cert_file)
        tls_config = {"tls": {"cert_file": str(server.cert_file),
                              "key_file": str(server.key_file)}}
    co = CoordinatorProcess(None, tmp_path / "co", report_workers=2,
                            report_worker_poll_ms=POLL_MS, reactive_interval_s=3600,
                            context=context, auth={"token_file": str(token_file)},
                            **tls_config)
    try:
        conns = [wait_for(lambda: Conn(co.port, context), 10, "a connection")
                 for _ in names]
        start = threading.Barrier(NODES)
        answers: dict[str, list] = {n: [] for n in names}
        failures: list[BaseException] = []

        def node(i: int) -> None:
            name, conn = names[i], conns[i]
            try:
                start.wait(10)
                status, _, body = conn.send("POST", f"/v1/nodes/{name}/report",
                                            node_report(i), tokens[name])
                answers[name].append((status, body))
                version = json.loads(body)["answer"]
                lease = json.dumps({"report": 1000 + i, "answer": version}).encode()
                for _ in range(LEASES):
                    start.wait(10)  # every node's lease at the same instant
                    began = time.monotonic()
                    status, _, body = conn.send("POST", f"/v1/nodes/{name}/lease", lease,
                                                tokens[name])
                    answers[name].append((status, body, version,
                                          time.monotonic() - began))
            except BaseException as exc:  # noqa: BLE001 (reported below)
                failures.append(exc)
                start.abort()

        threads = [threading.Thread(target=node, args=(i,)) for i in range(NODES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        for name in names:
            (status, body), *leases = answers[name]
            assert status == 200, (name, body)
            directives = json.loads(body)
            assert directives["node"] == name and isinstance(directives["answer"], int)
            assert len(leases) == LEASES
            for status, body, version, took in leases:
                assert (status, body) == (200, b'{"answer":%d}\n' % version), name
                assert took < 2.0  # batched by milliseconds, not held
        for conn in conns:
            conn.close()
        admin = Conn(co.port, context)

        def listed() -> bool:  # handed over by the workers, recorded by the coordinator
            status, _, body = admin.send("GET", "/v1/nodes", token=tokens["ops"])
            return status == 200 and set(names) <= {n["name"] for n in json.loads(body)}
        wait_for(listed, 10, "every node in GET /v1/nodes")
        admin.close()
    finally:
        co.stop()
