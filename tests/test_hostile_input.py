"""Hostile input over HTTP (issue 13): every malformed request named there answers a 4xx
naming the problem, never a 500, changes nothing, and the server still serves after it.
Real agent (ONNX MLP) and real coordinator on 127.0.0.1."""

from __future__ import annotations

import copy

import pytest

from agent.validation import ascii_int, load_json
from tests.helpers import REPORT, add_mlp, v2_body

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
BIG_INT = b"1" * 5000


# -- the helpers -------------------------------------------------------------------------


@pytest.mark.parametrize("body, words", [
    (DEEP, "nested deeper than"), (DEEP_OBJECT, "nested deeper than"),
    (b"[" + BIG_INT + b"]", "4300 digits"), (b"{nope", "malformed JSON"),
    (b"\xff\xfe{", "malformed JSON"),
])
def test_load_json_refuses_with_a_value_error(body, words):
    with pytest.raises(ValueError, match=words):
        load_json(body)


def test_load_json_keeps_what_is_fine():
    assert load_json(b'{"a": [[1, 2], [3, 4]], "b": NaN}')["a"] == [[1, 2], [3, 4]]
    assert load_json(b"[" * 64 + b"]" * 64) is not None
    assert load_json(b'{"data": [' + b",".join([b"[1]"] * 1000) + b"]}")["data"][999] == [1]
    with pytest.raises(ValueError):
        load_json(b"[" * 65 + b"]" * 65)


@pytest.mark.parametrize("text", ["²", "٣", "1²", "", "-1", "+1", " 1", "1.0", "1" * 19, None])
def test_ascii_int_refuses_everything_but_ascii_digits(text):
    with pytest.raises(ValueError, match="ASCII digits"):
        ascii_int(text, "version")


def test_ascii_int():
    assert ascii_int("0", "v") == 0 and ascii_int("123", "v") == 123


# -- the agent ---------------------------------------------------------------------------


@pytest.fixture
def agent(repo, start_agent):
    add_mlp(repo, "mlp")
    return start_agent(repo)


def _v2_with(**changes):
    body = v2_body([1, 2, 3, 4])
    for key, value in changes.items():
        if key.startswith("input_"):
            body["inputs"][0][key[6:]] = value
        else:
            body[key] = value
    return body


HOSTILE_AGENT = [
    ("/v2/models/mlp/infer", DEEP, None, "nested deeper than"),
    ("/v2/models/mlp/infer", DEEP_OBJECT, None, "nested deeper than"),
    ("/v2/models/mlp/infer",
     b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, '
     + BIG_INT + b"]}]}", None, "4300 digits"),
    ("/v2/models/mlp/versions/%C2%B2/infer", v2_body([1, 2, 3, 4]), None, "versions are integers"),
    ("/v2/models/mlp/versions/%D9%A3/infer", v2_body([1, 2, 3, 4]), None, "versions are integers"),
    ("/v1/models/mlp/versions/%C2%B2:predict", {"instances": [[1, 2, 3, 4]]}, None,
     "versions are integers"),
    ("/v1/models/mlp:predict", DEEP, None, "nested deeper than"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3, 4]), {"Inference-Header-Content-Length": "²"},
     "Inference-Header-Content-Length"),
    ("/v2/models/mlp/infer", v2_body([1, 2, 3, 4]),
     {"Inference-Header-Content-Length": "9" * 40}, "Inference-Header-Content-Length"),
    ("/v2/models/mlp/infer", _v2_with(outputs=[{"name": "Y", "parameters": [1]}]), None,
     "'parameters' must be an object"),
    ("/v2/models/mlp/infer", _v2_with(outputs=[{"name": "Y", "parameters": "x"}]), None,
     "'parameters' must be an object"),
    ("/v2/models/mlp/infer", _v2_with(input_datatype=["FP32"]), None, "unknown datatype"),
    ("/v2/models/mlp/infer", _v2_with(input_datatype={"a": 1}), None, "unknown datatype"),
    ("/v2/models/mlp/infer", _v2_with(parameters={"timeout": 1e300}), None,
     "parameter 'timeout'"),
    ("/v2/models/mlp/infer", _v2_with(parameters={"timeout": 10 ** 400}), None,
     "parameter 'timeout'"),
    ("/v2/repository/index", DEEP, None, "nested deeper than"),
]


