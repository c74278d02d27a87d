"""``edgeagent simulate``: output formats, sweeps, plots and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from agent.cli import main

TABLE_I = [0, 1, 2, 1, 0, 2, 1, 0, 2, 0, 2, 1, 0, 2]
PROFILES = ("model,size_bytes,load_seconds,exec_seconds\n"
            "m0,1,1,0.1\nm1,1,2,0.1\nm2,1,3,0.1\n")


@pytest.fixture
def files(tmp_path):
    """Paper Table I as files: three unit-size models, model i costs i + 1 to load."""
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model\n" + "".join(f"{t},m{m}\n" for t, m in enumerate(TABLE_I)))
    profiles = tmp_path / "profiles.csv"
    profiles.write_text(PROFILES)
    return trace, profiles


def run(*args):
    return CliRunner().invoke(main, ["simulate", *map(str, args)])


def test_json_reproduces_paper_table_one(files):
    trace, profiles = files
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "2",
                 "--policy", "beladymin", "--policy", "cremebrulee-oracle", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    got = {r["policy"]: (r["misses"], r["load_delay_seconds"]) for r in rows}
    assert got == {"beladymin": (8, 17.0), "cremebrulee-oracle": (8, 13.0)}
    for row in rows:
        assert {"policy", "capacity_bytes", "requests", "hits", "misses",
                "load_delay_seconds"} <= set(row)
        assert row["capacity_bytes"] == 2 and row["requests"] == 14


def test_sweep_of_capacities_and_policy_specs(files):
    trace, profiles = files
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "1,2",
                 "--capacity", "3B", "--policy", "lru", "--policy",
                 "cremebrulee:rate=cumulative", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["policy"], r["capacity_bytes"]) for r in rows] == [
        ("lru", 1), ("lru", 2), ("lru", 3),
        ("cremebrulee:rate=cumulative", 1), ("cremebrulee:rate=cumulative", 2),
        ("cremebrulee:rate=cumulative", 3)]
    assert rows[2]["misses"] == 3  # all three fit: cold misses only


def test_capacity_units(tmp_path):
    profiles = tmp_path / "p.csv"
    profiles.write_text("model,size_bytes,load_seconds,exec_seconds\na,1000000000,1,1\n")
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,model\n0,a\n")
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "1GB,1GiB",
                 "--policy", "lru", "--json")
    assert result.exit_code == 0, result.output
    assert [r["capacity_bytes"] for r in json.loads(result.stdout)] == [10**9, 2**30]


def test_table_output_is_aligned(files):
    trace, profiles = files
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "2,3",
                 "--policy", "lru", "--policy", "gdsf")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:5] == ["policy", "capacity", "requests", "hits", "misses"]
    assert len(lines) == 5
    assert lines[1].split()[:5] == ["lru", "2B", "14", "3", "11"]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns


def test_queueing_adds_response_times(files):
    trace, profiles = files
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "3",
                 "--policy", "lru", "--queueing", "--workers", "2", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["workers"] == 2
    assert row["mean_response_seconds"] >= 0.1 and row["p99_response_seconds"] >= 0.1
    table = run("--trace", trace, "--profiles", profiles, "--capacity", "3",
                "--policy", "lru", "--queueing")
    assert "p99_resp_s" in table.stdout


def test_plot_file_is_written(files, tmp_path):
    trace, profiles = files
    out = tmp_path / "fig.png"
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "1,2,3",
                 "--policy", "lru", "--policy", "cremebrulee", "--plot", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_needs_no_files():
    result = run("--demo", "--policy", "lru", "--capacity", "8GB", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["requests"] > 100 and row["capacity_bytes"] == 8 * 10**9


@pytest.mark.parametrize("args, message", [
    (["--capacity", "2", "--policy", "nope"], "unknown policy 'nope'"),
    (["--capacity", "2", "--policy", "lru:speed=1"], "has no parameter 'speed'"),
    (["--capacity", "2", "--policy", "cremebrulee:half_life=x"], "not a valid float"),
    (["--capacity", "12XB", "--policy", "lru"], "bad size '12XB'"),
    (["--capacity", "2,,3", "--policy", "lru"], "empty item"),
    (["--capacity", "0", "--policy", "lru"], "more than the whole capacity of 0 bytes"),
    (["--policy", "lru"], "missing --capacity"),
    (["--capacity", "2"], "missing --policy"),
    (["--capacity", "2", "--policy", "lru", "--workers", "0"], "--workers"),
])
def test_bad_options_are_named_without_traceback(files, args, message):
    trace, profiles = files
    result = run("--trace", trace, "--profiles", profiles, *args)
    assert result.exit_code != 0
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize("trace_text, profiles_text, message", [
    ("", PROFILES, "the file is empty"),
    ("timestamp,model\n0,m0\n1,m9\n", PROFILES, "line 3, column 'model': model 'm9' is not in"),
    ("timestamp,model\n2,m0\n1,m1\n", PROFILES, "line 3, column 'timestamp': 1.0 is earlier"),
    ("timestamp,model\nnow,m0\n", PROFILES, "'now' is not a number"),
    ("stamp,model\n0,m0\n", PROFILES, "missing column(s) 'timestamp'"),
    ("timestamp,model\n0,m0\n", "model,size_bytes,load_seconds,exec_seconds\nm0,1,-1,0\n",
     "line 2, column 'load_seconds': -1.0 is negative"),
    ("timestamp,model\n0,m0\n", "model,size_bytes,load_seconds,exec_seconds\nm0,-1,1,0\n",
     "line 2, column 'size_bytes': -1.0 is negative"),
    ("timestamp,model\n0,m0\n", PROFILES + "m0,1,1,1\n", "model 'm0' is listed twice"),
    ("timestamp,model\n0,m0\n", "model,size_bytes,load_seconds\nm0,1,1\n",
     "missing column(s) 'exec_seconds'"),
    ("timestamp,model\n0,m0\n", "model,size_bytes,load_seconds,exec_seconds\nm0,5,1,0\n",
     "model 'm0' needs 5 bytes, more than the whole capacity of 2 bytes"),
])
def test_bad_files_are_named_without_traceback(tmp_path, trace_text, profiles_text, message):
    trace, profiles = tmp_path / "t.csv", tmp_path / "p.csv"
    trace.write_text(trace_text)
    profiles.write_text(profiles_text)
    result = run("--trace", trace, "--profiles", profiles, "--capacity", "2", "--policy", "lru")
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_missing_file_is_a_usage_error(files, tmp_path):
    _, profiles = files
    result = run("--trace", tmp_path / "nope.csv", "--profiles", profiles, "--capacity", "2",
                 "--policy", "lru")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_real_process_exit_status_and_stderr(files):
    trace, profiles = files
    command = [sys.executable, "-c", "from agent.cli import main; main()", "simulate",
               "--trace", str(trace), "--profiles", str(profiles), "--capacity", "2",
               "--policy", "lru", "--policy", "bogus"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "unknown policy 'bogus'" in done.stderr and "Traceback" not in done.stderr
    ok = subprocess.run(command[:-2] + ["--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["misses"] == 11
