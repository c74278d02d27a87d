"""``/metrics`` of a real agent after real traffic, checked with promtool-style rules
(``prometheus_client``'s parser): names, units, types, HELP/TYPE lines, histogram
series, the endpoint label; and the Grafana dashboard in ``deploy/grafana`` names only
metrics that exist."""

import json
from collections import defaultdict
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.node.metrics import ENDPOINTS
from tests.helpers import TINY_MLP, add_app, add_mlp

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "edgeagent.json"
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
TIME_NAME = re.compile(r"(^|_)(time|latency|duration|window|seconds)(_|$)")
TIME_HELP = re.compile(r"\b(time|duration|seconds)\b", re.I)  # a value that is a time
SIZE_WORDS = re.compile(r"\b(bytes?|memory)\b", re.I)
X = [0.5] * TINY_MLP["inputs"]


def v2(data, shape=(1, TINY_MLP["inputs"])):
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": list(shape), "data": data}]}


@pytest.fixture
def scraped(repo, start_agent):
    """(exposition text, families by name) after v2 and TF traffic, a selection app's,
    errors, a load and an eviction."""
    add_mlp(repo, "mlp")
    add_mlp(repo, "other", seed=5)
    add_app(repo, "app", ["mlp", "other"], output={"name": "Y", "kind": "scores"})
    agent = start_agent(repo)
    assert agent.request("POST", "/v2/models/mlp/infer", v2(X))[0] == 200
    assert agent.request("POST", "/v2/models/app/infer", v2(X))[0] == 200
    assert agent.request("POST", "/v1/models/mlp:predict", {"instances": [X]})[0] == 200
    assert agent.request("POST", "/v2/models/mlp/infer", v2(X[:-1], (1, 3)))[0] == 400
    assert agent.request("POST", "/v2/models/nope/infer", v2(X))[0] == 404
    assert agent.request("POST", "/v1/models/mlp/versions/7:predict",
                         {"instances": [X]})[0] == 404
    assert agent.request("POST", "/v2/repository/models/other/load")[0] == 200
    assert agent.request("POST", "/v1/cache/other/evict")[0] == 200
    status, headers, text = agent.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = text.decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def samples(families, name):
    """Every sample whose own name (``_total``, ``_bucket``... included) is ``name``."""
    return [s for f in families.values() for s in f.samples if s.name == name]


def test_names_types_help_and_units(scraped):
    text, families = scraped
    assert any(n.startswith("process_") for n in families), "process collector missing"
    assert any(n.startswith("python_") for n in families), "python collectors missing"
    for name, family in families.items():
        assert SNAKE.match(name), f"{name}: not snake_case"
        assert name.startswith(("edgeagent_", "process_", "python_")), name
        exposed = name + "_total" if family.type == "counter" else name  # text format 0.0.4
        assert f"# HELP {exposed} " in text and family.documentation, f"{name}: no HELP"
        assert f"# TYPE {exposed} {family.type}\n" in text, f"{name}: no TYPE"
        if name.endswith("_created") and name.removesuffix("_created") in families:
            assert family.type == "gauge", name  # a counter's or histogram's start time
            continue
        assert family.type in ("counter", "gauge", "histogram", "info"), \
            f"{name}: type {family.type} (quantile gauges or summaries are not wanted)"
        assert not re.search(r"(^|_)(ms|msec|millis|milliseconds)(_|$)", name), name
        assert not re.search(r"\bms\b|millisecond", family.documentation), name
        base = name.removesuffix("_total")
        if TIME_HELP.search(family.documentation) or TIME_NAME.search(name):
            assert base.endswith("_seconds"), f"{name}: a time, not in _seconds"
        if SIZE_WORDS.search(family.documentation) or SIZE_WORDS.search(name):
            assert base.endswith("_bytes"), f"{name}: a size, not in _bytes"
        for s in family.samples:
            assert all(SNAKE.match(k) for k in s.labels), (s.name, s.labels)
            assert "quantile" not in s.labels, f"{s.name}: a quantile gauge"
            assert math.isfinite(s.value), s
        if family.type == "counter":
            for s in family.samples:
                assert s.name in (name + "_total", name + "_created"), \
                    f"counter sample {s.name} does not end in _total"
        elif family.type == "gauge":
            assert not name.endswith("_total"), f"gauge {name} ends in _total"


def test_histograms_have_buckets_sum_and_count(scraped):
    _, families = scraped
    histograms = [f for f in families.values() if f.type == "histogram"]
    assert {"edgeagent_request_duration_seconds",
            "edgeagent_model_load_duration_seconds"} <= {f.name for f in histograms}
    for family in histograms:
        series: dict = defaultdict(lambda: defaultdict(list))
        for s in family.samples:
            suffix = s.name.removeprefix(family.name)
            if suffix != "_created":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series[key][suffix].append(s)
        assert series, f"{family.name}: no series after traffic"
        for key, parts in series.items():
            assert set(parts) == {"_bucket", "_sum", "_count"}, (family.name, key)
            buckets = parts["_bucket"]
            assert buckets[-1].labels["le"] == "+Inf", (family.name, key)
            counts = [b.value for b in buckets]
            assert counts == sorted(counts), f"{family.name}{key}: buckets not cumulative"
            assert counts[-1] == parts["_count"][0].value, (family.name, key)