@pytest.mark.parametrize("path, body, headers, words", HOSTILE_AGENT)
@pytest.mark.parametrize("warm", [False, True])
def test_hostile_agent_request_is_a_4xx_naming_the_problem(agent, path, body, headers, words,
                                                          warm):
    if warm:
        assert agent.request("POST", "/v2/repository/models/mlp/load")[0] == 200
    before = agent.request("GET", "/v1/cache")[2]
    status, _, reply = agent.request("POST", path, body, headers=headers)
    assert 400 <= status < 500 and words in reply["error"], (status, reply)
    if not warm:  # nothing loaded by a refused request
        assert agent.request("GET", "/v1/cache")[2] == before
    ok, _, _ = agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
    assert ok == 200  # the agent still serves


def test_output_parameters_refused_before_the_model_runs(agent):
    agent.request("POST", "/v2/repository/models/mlp/load")
    stats = agent.request("GET", "/v2/models/mlp/stats")[2]
    body = _v2_with(outputs=[{"name": "Y", "parameters": 5}])
    assert agent.request("POST", "/v2/models/mlp/infer", body)[0] == 400
    assert agent.request("GET", "/v2/models/mlp/stats")[2] == stats


# -- the coordinator ---------------------------------------------------------------------


def _report(**model_a):
    report = copy.deepcopy(REPORT)
    report["models"]["a"].update(model_a)
    return report


@pytest.mark.parametrize("path, method", [("/v1/nodes/n1/report", "POST"),
                                          ("/v1/models/a", "PUT")])
@pytest.mark.parametrize("raw", [DEEP, DEEP_OBJECT, b"[" + BIG_INT + b"]"])
def test_coordinator_refuses_hostile_json(start_coordinator, path, method, raw):
    co = start_coordinator()
    status, doc = co.request(method, path, raw=raw)
    assert status == 400 and "not valid JSON" in doc["error"], doc
    assert co.request("GET", "/v1/nodes") == (200, [])
    assert co.request("GET", "/v1/models") == (200, [])


@pytest.mark.parametrize("report, words", [
    ({**REPORT, "capacity": {"cores": 4, "cpu_memory_bytes": 10 ** 400}},
     "capacity.cpu_memory_bytes: must be a number >= 0 and <= "),
    ({**REPORT, "capacity": {"cores": 1e308}}, "capacity.cores"),
    (_report(arrivals=[[1.0, 5.0, 1e308]]), "models.a.arrivals[0]"),
    (_report(arrivals=[[1e308, 5.0, 10]]), "models.a.arrivals[0]"),
    (_report(arrivals=[[1.0, 1e-300, 1e9]]), "per second"),
    (_report(size_bytes=1e300), "models.a.size_bytes"),
    (_report(latency_ms={"p99": 1e300}), "models.a.latency_ms.p99"),
    (_report(batches={"²": {"count": 1, "seconds": 1}}), "keys must be batch sizes"),
    (_report(batches={"1": {"count": 1, "seconds": 1e300}}), "models.a.batches.1.seconds"),
])
def test_report_numbers_are_range_checked_and_planning_keeps_working(start_coordinator,
                                                                     report, words):
    co = start_coordinator()
    co.request("PUT", "/v1/models/a", {"slo_ms": 100})
    status, doc = co.request("POST", "/v1/nodes/n1/report", report)
    assert status == 400 and words in doc["error"], doc
    assert co.request("GET", "/v1/nodes") == (200, [])
    assert co.request("POST", "/v1/nodes/n2/report", REPORT)[0] == 200
    status, plan = co.request("POST", "/v1/plan")
    assert status == 200 and "a" in plan["models"], plan


@pytest.mark.parametrize("raw", [b'{"capacity": {"cores": 4}, "interval_s": Infinity}',
                                 b'{"capacity": {"cores": NaN}}'])
def test_report_refuses_inf_and_nan(start_coordinator, raw):
    co = start_coordinator()
    status, doc = co.request("POST", "/v1/nodes/n1/report", raw=raw)
    assert status == 400, doc


# -- a model that fails to load ----------------------------------------------------------


def _cache_entry(agent, name):
    return next(e for e in agent.request("GET", "/v1/cache")[2] if e["name"] == name)


