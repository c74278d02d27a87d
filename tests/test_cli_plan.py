"""``edgeagent plan latency`` and ``edgeagent plan allocate`` contracts."""

import json

import pytest
from click.testing import CliRunner

from agent.cli import main


def run(*args):
    return CliRunner().invoke(main, ["plan", *args])


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


PAPER = {"capacity": {"cpu": 32, "memory_bytes": 68719476736},
         "models": [{"name": "a", "rate": 40.0, "proc_ms": 150, "slo_ms": 600,
                     "percentile": 99.99, "priority": 1, "cpu_per_replica": 1,
                     "memory_per_replica_bytes": 1000000000}]}


def test_latency_json_and_text():
    r = run("latency", "--proc-ms", "150", "--rate", "40", "--replicas", "8",
            "--percentile", "99.99", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["latency_ms"] == pytest.approx(456.76, abs=0.01)
    r = run("latency", "--proc-ms", "150", "--rate", "40", "--replicas", "10",
            "--percentile", "99.99", "--estimator", "upper", "--json")
    assert json.loads(r.output) == {"latency_ms": pytest.approx(600.0)}
    unstable = run("latency", "--proc-ms", "150", "--rate", "80", "--replicas", "8",
                   "--percentile", "99", "--json")
    assert 0 < json.loads(unstable.output)["latency_ms"] < float("inf")
    text = run("latency", "--proc-ms", "150", "--rate", "40", "--replicas", "8",
               "--percentile", "99.99")
    assert "456.760 ms" in text.output


@pytest.mark.parametrize("estimator, expected", [("mdc", 8), ("upper", 10)])
def test_allocate_paper_example(tmp_path, estimator, expected):
    path = write(tmp_path, PAPER)
    r = run("allocate", "--problem", path, "--estimator", estimator, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["replicas"] == {"a": expected}
    assert out["utility"] == {"a": 1.0}
    assert set(out) >= {"replicas", "latency_ms", "utility", "objective", "solver",
                        "solve_seconds"}
    assert out["latency_ms"]["a"] <= 600


def test_allocate_rate_samples_and_table(tmp_path):
    data = json.loads(json.dumps(PAPER))
    data["models"].append({"name": "b", "rate_samples": [5, 10, 30, 35], "proc_ms": 180,
                           "slo_ms": 720})
    path = write(tmp_path, data)
    for objective in ("sum", "fair", "fairsum", "penaltysum", "penaltyfairsum"):
        r = run("allocate", "--problem", path, "--objective", objective, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["replicas"]["a"] == 8
    table = run("allocate", "--problem", path)
    assert table.exit_code == 0 and "replicas" in table.output and "objective" in table.output


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ({"capacity": {"cpu": 4}, "models": [{"name": "a", "proc_ms": 1, "slo_ms": 2}]}, "rate"),
    ({"capacity": {"cpu": 4}, "models": [{"name": "a", "rate": -1, "proc_ms": 1,
                                          "slo_ms": 2}]}, "rate must be >= 0"),
    ({"capacity": {"cpu": 1}, "models": [{"name": "a", "rate": 1, "proc_ms": 1, "slo_ms": 2},
                                         {"name": "b", "rate": 1, "proc_ms": 1, "slo_ms": 2}]},
     "too small"),
    ({"models": []}, "capacity"),
    ([1, 2], "JSON object"),
])
def test_allocate_bad_input(tmp_path, content, message):
    r = run("allocate", "--problem", write(tmp_path, content), "--json")
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output
    assert isinstance(r.exception, SystemExit)


def test_latency_bad_input():
    r = run("latency", "--proc-ms", "150", "--rate", "-4", "--replicas", "8",
            "--percentile", "99")
    assert r.exit_code != 0 and "rate must be >= 0" in r.output