def test_endpoint_label_and_the_traffic_it_counts(scraped):
    _, families = scraped
    requests = samples(families, "edgeagent_requests_total")
    assert requests and {s.labels["endpoint"] for s in requests} <= set(ENDPOINTS)
    for family in families.values():  # never a backend name where the endpoint is meant
        for s in family.samples:
            if "endpoint" in s.labels:
                assert s.labels["endpoint"] in ENDPOINTS, s
    by = {(s.labels["model"], s.labels["version"], s.labels["device"],
           s.labels["endpoint"], s.labels["code"]): s.value for s in requests}
    assert by[("mlp", "1", "cpu", "tfserving-rest", "200")] == 1  # :predict on ONNX
    assert by[("mlp", "1", "cpu", "v2", "200")] == 1
    assert by[("mlp", "1", "cpu", "v2", "400")] == 1
    assert by[("<unknown>", "", "", "v2", "404")] == 1
    assert by[("mlp", "", "", "tfserving-rest", "404")] == 1  # no version 7
    latency = {(s.labels["model"], s.labels["endpoint"]): s.value
               for s in samples(families, "edgeagent_request_duration_seconds_count")}
    assert by[("app", "", "", "v2", "200")] == 1  # an app: no version or device of its own
    assert latency == {("mlp", "v2"): 1, ("mlp", "tfserving-rest"): 1,  # successes only
                       ("app", "v2"): 1}


def test_cache_figures_in_base_units(scraped):
    _, families = scraped

    def value(name, **labels):
        found = [s.value for s in samples(families, name)
                 if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    other = dict(model="other", version="1", device="cpu")
    assert value("edgeagent_cache_loads_total", **other) == 1
    assert value("edgeagent_cache_evictions_total", **other) == 1
    assert value("edgeagent_model_loaded", **other) == 0
    assert value("edgeagent_model_loaded", model="mlp") == 1
    assert value("edgeagent_model_load_duration_seconds_count", **other) == 1
    assert 0 < value("edgeagent_model_load_duration_seconds_sum", **other) < 60
    assert 0 < value("edgeagent_model_size_bytes", model="mlp") < 50_000_000
    assert value("edgeagent_memory_budget_bytes", device="cpu") == 200_000_000
    assert value("edgeagent_memory_used_bytes", device="cpu") == \
        value("edgeagent_model_size_bytes", model="mlp")
    slo = [s for s in samples(families, "edgeagent_slo_latency_seconds")
           if s.labels["model"] == "mlp"]
    assert slo and all(0 < s.value < 3600 for s in slo)  # seconds, not ms
    assert value("edgeagent_room_queue_length", device="cpu") == 0
    assert value("process_resident_memory_bytes") > 10_000_000


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="no promtool on PATH (Debian: apt-get install prometheus)")
def test_promtool_finds_no_problem(scraped):
    """Prometheus' own linter agrees with the rules above, where it is installed."""
    text, _ = scraped
    done = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip() == ""


def dashboard_metric_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs, "no expressions in the dashboard"
    names = set()
    for expr in exprs:
        names |= set(re.findall(r"\b(?:edgeagent|process|python)_[a-z0-9_]+", expr))
    return names


def test_dashboard_is_grafana_json():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["title"] and doc["uid"] and doc["schemaVersion"] >= 30
    titles = " ".join(p["title"].lower() for p in doc["panels"])
    for words in ("request rate", "p99", "memory", "loads", "room queue"):
        assert words in titles, words
    exprs = " ".join(t["expr"] for p in doc["panels"] for t in p.get("targets", []))
    assert "histogram_quantile(0.99" in exprs and "_bucket" in exprs
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="no promtool on PATH (Debian: apt-get install prometheus)")
def test_dashboard_expressions_parse_as_promql(tmp_path):
    """promtool parses every expression (as recording rules), Grafana's variables
    replaced by what Grafana would put there."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    grafana = {"$__rate_interval": "1m", "$__range": "1h", "$instance": ".*"}
    rules = []
    for i, expr in enumerate(exprs):
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:expr{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def test_every_metric_the_dashboard_names_exists(scraped):
    _, families = scraped
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    exposed = {f.name + suffix for f in families.values()  # declared, maybe no series yet
               for suffix in suffixes.get(f.type, [""])}
    missing = sorted(dashboard_metric_names() - exposed)
    assert not missing, f"the dashboard names metrics /metrics lacks: {missing}"