def test_corrupt_model_is_remembered_as_failed_for_load_retry_s(repo, start_agent, tmp_path):
    import time

    add_mlp(repo, "mlp")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model at all")
    agent = start_agent(repo, load_retry_s=2.0)
    started = time.monotonic()
    status, headers, reply = agent.request("POST", "/v2/models/broken/infer", v2_body([1, 2, 3, 4]))
    assert status == 503 and int(headers["Retry-After"]) >= 1, reply
    assert "model broken:1 failed to load" in reply["error"], reply
    assert "broken/1/model.onnx" in reply["error"]
    assert str(tmp_path) not in reply["error"] and str(repo) not in reply["error"]
    entry = _cache_entry(agent, "broken")
    assert entry["state"] == "failed" and entry["load_attempts"] == 1
    assert str(tmp_path) not in entry["error"]
    for path, body in [("/v2/models/broken/infer", v2_body([1, 2, 3, 4])),
                       ("/v1/models/broken:predict", {"instances": [[1, 2, 3, 4]]})]:
        status, headers, reply = agent.request("POST", path, body)
        assert status == 503 and "Retry-After" in headers and "next try" in reply["error"]
    assert _cache_entry(agent, "broken")["load_attempts"] == 1  # not re-loaded
    assert agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))[0] == 200
    # the file is mended; after the window a request tries again, and is served
    add_mlp(repo, "broken")
    time.sleep(max(0.0, started + 2.2 - time.monotonic()))
    status, _, reply = agent.request("POST", "/v2/models/broken/infer", v2_body([1, 2, 3, 4]))
    assert status == 200, reply
    entry = _cache_entry(agent, "broken")
    assert entry["state"] == "ready" and entry["load_attempts"] == 2 and entry["error"] is None


def test_failed_load_window_per_model_and_explicit_load(repo, start_agent):
    import yaml

    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"")
    (repo / "broken" / "config.yaml").write_text(yaml.safe_dump({"load_retry_s": 0}))
    (repo / "held" / "1").mkdir(parents=True)
    (repo / "held" / "1" / "model.onnx").write_bytes(b"\x08\x07garbage")
    agent = start_agent(repo, load_retry_s=600)
    for attempt in (1, 2):  # a window of 0: every request tries again
        status, _, reply = agent.request("POST", "/v2/models/broken/infer", v2_body([1, 2, 3, 4]))
        assert status == 503 and "model broken:1 failed to load" in reply["error"]
        assert _cache_entry(agent, "broken")["load_attempts"] == attempt
    status, headers, _ = agent.request("POST", "/v2/models/held/infer", v2_body([1, 2, 3, 4]))
    assert status == 503
    status, headers, reply = agent.request("POST", "/v2/models/held/infer", v2_body([1, 2, 3, 4]))
    assert status == 503 and 590 <= int(headers["Retry-After"]) <= 600, reply
    assert _cache_entry(agent, "held")["load_attempts"] == 1
    # an explicit load (the operator's) tries again at once
    status, _, reply = agent.request("POST", "/v2/repository/models/held/load")
    assert status == 503 and "failed to load" in reply["error"]
    assert _cache_entry(agent, "held")["load_attempts"] == 2


# -- clients that go away ----------------------------------------------------------------


def _raw(agent, data: bytes, wait: float = 0.3) -> None:
    import socket
    import time

    host, port = agent.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        time.sleep(wait)


def test_client_disconnects_are_logged_at_info_without_a_trace(repo, start_agent, caplog):
    import json
    import logging
    import time

    from tests.helpers import add_synthetic

    add_mlp(repo, "mlp")
    add_synthetic(repo, "slow", base_ms=400, size_bytes=1000)
    agent = start_agent(repo)
    body = json.dumps(v2_body([1, 2, 3, 4])).encode()
    slow = json.dumps(v2_body([1], shape=(1, 1))).encode()
    head = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n")
    with caplog.at_level(logging.DEBUG):
        _raw(agent, head % (b"mlp", 1000) + body[:20])        # half a body
        # half headers
        _raw(agent, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost\r\nConte")
        _raw(agent, head % (b"slow", len(slow)) + slow, wait=0.05)  # gone before the answer
        _raw(agent, b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: localhost\r\n"
             b"Content-Length: 500\r\n\r\n{\"instances\": [[1, 2")
        time.sleep(0.8)  # the slow answer is written to a closed connection
        status, _, _ = agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))
        assert status == 200  # the agent still serves
        assert agent.request("POST", "/v2/models/slow/infer",
                             v2_body([1], shape=(1, 1)))[0] == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.levelname, r.getMessage()) for r in loud]
    gone = [r for r in caplog.records if "client went away" in r.getMessage()]
    assert gone and all(r.levelno == logging.INFO for r in gone)


def test_coordinator_client_disconnect_is_quiet(start_coordinator, caplog):
    import logging

    co = start_coordinator()
    with caplog.at_level(logging.DEBUG):
        _raw(co, b"POST /v1/nodes/n1/report HTTP/1.1\r\nHost: localhost\r\n"
             b"Content-Length: 800\r\n\r\n{\"capacity\": ")
        assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.levelname, r.getMessage()) for r in loud]
