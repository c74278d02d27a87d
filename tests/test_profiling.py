"""``agent.profiling`` and ``edgeagent profile measure`` on real (locally written) ONNX models."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.modelzoo import mlp_param_bytes, write_mlp
from agent.profiling import (
    ProfilingError,
    find_onnx_models,
    measure_model,
    measure_models,
    synthetic_inputs,
    to_profiles,
)
from cachepolicies.traces import read_profiles
from cachepolicies.workloads import write_profiles

MLP = dict(inputs=32, hidden=256, layers=2, outputs=4, seed=1)


@pytest.fixture()
def repository(tmp_path):
    root = tmp_path / "repo"
    write_mlp(root / "small" / "1" / "model.onnx", **MLP)
    write_mlp(root / "small" / "3" / "model.onnx", **MLP)
    write_mlp(root / "big" / "1" / "model.onnx", **{**MLP, "hidden": 512})
    (root / "empty").mkdir()
    return root


def test_measures_a_real_model(tmp_path):
    path = write_mlp(tmp_path / "mlp.onnx", **MLP)
    measured = measure_model(path, runs=5)
    assert measured.model == "mlp" and measured.file_bytes == path.stat().st_size
    weights = mlp_param_bytes(**{k: v for k, v in MLP.items() if k != "seed"})
    assert measured.size_bytes >= weights > 0
    assert measured.load_seconds > 0 and measured.first_exec_seconds > 0
    assert 0 < measured.exec_seconds < 1


def test_finds_models_in_a_repository(repository):
    found = dict(find_onnx_models([repository]))
    assert found == {"big": repository / "big" / "1" / "model.onnx",
                     "small": repository / "small" / "3" / "model.onnx"}
    assert find_onnx_models([repository / "small"]) == [
        ("small", repository / "small" / "3" / "model.onnx")]
    assert find_onnx_models([repository / "big" / "1" / "model.onnx"])[0][0] == "big"


def test_bad_paths_are_named(tmp_path, repository):
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    with pytest.raises(ProfilingError, match="notes.txt: not an .onnx file"):
        find_onnx_models([text])
    with pytest.raises(ProfilingError, match="no ONNX model found"):
        find_onnx_models([repository / "empty"])
    with pytest.raises(ProfilingError, match="given twice: small"):
        find_onnx_models([repository / "small", repository / "small" / "1" / "model.onnx"])
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ProfilingError, match="ONNX Runtime cannot load it"):
        measure_model(broken)


def test_synthetic_inputs_follow_the_metadata(tmp_path):
    import onnxruntime as ort

    session = ort.InferenceSession(str(write_mlp(tmp_path / "m.onnx", **MLP)),
                                   providers=["CPUExecutionProvider"])
    feeds = synthetic_inputs(session)
    assert feeds["X"].shape == (1, 32) and feeds["X"].dtype == np.float32


def test_profiles_csv_is_valid(tmp_path, repository):
    measured = measure_models([repository], runs=3)
    out = tmp_path / "profiles.csv"
    write_profiles(out, to_profiles(measured))
    assert out.read_text().splitlines()[0] == \
        "model,size_bytes,load_seconds,exec_seconds,first_exec_seconds"
    profiles = read_profiles(out)
    assert profiles.names == ["big", "small"]
    assert np.all(profiles.size_bytes > 0) and np.all(profiles.exec_seconds > 0)
    assert np.all(profiles.load_seconds > 0) and np.all(profiles.first_exec_seconds > 0)
    assert profiles.size_bytes[0] > profiles.size_bytes[1]


def test_profile_measure_command(tmp_path, repository):
    out = tmp_path / "profiles.csv"
    result = CliRunner().invoke(main, ["profile", "measure", str(repository), "--runs", "2",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "load ms" in result.output
    assert read_profiles(out).names == ["big", "small"]
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    result = CliRunner().invoke(main, ["profile", "measure", str(text)])
    assert result.exit_code == 1 and "not an .onnx file" in result.output
    assert "Traceback" not in result.output
