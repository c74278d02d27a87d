"""``edgeagent workload ...``: happy paths and bad input (clear message, non-zero exit)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from cachepolicies.traces import read_profiles, read_trace

AZURE_CSV = """\
HashOwner,HashApp,HashFunction,Trigger,1,2,3
o,a,f1,http,1,2,0
o,a,f2,http,0,3,1
o,a,f3,timer,1,1,1
o,b,f4,http,2,0,2
o,b,f5,http,0,1,0
"""


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture()
def azure_csv(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_CSV)
    return path


def test_synthetic_then_trace_then_read_back(tmp_path):
    azure = tmp_path / "azure.csv"
    result = _run("workload", "synthetic", "--functions", "500", "--minutes", "120",
                  "--seed", "3", "--out", str(azure))
    assert result.exit_code == 0, result.output
    assert azure.read_text().startswith("HashOwner,HashApp,HashFunction,Trigger,1,2,")
    trace, profiles = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    result = _run("workload", "trace", "--invocations", str(azure), "--association",
                  "quantiles-r", "--start-minute", "30", "--minutes", "60", "--downsample",
                  "0.5", "--seed", "1", "--out-trace", str(trace), "--out-profiles",
                  str(profiles))
    assert result.exit_code == 0, result.output
    assert "requests:" in result.output and "if all loaded" in result.output
    loaded = read_profiles(profiles)
    requests = read_trace(trace, loaded)
    assert len(requests) > 0 and np.all(np.diff(requests.timestamps) >= 0)
    assert requests.timestamps.max() < 3600


def test_trace_with_real_names_and_shipped_profiles(azure_csv, tmp_path):
    trace = tmp_path / "trace.csv"
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--names", "real",
                  "--quantile", "1", "--keep-one-hit", "--out-trace", str(trace))
    assert result.exit_code == 0, result.output
    rows = trace.read_text().splitlines()
    assert rows[0] == "timestamp,model"
    assert len(rows) - 1 == 1 + 2 + 3 + 1 + 2 + 2 + 1  # HTTP invocations only
    names = {row.split(",")[1] for row in rows[1:]}
    from cachepolicies.traces import cremebrulee_profiles_path

    assert names <= set(read_profiles(cremebrulee_profiles_path()).names)


def test_generate_in_one_step(tmp_path):
    trace, profiles = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    result = _run("workload", "generate", "--functions", "2000", "--minutes", "30",
                  "--association", "quantiles", "--out-trace", str(trace),
                  "--out-profiles", str(profiles))
    assert result.exit_code == 0, result.output
    assert len(read_trace(trace, read_profiles(profiles))) > 100


def test_generate_with_timers(tmp_path):
    trace, profiles = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    result = _run("workload", "generate", "--functions", "2000", "--timer-share", "0.5",
                  "--timer-periods", "20,40", "--timer-jitter", "0",
                  "--out-trace", str(trace), "--out-profiles", str(profiles))
    assert result.exit_code == 0, result.output
    kept = int(result.output.split(" kept")[0].rsplit(" ", 1)[1])
    assert f"; {round(kept / 2)} of them timers" in result.output
    read = read_trace(trace, read_profiles(profiles))
    counts = np.bincount(read.model_ids)
    assert np.sum(counts >= 3600 / 40 - 1) >= round(kept / 2)  # every timer fires 90-180 times
    for args, message in ((["--timer-share", "2"], "--timer-share"),
                          (["--timer-periods", "30"], "--timer-periods"),
                          (["--timer-periods", "60,30"], "--timer-periods"),
                          (["--timer-jitter", "0.5"], "--timer-jitter")):
        bad = _run("workload", "generate", "--functions", "100", *args, "--out-trace",
                   str(trace), "--out-profiles", str(profiles))
        assert bad.exit_code == 2 and message in bad.output, args


def test_simulate_reads_the_files(tmp_path):
    trace, profiles = tmp_path / "trace.csv", tmp_path / "profiles.csv"
    assert _run("workload", "generate", "--functions", "1000", "--out-trace", str(trace),
                "--out-profiles", str(profiles)).exit_code == 0
    result = _run("simulate", "--trace", str(trace), "--profiles", str(profiles),
                  "--capacity", "16GB", "--policy", "lru", "--json")
    assert result.exit_code == 0, result.output
    start = result.output.index("[")
    (run,) = json.loads(result.output[start:])
    assert run["requests"] == len(trace.read_text().splitlines()) - 1


@pytest.mark.parametrize("text, message", [
    ("HashOwner,HashApp,HashFunction,1,2\no,a,f,1,2\n", "missing column 'Trigger'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1,2\no,a,g,http,one,2\n",
     "line 3, column '1': count 'one' is not a non-negative integer"),
])
def test_bad_invocations_file(tmp_path, text, message):
    path = tmp_path / "azure.csv"
    path.write_text(text)
    result = _run("workload", "trace", "--invocations", str(path), "--out-trace",
                  str(tmp_path / "t.csv"), "--out-profiles", str(tmp_path / "p.csv"))
    assert result.exit_code == 1
    assert message in result.output and str(path) in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert not (tmp_path / "t.csv").exists()


def test_unknown_association(azure_csv, tmp_path):
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--association",
                  "zipf", "--out-trace", str(tmp_path / "t.csv"))
    assert result.exit_code == 2
    assert "Invalid value for '--association'" in result.output and "'zipf'" in result.output


def test_distinct_names_need_a_profiles_file(azure_csv, tmp_path):
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--out-trace",
                  str(tmp_path / "t.csv"))
    assert result.exit_code == 2 and "--out-profiles" in result.output


def test_nothing_left_is_an_error(azure_csv, tmp_path):
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--minutes", "1",
                  "--names", "real", "--out-trace", str(tmp_path / "t.csv"))
    assert result.exit_code == 1 and "no requests left" in result.output


def test_bad_window_and_missing_files(azure_csv, tmp_path):
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--start-minute",
                  "2", "--minutes", "5", "--names", "real", "--out-trace",
                  str(tmp_path / "t.csv"))
    assert result.exit_code == 1 and "does not fit the file's 3 minutes" in result.output
    result = _run("workload", "trace", "--invocations", str(tmp_path / "none.csv"),
                  "--names", "real", "--out-trace", str(tmp_path / "t.csv"))
    assert result.exit_code == 2 and "does not exist" in result.output
    bad_profiles = tmp_path / "profiles.csv"
    bad_profiles.write_text("model,size_bytes\nx,1\n")
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--profiles",
                  str(bad_profiles), "--names", "real", "--out-trace",
                  str(tmp_path / "t.csv"))
    assert result.exit_code == 1 and "missing column" in result.output
    result = _run("workload", "trace", "--invocations", str(azure_csv), "--names", "real",
                  "--out-trace", str(tmp_path / "no" / "dir" / "t.csv"))
    assert result.exit_code == 1 and "No such file or directory" in result.output
