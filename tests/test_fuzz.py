"""A grammar-based fuzzer over every endpoint of a real agent and a real coordinator
(issue 13): valid requests mutated field by field (a value replaced by any JSON value,
NaN, infinities and 400-digit integers included, or deleted), random JSON and random
bytes as bodies, odd path segments (unicode, digits of other scripts, quoted slashes)
and odd headers. Every answer must be a 2xx, or a 4xx / 503 / 507 with a JSON error
naming the problem; never a 500. Afterwards the server still serves a valid request.

The routes are read from the apps' routers, so a new endpoint is fuzzed without a change
here. Example counts keep ``make test`` short; ``EDGEAGENT_FUZZ_EXAMPLES`` raises them
(bench/reliability.py sends ~10,000 requests per endpoint family)."""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.parse

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import REPORT, add_app, add_mlp, v2_body

EXAMPLES = int(os.environ.get("EDGEAGENT_FUZZ_EXAMPLES", "100"))

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.just(10**400)
    | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
SEGMENTS = st.text(max_size=12) | st.sampled_from(["²", "٣", "1", "0", "-1", "99999999999999999999",
                                                  "..", "a/b", "%", " "])
HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=24)

#: A valid body per route (the fuzzer mutates it), by the end of the route's path.
VALID_BODIES = [
    (r"/infer$", v2_body([1, 2, 3, 4])),
    (r":predict$", {"instances": [[1, 2, 3, 4]]}),
    (r"/repository/index$", {"ready": True}),
    (r"/workers$", {"workers": 2}),
    (r"/report$", REPORT),
    (r"^/v1/models/\{name\}$", {"slo_ms": 100, "percentile": 99}),
    (r"/sizing$", {"models": {"a": {"rate": 10, "slo_ms": 100}}}),
    (r"/feedback$", {"id": "q1", "labels": [1], "context": "u1"}),
    (r"/selection/\{name\}/weights$", {"weights": [1, 1], "freeze": False}),
]


def _valid_body(path: str) -> object:
    for pattern, body in VALID_BODIES:
        if re.search(pattern, path):
            return body
    return {}


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, path, value, delete: bool):
    if not path:
        return value
    doc = json.loads(json.dumps(doc))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def requests(draw, routes, names):
    method, template = draw(st.sampled_from(routes))
    fill = {"name": draw(st.sampled_from(names) | SEGMENTS),
            "version": draw(st.sampled_from(["1", "2"]) | SEGMENTS),
            "action": draw(st.sampled_from(["pin", "unpin", "evict", "load"]) | SEGMENTS),
            "context": draw(st.sampled_from(["u1", "x" * 300]) | SEGMENTS)}
    path = re.sub(r"\{(\w+)[^}]*\}",
                  lambda m: urllib.parse.quote(fill.get(m.group(1), "x"), safe=""), template)
    headers = {}
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "bytes", "none"]))
    if kind == "mutated":
        base = _valid_body(template)
        where = draw(st.sampled_from(list(_paths(base))))
        value = draw(JSON_VALUES)
        body = json.dumps(_mutate(base, where, value, delete=bool(where) and draw(st.booleans())
                                  and not isinstance(where[-1], int))).encode()
    elif kind == "json":
        body = json.dumps(draw(JSON_VALUES)).encode()
    elif kind == "bytes":
        body = draw(st.binary(max_size=200))
    else:
        body = None
    if draw(st.booleans()):
        headers["Inference-Header-Content-Length"] = draw(
            st.sampled_from(["0", "5", "²", "-1", "9" * 30]) | HEADER_TEXT)
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.sampled_from(
            ["application/json", "application/octet-stream", "text/plain"]) | HEADER_TEXT)
    return method, path, body, headers


def _send(server, method, path, body, headers):
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def check_answer(status: int, content_type: str, payload: bytes, what: str) -> None:
    """A 2xx, or a 4xx/503/507 whose JSON body names the problem; never a 500."""
    assert status < 500 or status in (503, 507), (what, status, payload[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (what, status, payload[:300])
        error = json.loads(payload)["error"]
        assert isinstance(error, str) and error, (what, status, payload[:300])


def _routes(app) -> list[tuple[str, str]]:
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes()
                   if r.method != "HEAD"})


FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def test_fuzz_every_agent_endpoint(repo, start_agent):
    add_mlp(repo, "mlp")
    add_mlp(repo, "mlp2", seed=3)
    add_app(repo, "app", ["mlp", "mlp2"], output={"name": "Y", "kind": "scores"})
    agent = start_agent(repo)
    routes = _routes(agent.app)
    status, _, reply = agent.request("POST", "/v2/models/app/infer",
                                     {**v2_body([1, 2, 3, 4]), "id": "q1",
                                      "parameters": {"context": "u1"}})
    assert status == 200, reply

    @FUZZ
    @given(requests(routes, ["mlp", "app", "nope"]))
    def one(request):
        method, path, body, headers = request
        check_answer(*_send(agent, method, path, body, headers), f"{method} {path}")

    one()
    status, _, reply = agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
    assert status == 200, reply  # the agent still serves
    status, _, reply = agent.request("POST", "/v2/models/app/infer", v2_body([1, 2, 3, 4]))
    assert status == 200, reply
    assert agent.request("GET", "/v2/health/ready")[0] == 200


def test_fuzz_every_coordinator_endpoint(start_coordinator):
    co = start_coordinator()
    routes = _routes(co.app)

    @FUZZ
    @given(requests(routes, ["a", "b", "n1"]))
    def one(request):
        method, path, body, headers = request
        check_answer(*_send(co, method, path, body, headers), f"{method} {path}")

    one()
    assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
    assert co.request("GET", "/v1/health")[0] == 200
